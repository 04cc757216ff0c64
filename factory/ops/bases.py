"""Resolving `from:`: the model a post-training stage starts from, pinned to one registry digest when the file is planned.

`sft.from` (or `rl.from`) names a model made elsewhere: another experiment's exported model (the file read at the same
commit as the file naming it), a promotion alias, or a digest. `bind` resolves it once and returns the experiment with
what it resolved to (`Experiment.bound`): the base model's digest (the input `base` of the stage that starts from it)
and the digests of the blend and tokenizer the base was trained with (the held-out data and tokenizer the file
inherits), and the base model's shape as its `model`; `recipe` is the file's recipe as computed (the base's shape,
tokenizer and blend in place of the schema defaults the file leaves). Every plan of the experiment then reads those digests, so a
finished run never changes meaning: when an alias moves, the file plans again from the new model, and says so.

Every problem is a `ConfigError` naming the file, line and field, what was found and what exists, raised before any
compute: a file or stage that is not there, an unknown alias or digest, a cycle of `from:` between files, a base whose
shape the file contradicts.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from factory.config import Experiment, load_text, pick_variant, plan_stage, upstream_of
from factory.config.base_refs import ParsedRef, parse_base_ref
from factory.config.files import read_text
from factory.config.kinds import BLEND, TOKENIZER, model_kind, provider
from factory.config.loader import location_of, read_document
from factory.config.schema import ModelConfig
from factory.config.stages import BASE, NOT_RECIPE, PENDING, inherited_inputs, stages_of
from factory.errors import ConfigError
from factory.registry.aliases import known_aliases, standing
from factory.registry.index import HEX, ByDigest, Where
from factory.registry.layout import MODEL_CONFIG
from factory.registry.seam import Registry
from factory.registry.store import Manifest
from factory.config.kinds import computed_datasets

Reader = Callable[[Path], str]
MAX_CHAIN = 16
"""Files on one chain of `from:` (a base that starts from a base ...)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Base:
    """What one `from:` resolved to."""

    section: str
    """The post-training section that starts from it (`sft`, `rl`)."""
    ref: ParsedRef
    digest: str
    """The model's registry digest; `pending:<fingerprint>` when another experiment's model is not computed yet."""
    inputs: Mapping[str, str]
    """{`base`: the model, `blend`: ..., `tokenizer`: ...}: the digests the file's stages read in place of its own."""
    model: ModelConfig
    """The base model's shape, which the file's model keeps."""
    said: str
    """One line for people: `production = model a1b2c3d4e5f6 (promoted 2026-11-20 by ada)`."""
    experiment: str = ""
    """The experiment that made the model (when the registry or the named file says)."""
    file: Path | None = None
    """For another experiment's model: the file that defines it (`factory run` runs it first when it is pending)."""
    inherited: Mapping[str, Any] = field(default_factory=dict)
    """The base's `tokenizer` section and `data` (its blend, and the datasets it draws from when its file says), as plain
    JSON: what the file keeps of the base besides its shape (`recipe`)."""

    @property
    def pending(self) -> bool:
        """Whether the base is another experiment's model that is not computed yet."""
        return self.digest.startswith(PENDING)

    def record(self) -> dict[str, Any]:
        """What the manifests of the file's stages record of it."""
        return {"section": self.section, "from": self.ref.text, "model": self.digest, "experiment": self.experiment, "said": self.said}


def bind(
    experiment: Experiment, registry: Registry, *, read: Reader | None = None, pins: Mapping[str, str] | None = None,
    chain: tuple[str, ...] = (),
) -> Experiment:
    """`experiment` with its `from` resolved (`bound`, and the base's shape as its model); unchanged without one.

    `read` reads other files (at a commit: the sensor's snapshot); `pins` maps `from` references to the digests a run
    was planned with (its tags), so every stage of one run starts from the same model, wherever the alias has moved."""
    return bound_with(experiment, resolve(experiment, registry, read=read, pins=pins, chain=chain))


