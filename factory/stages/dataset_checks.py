"""The blocking checks on a `filtered_datasets` artifact: every check over every dataset it wrote.

Run by the orchestrator right after the stage (a failure blocks the blend and training), so it
reads the artifact's record of table versions, not the data stages' code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.checks import CHECKS, CheckOutcome, check_version
from factory.stages.context import DATASETS_FILE


def check_filtered(catalog_config: CatalogConfig, artifact: Path, config: dict[str, Any]) -> list[CheckOutcome]:
    """The dataset checks over every filtered dataset of an artifact: one outcome per check, failing if any dataset fails."""
    records = json.loads((artifact / DATASETS_FILE).read_text())
    catalog = open_catalog(catalog_config)
    per_dataset = {
        name: check_version(catalog, record["table"], record["content_tag"], config["datasets"][name]["max_duplicate_share"])
        for name, record in sorted(records.items())
    }
    outcomes = []
    for index, check in enumerate(CHECKS):
        results = {name: found[index] for name, found in per_dataset.items()}
        failed = [r.description for r in results.values() if not r.passed]
        outcomes.append(CheckOutcome(
            name=check, passed=not failed, description="; ".join(failed) or "; ".join(r.description for r in results.values()),
            metadata={f"{name}/{key}": value for name, r in results.items() for key, value in r.metadata.items()},
        ))
    return outcomes
