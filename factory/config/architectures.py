"""Model architectures: what `model.arch` names, declared once, built in or installed as a plugin.

A `ModelArch` says how to build a model of the experiment's `model` section and how to export its final weights. The
built-in architecture (GPT) is declared in `factory.models.builtin`; an installed package adds architectures through the
entry-point group `model_factory.models` (each entry point names a `ModelArch`). Its functions are `module:function`
strings, imported only by the process that builds or exports a model, so checking and planning an experiment never
imports torch.

A plugin that cannot be loaded, or that declares a name another one declares already, is a `PluginError` naming the
plugin and what to change, raised where the registry is first read.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from factory.config.plugins import entry_points_of, load_declaration, plugin_name, resolve
from factory.errors import ConfigError, PluginError

ENTRY_POINT_GROUP = "model_factory.models"
BUILTIN_MODULE = "factory.models.builtin"
"""Declares the built-in architectures as `BUILTIN_ARCHITECTURES`."""
BUILT_IN = "built in"
DEFAULT_ARCH = "gpt"
"""The architecture of an experiment that names none: the one every experiment had before there were others."""
EXPORT_WEIGHTS = "factory.models.export:export_weights"
SHAPE_FIELDS = frozenset({"arch", "n_layer", "n_head", "n_embd", "context", "dropout", "tie_embeddings"})
"""The fields of the `model` section every architecture reads."""


@dataclass(frozen=True, kw_only=True)
class ModelArch:
    """One model architecture. A plugin declares one in its own module and names it in the `model_factory.models` entry points."""

    name: str
    """What `model.arch` says to pick it."""
    description: str
    """What the architecture is, shown by `factory check` errors listing the known ones."""
    build: str | Callable[[Any, int], Any]
    """`build(config, vocab_size)`: a freshly initialised `torch.nn.Module` for a `ModelConfig`, mapping token ids
    (batch, time) to logits (batch, time, vocab_size). A `module:function` string is imported only when a model is built."""
    export: str | Callable[[Any, Any], None] = EXPORT_WEIGHTS
    """`export(weights, directory)`: writes a trained state dict as the model stage's weight files (`model.pt`,
    `model.safetensors`). Default: both, with tensors that share storage stored once in the safetensors file."""
    hugging_face: str | Callable[[Any, Any, int], Any] | None = None
    """`hugging_face(config, weights, vocab_size)`: the trained model in a Hugging Face layout (a
    `factory.models.hf_layout.HFLayout`: its `config.json` fields and its tensors by Hugging Face names), or a line saying
    why this model has none. None: the architecture has no Hugging Face layout; the model stage writes `export`'s files."""
    options: frozenset[str] | None = None
    """The fields of the `model` section it reads besides those every architecture has (`SHAPE_FIELDS`); a file that sets
    another one to something other than its default is refused. None: it reads them all."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Values of `model` fields the architecture fixes when the file does not give them (llama: rotary positions)."""
    origin: str = BUILT_IN
    """Who declared it: `built in`, or the plugin's entry point and package (set by the registry)."""

    def build_function(self) -> Callable[[Any, int], Any]:
        """The build function, imported now when declared as `module:function`."""
        return resolve(self.build)

    def export_function(self) -> Callable[[Any, Any], None]:
        """The export function, imported now when declared as `module:function`."""
        return resolve(self.export)

    def hugging_face_function(self) -> Callable[[Any, Any, int], Any] | None:
        """The Hugging Face layout function, imported now when declared as `module:function` (None when it has none)."""
        return None if self.hugging_face is None else resolve(self.hugging_face)


@functools.cache
def architectures() -> tuple[ModelArch, ...]:
    """Every registered architecture: the built-in ones, then the plugins' sorted by entry-point name."""
    known: list[ModelArch] = list(importlib.import_module(BUILTIN_MODULE).BUILTIN_ARCHITECTURES)
    for entry in entry_points_of(ENTRY_POINT_GROUP):
        arch = replace(load_declaration(entry, ModelArch, "model architecture"), origin=plugin_name(entry))
        if clash := next((a for a in known if a.name == arch.name), None):
            raise PluginError(f"{arch.origin} declares the model architecture {arch.name!r}, which {clash.origin} declares "
                              "already; rename one of them")
        known.append(arch)
    return tuple(known)


def architecture(name: str) -> ModelArch:
    """The architecture named `name`; a ConfigError naming the known ones otherwise."""
    for arch in architectures():
        if arch.name == name:
            return arch
    raise ConfigError(unknown_architecture(name))


def unknown_architecture(name: str) -> str:
    """What to say of an architecture no one declares: the known ones."""
    return f"unknown model architecture {name!r}; known architectures: {', '.join(a.name for a in architectures())}"

