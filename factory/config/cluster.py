"""A cluster profile: which launcher runs stages and what each queue can hold, for `factory check --cluster`.

A profile is YAML, kept with the deployment rather than with any experiment:

    launcher: volcano
    queues:
      default: {nodes: 4, gpus_per_node: 8, priorities: [normal, high]}
      cpu: {nodes: 16, gpus_per_node: 0}

With one, `factory check` refuses placements that cannot be scheduled (an unknown queue, more
nodes or GPUs than the queue has, an unknown priority class) and `image: local`, which only the
local launcher can run, before anything is submitted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from factory.config.loader import describe_validation_error, parse_yaml
from factory.config.section import Section
from factory.errors import ConfigError


class QueueSpec(Section):
    """What one scheduler queue can give a stage."""

    nodes: int = Field(ge=1)
    """Most machines one stage may span."""
    gpus_per_node: int = Field(0, ge=0)
    """GPUs on each of those machines."""
    priorities: tuple[str, ...] = ()
    """Priority classes stages may ask for (empty: no priority may be asked for)."""


class ClusterProfile(Section):
    """Where stages run and what they may ask for."""

    launcher: Literal["local", "volcano"] = "local"
    """`local`: processes on this machine; `volcano`: Volcano Jobs on Kubernetes (the image must be pinned)."""
    queues: dict[str, QueueSpec] = Field(min_length=1)
    """Queues by name."""


def load_profile(path: Path) -> ClusterProfile:
    """Read a cluster profile; errors name file:line and the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the cluster profile ({e})") from e
    raw, lines = parse_yaml(path, text, 1)
    try:
        return ClusterProfile.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(path, e, {key: (path, line) for key, line in lines.items()}, ClusterProfile)) from e
