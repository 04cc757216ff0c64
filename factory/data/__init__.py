"""Datasets: Iceberg tables and versions, ingest, dedup, filters, blends and the streaming loader."""
