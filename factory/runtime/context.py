"""What a stage's runner works with, and the names of the files artifacts hold (read by the stages downstream).

Light on purpose: the stage process imports this before it knows which runner it needs, and a
data stage never imports torch.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.config.kinds import BLEND, TOKENIZER, provider, stage_kind
from factory.config.section import Section
from factory.registry.layout import BLEND_FILE
from factory.train.distributed import World, world_from_env
from factory.train.records import SAVED, CheckpointEvent

if TYPE_CHECKING:
    from factory.data.blend import Blend
    from factory.data.loader import BlendStream
    from factory.registry.seam import Registry
    from factory.registry.store import Manifest
    from factory.runtime.report import Reporter  # Dagster Pipes: the stage kinds import this module, `factory check` too
    from factory.runtime.request import StageRequest

# The summary key of what a stage warns about (what to change): logged as a warning and shown on the materialization,
# also when the artifact comes from the cache.
WARNINGS = "warnings"


@dataclass(frozen=True, kw_only=True, slots=True)
class StageContext:
    """What a runner works with."""

    request: StageRequest
    registry: Registry
    out: Path
    reporter: Reporter
    _manifests: dict[str, Manifest] = field(default_factory=dict, repr=False, compare=False)
    """The upstream manifests found so far, by upstream name: an object store's index is asked once per upstream."""

    @property
    def log(self) -> logging.Logger:
        return self.reporter.log

    @property
    def world(self) -> World:
        """This process's place among the stage's ranks, on the GPUs its placement gives it (`factory.devices`)."""
        return world_from_env(gpus=self.request.gpus)

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.request.spec.config)

    @property
    def settings(self) -> Any:
        """This stage's settings, parsed once with its kind's type (`StageKind.settings`): what its runner reads."""
        return _parsed(self.request.spec.kind, self.request.spec.config)

    @property
    def section(self) -> Section | None:
        """This stage's own section of the experiment (`StageKind.section`), typed; None for a kind without one."""
        kind = stage_kind(self.request.spec.kind)
        if not kind.section:
            return None
        if kind.settings is not None:
            return getattr(self.settings, kind.section, None)
        raw = self.request.spec.config.get(kind.section)  # a kind fingerprinted on its section alone (the default)
        return kind.config.model_validate(raw) if kind.config is not None and raw is not None else None

    def checkpoint(self, event: CheckpointEvent) -> None:
        """Hear of a checkpoint saved or deleted (rank 0): report it, and after a save keep the work directory where a
        relaunch on any machine resumes from it (`save_work`: the store, for a registry in an object store)."""
        self.reporter.checkpoint(event)
        if event.event == SAVED:
            self.registry.save_work(self.request.spec.fingerprint)

    def upstream(self, name: str) -> Path:
        """Directory of the upstream artifact this stage was planned with (from an object store, a copy of all of it:
        `upstream_file` fetches one file)."""
        return self.registry.open(self.request.spec.upstream[name])

    def upstream_file(self, name: str, file: str) -> Path:
        """Where one file (or directory) of the upstream artifact this stage was planned with is on local disk: from an
        object store, that part alone (a training's final checkpoint, not every kept one); where it would be when the
        artifact has no such file."""
        return self.registry.fetch(self.upstream_manifest(name), file)

    def upstream_manifest(self, name: str) -> Manifest:
        """The manifest of the upstream artifact this stage was planned with (found once, then kept)."""
        from factory.registry.store import manifest_of

        if name not in self._manifests:
            self._manifests[name] = manifest_of(self.registry, self.request.spec.upstream[name])
        return self._manifests[name]

    def upstream_tokenizer(self) -> Path:
        """The upstream tokenizer's file on local disk, with the files read beside it (its config, an imported tokenizer's
        token ids: `fetched_tokenizer`) when it has them."""
        from factory.models.tokenizer import fetched_tokenizer

        return fetched_tokenizer(self.registry, self.upstream_manifest(provider(TOKENIZER).name))

    def blend(self) -> Blend:
        """The upstream blend this stage reads."""
        from factory.data.blend import Blend

        return Blend.from_json(json.loads(self.upstream_file(provider(BLEND).name, BLEND_FILE).read_text()))

    def blend_stream(self, split: str, finite: bool = False) -> BlendStream:
        """Documents of one split of the upstream blend, in the seeded order training sees them."""
        from factory.data.catalog import open_catalog
        from factory.data.loader import BlendStream

        catalog = open_catalog(self.request.catalog)
        settings = self.settings  # a training stage's stream settings, or the tokenizer's own
        buffer = settings.stream.shuffle_buffer_docs if hasattr(settings, "stream") else settings.shuffle_buffer_docs
        return BlendStream(catalog=catalog, blend=self.blend(), split=split, seed=settings.seed, buffer_docs=buffer, finite=finite)


@functools.cache
def _parsed_json(kind: str, config: str) -> Any:
    return stage_kind(kind).read_settings(json.loads(config))


def _parsed(kind: str, config: Mapping[str, Any]) -> Any:
    """The settings of a stage, parsed once per process."""
    return _parsed_json(kind, json.dumps(dict(config), sort_keys=True))
