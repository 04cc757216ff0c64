"""The blocking checks on a `filtered_datasets` artifact: every check over every dataset it wrote.

The stage runs them on the versions it has just written and keeps the outcomes in the artifact
(`checks.json`): a table version never changes, so neither do its outcomes, and the orchestrator
reports them (a failure blocks the blend and training) without opening the catalog, also when
the artifact comes from the cache.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.checks import CHECKS, CheckOutcome, check_version
from factory.stages.context import DATASETS_FILE

CHECKS_FILE = "checks.json"


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


def record_checks(catalog_config: CatalogConfig, artifact: Path, config: dict[str, Any]) -> list[CheckOutcome]:
    """Run the checks on the datasets an artifact being staged wrote, and keep their outcomes in it."""
    outcomes = check_filtered(catalog_config, artifact, config)
    (artifact / CHECKS_FILE).write_text(json.dumps([dataclasses.asdict(outcome) for outcome in outcomes], indent=2, sort_keys=True))
    return outcomes


def recorded_checks(catalog_config: CatalogConfig, artifact: Path, config: dict[str, Any]) -> list[CheckOutcome]:
    """The outcomes a published artifact keeps (run again for one published before artifacts kept them)."""
    path = artifact / CHECKS_FILE
    if not path.exists():
        return check_filtered(catalog_config, artifact, config)
    return [CheckOutcome(**outcome) for outcome in json.loads(path.read_text())]
