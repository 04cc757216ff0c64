"""The `blend` kind: the training mixture, table versions with weights and modes, and the held-out share.

It reads this experiment's filtered datasets (`factory.stages.datasets`) and any pinned table version, and writes
`blend.json`, which the tokenizer and the training stages stream from. Light to import: its run function imports
the data code (pyiceberg) when it runs.
"""

from __future__ import annotations

import json
from typing import Any

from factory.config.kinds import BLEND as BLEND_ROLE
from factory.config.kinds import StageKind
from factory.config.data_sections import BlendComponent, DataConfig, DatasetConfig
from factory.config.schema import Experiment
from factory.config.section import Section
from factory.registry.layout import BLEND_FILE
from factory.runtime.context import StageContext


class BlendSettings(Section):
    """The blend stage: the mixture and the held-out share."""

    blend: tuple[BlendComponent, ...]
    validation_percent: int


def _settings(experiment: Experiment) -> BlendSettings:
    return BlendSettings(blend=experiment.data.blend, validation_percent=experiment.data.validation_percent)


def run(ctx: StageContext) -> dict[str, Any]:
    """The mixture: this experiment's filtered datasets and pinned table versions, with weights and modes."""
    from factory.data.blend import build_blend
    from factory.data.catalog import open_catalog
    from factory.stages.versions import load_versions

    data = _blend_config(ctx)
    versions = load_versions(ctx, "filtered_datasets") if "filtered_datasets" in ctx.request.spec.upstream else {}
    blend = build_blend(open_catalog(ctx.request.catalog), data, versions)
    (ctx.out / BLEND_FILE).write_text(json.dumps(blend.to_json(), indent=2, sort_keys=True))
    ctx.log.info("blend of %s", ", ".join(f"{p.label} ({p.table}@{p.version}) x{w:.3f}" for p, w in zip(blend.parts, blend.weights, strict=True)))
    summary: dict[str, Any] = {"parts": len(blend.parts), "validation_percent": blend.validation_percent}
    for part, weight in zip(blend.parts, blend.weights, strict=True):
        summary[f"{part.label}/version"] = f"{part.table}@{part.version}"
        summary[f"{part.label}/share"] = round(weight, 6)
        summary[f"{part.label}/mode"] = part.mode
        summary[f"{part.label}/rows"] = part.rows
    return summary


def _blend_config(ctx: StageContext) -> DataConfig:
    """The data section as far as the blend needs it: dataset parts are checked against the upstream versions instead."""
    settings = ctx.settings
    names = {part.dataset for part in settings.blend if part.dataset}
    return DataConfig(blend=settings.blend, validation_percent=settings.validation_percent,
                      datasets={name: DatasetConfig() for name in sorted(names)})


BLEND = StageKind(
    name="blend", run="factory.stages.blend:run", reads=("filtered_datasets",), present=lambda e: e.base is None, provides=BLEND_ROLE,
    group="data", artifact=frozenset({"iceberg"}), settings=BlendSettings, fingerprint=_settings,
    imports=("factory.data.blend", "factory.data.catalog", "factory.stages.versions"),
    description="The training mixture: table versions with weights and modes (finite or oversample).",
)
