"""What a stage's runner works with, and the names of the files artifacts hold (read by the stages downstream).

Light on purpose: the stage process imports this before it knows which runner it needs, and a
data stage never imports torch.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.config.kinds import stage_kind
from factory.config.section import Section
from factory.registry.store import ArtifactStore
from factory.stages.report import Reporter
from factory.stages.request import StageRequest

if TYPE_CHECKING:
    from factory.data.blend import Blend
    from factory.data.loader import BlendStream

DATASETS_FILE = "datasets.json"
BLEND_FILE = "blend.json"
TOKENIZER_FILE = "tokenizer.json"
# The summary key of what a stage warns about (what to change): logged as a warning and shown on the materialization,
# also when the artifact comes from the cache.
WARNINGS = "warnings"


@dataclass(frozen=True, kw_only=True, slots=True)
class StageContext:
    """What a runner works with."""

    request: StageRequest
    registry: ArtifactStore
    out: Path
    reporter: Reporter

    @property
    def log(self) -> logging.Logger:
        return self.reporter.log

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.request.spec.config)

    @property
    def section(self) -> Section | None:
        """This stage's own section of the experiment, parsed with its kind's type (None for a kind without one)."""
        kind = stage_kind(self.request.spec.kind)
        if kind.config is None or kind.section not in self.request.spec.config:
            return None
        return kind.config.model_validate(self.request.spec.config[kind.section])

    def upstream(self, name: str) -> Path:
        """Directory of the upstream artifact this stage was planned with."""
        return self.registry.open(self.request.spec.upstream[name])

    def blend(self) -> Blend:
        """The upstream blend this stage reads."""
        from factory.data.blend import Blend

        return Blend.from_json(json.loads((self.upstream("blend") / BLEND_FILE).read_text()))

    def blend_stream(self, split: str, finite: bool = False) -> BlendStream:
        """Documents of one split of the upstream blend, in the seeded order training sees them."""
        from factory.data.catalog import open_catalog
        from factory.data.loader import BlendStream

        catalog = open_catalog(self.request.catalog)
        buffer = self.config.get("stream", self.config)["shuffle_buffer_docs"]
        return BlendStream(catalog=catalog, blend=self.blend(), split=split, seed=self.config["seed"], buffer_docs=buffer, finite=finite)