def bound_with(experiment: Experiment, base: Base | None) -> Experiment:
    """`experiment` planned from `base`: its digests as the inputs it stands for, its shape as the model's."""
    return experiment if base is None else experiment.model_copy(update={"bound": dict(base.inputs), "model": base.model})


def resolve(
    experiment: Experiment, registry: Registry, *, read: Reader | None = None, pins: Mapping[str, str] | None = None,
    chain: tuple[str, ...] = (),
) -> Base | None:
    """What `experiment`'s `from` names, pinned to a digest; None when the file starts from its own pretraining."""
    if experiment.base is None:
        return None
    section, text = experiment.base
    fail = Failer(experiment, section, read)
    ref = parse_base_ref(text)
    pinned = (pins or {}).get(text)
    if ref.form == "experiment" and pinned is None:
        base = _from_experiment(experiment, section, ref, registry, read, chain, fail)
    else:
        base = _from_registry(section, ref, registry, pinned, fail)
    _keeps_shape(experiment, base, fail)
    return base


def _from_registry(section: str, ref: ParsedRef, registry: Registry, pinned: str | None, fail: Failer) -> Base:
    """An alias or a digest (or any reference a run pinned): the published model it names now."""
    kind = model_kind().name

    def model_named(digest: str | None) -> list[Manifest]:
        """The model published with this digest (the last by fingerprint, as a listing into a dict keeps), if any."""
        return list(registry.manifests(kind, Where(digest=digest)))[-1:] if digest and HEX.fullmatch(digest) else []

    if pinned is not None:
        found = model_named(pinned)
        how = "pinned when the run was planned"
    elif ref.form == "alias":
        now = standing(registry, ref.name)
        if now.model is None:
            known = ", ".join(known_aliases(registry)) or "none yet"
            raise fail(f"alias {ref.name!r} names no model in the registry at {registry.root} (aliases: {known}); promote one with "
                       f"`factory promote MODEL --as {ref.name}`, or name a model by digest (model@<sha256>)")
        found = model_named(now.model)
        record = now.promotion or {}
        how = f"promoted {str(record.get('at', '?'))[:10]}" + (f" by {record['by']}" if record.get("by") else "")
        if not found:
            raise fail(f"alias {ref.name!r} names model {now.model[:12]}, which is not in the registry at {registry.root} (damaged or "
                       "removed); promote another model or repair the registry (`factory registry verify`)")
    else:
        prefix = ref.digest if HEX.fullmatch(ref.digest) else None
        found = list({m.digest: m for m in registry.manifests(kind, Where(digest_prefix=prefix))}.values()) if prefix else []
        how = ""
        if len(found) != 1:
            recent = sorted({m.digest: m for m in registry.manifests(kind)}.values(), key=lambda m: m.created)[-5:]
            listing = "; ".join(f"{m.digest[:12]} ({m.experiment}, {m.created[:10]})" for m in recent) or "none"
            what = "no model" if not found else f"{len(found)} models"
            raise fail(f"{what} in the registry at {registry.root} with a digest starting {ref.digest!r} (latest models: {listing})")
    if not found:
        raise fail(f"{pinned[:12]} (pinned when the run was planned) is no model in the registry at {registry.root}")
    model = found[0]
    said = f"{ref.text.removeprefix('alias:')} = model {model.digest[:12]} ({how or f'made for {model.experiment}, {model.created[:10]}'})"
    inputs = _lineage_inputs(registry, model, fail)
    return Base(section=section, ref=ref, digest=model.digest, inputs=inputs, model=_shape(registry, model), said=said,
                experiment=model.experiment, inherited=_inherited_from_registry(registry, inputs))


