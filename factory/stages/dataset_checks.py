"""The blocking checks on a `filtered_datasets` artifact: every check over every dataset it wrote.

The stage runs them on each version it has just written, before the version is named: one that
fails is tagged rejected and takes no `v<n>`. It keeps the outcomes in the artifact
(`checks.json`): a table version never changes, so neither do its outcomes, and the orchestrator
reports them (a failure blocks the blend and training) without opening the catalog, also when
the artifact comes from the cache.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.config.kinds import stage_kind
from factory.data.catalog import CatalogConfig, open_catalog
from factory.data.checks import CHECKS, CheckOutcome, check_version
from factory.registry.layout import CHECKS_FILE, DATASETS_FILE

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from factory.registry import Manifest, Registry


def check_dataset(catalog: Catalog, table: str, tag: str, max_duplicate_share: float, columns: tuple[str, ...] = ()) -> list[CheckOutcome]:
    """The checks on one filtered version (keeping the record `columns` of its source); a failure also says which version
    of the table passed last (or that none has)."""
    from factory.data.tables import last_named, resolve  # pyiceberg: the orchestrator imports this module to report outcomes

    outcomes = check_version(catalog, table, tag, max_duplicate_share, columns)
    if all(outcome.passed for outcome in outcomes):
        return outcomes
    passed = last_named(catalog, table, excluding=resolve(catalog, table, tag))
    note = f"the last version that passed is {passed}" if passed else f"no version of {table} has passed yet"
    return [outcome if outcome.passed else dataclasses.replace(outcome, description=f"{outcome.description}; {note}") for outcome in outcomes]


def combine(per_dataset: dict[str, list[CheckOutcome]]) -> list[CheckOutcome]:
    """One outcome per check over every dataset, failing if any dataset fails."""
    outcomes = []
    for index, check in enumerate(CHECKS):
        results = {name: found[index] for name, found in sorted(per_dataset.items())}
        failed = [r.description for r in results.values() if not r.passed]
        outcomes.append(CheckOutcome(
            name=check, passed=not failed, description="; ".join(failed) or "; ".join(r.description for r in results.values()),
            metadata={f"{name}/{key}": value for name, r in results.items() for key, value in r.metadata.items()},
        ))
    return outcomes


def check_filtered(catalog_config: CatalogConfig, records: dict[str, Any], kind: str, config: dict[str, Any]) -> list[CheckOutcome]:
    """The dataset checks over every dataset an artifact of `kind` (one that runs them, `StageKind.dataset_checks`) records
    (its `DATASETS_FILE`): one outcome per check, failing if any dataset fails."""
    settings = stage_kind(kind).read_settings(config)
    catalog = open_catalog(catalog_config)
    return combine({
        name: check_dataset(catalog, record["table"], record["content_tag"], settings.datasets[name].max_duplicate_share,
                            settings.datasets[name].columns)
        for name, record in records.items()
    })


def record_checks(artifact: Path, outcomes: list[CheckOutcome]) -> None:
    """Keep the outcomes of the checks in the artifact being staged, for the orchestrator to report."""
    (artifact / CHECKS_FILE).write_text(json.dumps([dataclasses.asdict(outcome) for outcome in outcomes], indent=2, sort_keys=True))


def recorded_checks(catalog_config: CatalogConfig, registry: Registry, manifest: Manifest, kind: str,
                    config: dict[str, Any]) -> list[CheckOutcome]:
    """The outcomes a published artifact of `kind` keeps (run again for one published before artifacts kept them), read
    from it file by file."""
    kept = registry.read(manifest, CHECKS_FILE)
    if kept is None:
        return check_filtered(catalog_config, json.loads(registry.read(manifest, DATASETS_FILE) or b"{}"), kind, config)
    return [CheckOutcome(**outcome) for outcome in json.loads(kept)]
