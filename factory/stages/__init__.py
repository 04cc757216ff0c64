"""Stage processes: `python -m factory.stages <request.json>` runs one stage and publishes its artifact."""