def _from_experiment(
    experiment: Experiment, section: str, ref: ParsedRef, registry: Registry, read: Reader | None, chain: tuple[str, ...],
    fail: Failer,
) -> Base:
    """Another experiment's exported model: its file read as this one was, planned against the registry."""
    here = Path(experiment.source)
    path, text = _read_named(here, ref.path, read, fail)
    try:
        variants = load_text(path, text, read=read)
    except ConfigError as e:
        raise fail(f"{ref.path} does not load: {e}") from None
    if len(variants) > 1 and ref.variant is None:
        forms = ", ".join(f"{ref.path}@{v.name}#{ref.stage}" for v in variants)
        raise fail(f"{ref.path} is a sweep of {len(variants)} variants; name one: {forms}")
    try:
        base_experiment = pick_variant(ref.path, variants, ref.variant if len(variants) > 1 or ref.variant else None)
    except ConfigError as e:
        raise fail(str(e)) from None
    exported = model_kind().name
    if ref.stage != exported:
        raise fail(f"names stage {ref.stage!r}; a base is an exported model: write {ref.path}#{exported}")
    if exported not in stages_of(base_experiment):
        raise fail(f"{ref.path} ({base_experiment.name}) exports no model: it has no training stage")
    walked = (*chain, f"{_shown(here)}#{experiment.name}")
    key = f"{_shown(path)}#{base_experiment.name}"
    if key in walked:
        raise fail(f"a cycle of `from:` between files: {' -> '.join([*walked, key])}; a file cannot start from its own model")
    if len(walked) >= MAX_CHAIN:
        raise fail(f"a chain of more than {MAX_CHAIN} files through `from:`; start from a model nearer the end by alias or digest")
    try:
        nested = resolve(base_experiment, registry, read=read, chain=walked)
    except ConfigError as e:
        raise fail(f"{ref.text}: {e}") from None
    bound = bound_with(base_experiment, nested)
    digests = planned_digests(bound, registry)
    digest = digests[exported]
    said = (f"{ref.text} = model {digest[:12]} ({bound.name})" if not digest.startswith(PENDING) else
            f"{ref.text} = the model of {bound.name}, not computed yet (`factory run` computes it first)")
    inputs = {BASE: digest, **{name: digests[name] for name in inherited_inputs()}}
    computed = recipe(bound, nested)
    blended = {part["dataset"] for part in computed["data"]["blend"] if part.get("dataset")}
    data = {"blend": computed["data"]["blend"], "validation_percent": computed["data"]["validation_percent"],
            "datasets": {name: d for name, d in computed["data"]["datasets"].items() if name in blended}}
    return Base(section=section, ref=ref, digest=digest, inputs=inputs, model=bound.model, experiment=bound.name, said=said, file=path,
                inherited={"tokenizer": computed["tokenizer"], "data": data})


def recipe(experiment: Experiment, base: Base | None) -> dict[str, Any]:
    """The recipe as computed, as plain JSON (what `factory diff` compares): only the datasets a stage computes, and, for a
    file that starts from a model made elsewhere, that model's shape, tokenizer and blend, never the schema defaults its
    own file leaves in place."""
    computed = experiment.model_dump(mode="json", exclude=NOT_RECIPE)
    own = set(computed_datasets(experiment))
    computed["data"]["datasets"] = {name: d for name, d in computed["data"]["datasets"].items() if name in own}
    if base is None:
        return computed
    computed["model"] = base.model.model_dump(mode="json")
    computed["tokenizer"] = base.inherited.get("tokenizer", computed["tokenizer"])
    data = base.inherited.get("data", {})
    computed["data"] = {**computed["data"], **data, "datasets": {**data.get("datasets", {}), **computed["data"]["datasets"]}}
    return computed


def planned_digests(experiment: Experiment, registry: Registry) -> dict[str, str]:
    """{stage: artifact digest} of a (bound) experiment as the registry holds it; `pending:<fingerprint>` for a stage not
    computed yet. Its `bound` inputs are included."""
    digests = dict(experiment.bound)
    for kind in stages_of(experiment):
        spec = plan_stage(experiment, kind, {name: digests[name] for name in upstream_of(experiment, kind)})
        manifest = registry.lookup(spec.fingerprint)
        digests[kind] = manifest.digest if manifest is not None else PENDING + spec.fingerprint
    return digests


def _read_named(here: Path, named: str, read: Reader | None, fail: Failer) -> tuple[Path, str]:
    """The file a reference names, relative to the naming file's directory or to its repository, and its text."""
    candidates = list(dict.fromkeys([here.parent / named, _repository(here) / named, Path(named)]))
    for candidate in candidates:
        with contextlib.suppress(ConfigError):
            return candidate, (read or read_text)(candidate)
    raise fail(f"no experiment file {named} (looked for {', '.join(str(c) for c in candidates)}); name a file of this repository")


def _shown(path: Path) -> str:
    """A file as a chain of `from:` names it: relative to the working directory when it is under it."""
    resolved = path.resolve()
    return str(resolved.relative_to(Path.cwd())) if resolved.is_relative_to(Path.cwd()) else str(resolved)


def _repository(path: Path) -> Path:
    """The repository a file is in (the nearest directory above it with `.git`), or the working directory."""
    for parent in path.resolve().parents:
        if (parent / ".git").exists():
            return parent
    return Path.cwd()


def _lineage_inputs(registry: Registry, model: Manifest, fail: Failer) -> dict[str, str]:
    """{`base`: the model, and the blend and tokenizer it was trained with}, found by walking its manifests' inputs."""
    wanted = set(inherited_inputs())
    by_digest = ByDigest(registry)
    found: dict[str, str] = {}
    todo, seen = [model], set()
    while todo and len(found) < len(wanted):  # breadth first: the nearest blend and tokenizer
        manifest = todo.pop(0)
        if manifest.digest in seen:
            continue
        seen.add(manifest.digest)
        for name, digest in manifest.inputs.items():
            if name in wanted:
                found.setdefault(name, digest)
            if digest in by_digest:
                todo.append(by_digest[digest])
    if missing := wanted - found.keys():
        raise fail(f"model {model.digest[:12]} has no {' or '.join(sorted(missing))} in its lineage: start from a model the factory trained")
    return {BASE: model.digest, **found}


def _inherited_from_registry(registry: Registry, inputs: Mapping[str, str]) -> dict[str, Any]:
    """The tokenizer and blend settings a published model was trained with, as their artifacts recorded them."""
    by_digest = ByDigest(registry)
    configs = {digest: m.config for digest in inputs.values() if (m := by_digest.get(digest)) is not None}
    tokenizer = configs.get(inputs[provider(TOKENIZER).name], {})
    blend = configs.get(inputs[provider(BLEND).name], {})
    return {"tokenizer": tokenizer.get("tokenizer", tokenizer),
            "data": {key: blend[key] for key in ("blend", "validation_percent") if key in blend}}


def _shape(registry: Registry, model: Manifest) -> ModelConfig:
    """The exported model's shape, from its config."""
    record = json.loads((registry.open(model.digest) / MODEL_CONFIG).read_text())
    return ModelConfig.model_validate(record["model"])


def _keeps_shape(experiment: Experiment, base: Base, fail: Failer) -> None:
    """A file that starts from a model keeps its shape: a `model` section may only repeat it."""
    if "model" not in experiment.model_fields_set or experiment.model == base.model:
        return
    mine, theirs = experiment.model.model_dump(mode="json"), base.model.model_dump(mode="json")
    differs = [f"model.{key}: {mine.get(key)!r} here, {theirs.get(key)!r} in the base" for key in sorted(mine.keys() | theirs.keys())
               if mine.get(key) != theirs.get(key)]
    raise fail(f"starts from {base.said}, whose shape differs ({'; '.join(differs)}); a model that starts from another's weights "
               "keeps its shape: remove the `model` section")


class Failer:
    """Makes the ConfigError of a `from` problem, located at the `from` key of the file (line included when it can be read)."""

    def __init__(self, experiment: Experiment, section: str, read: Reader | None) -> None:
        self.experiment, self.section, self.read = experiment, section, read

    def __call__(self, message: str) -> ConfigError:
        path = Path(self.experiment.source or self.experiment.name)
        try:
            text = (self.read or read_text)(path)
            located, line = location_of((self.section, "from"), read_document(path, text, (), self.read or read_text).locations, (path, 1))
            where = f"{located}:{line}"
        except ConfigError:
            where = str(path)
        return ConfigError(f"{where}: {self.section}.from: {message}")
