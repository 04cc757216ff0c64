"""`factory diff A B`: two experiments or two artifacts side by side: config, inputs, code identity."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from factory.config import Experiment
from factory.config.stages import NOT_RECIPE
from factory.errors import ConfigError
from factory.registry.index import HEX, ByDigest, Where
from factory.registry.seam import Registry
from factory.registry.store import Manifest
from factory.ops.bases import recipe, resolve
from factory.ops.plan import build_plan, config_changes


def diff_experiments(a: Experiment, b: Experiment, registry: Registry, everything: bool = False) -> list[str]:
    """Recipe changes as computed (`bases.recipe`: a `from:` file has its base's shape, tokenizer and blend), then per stage
    whether the two share an artifact and what separates them. A section only one has is one line naming what its file set;
    `everything` lists every field of it, and the fields both share too."""
    base_a, base_b = resolve(a, registry), resolve(b, registry)
    lines = [f"config: {line}" for line in recipe_changes(recipe(a, base_a), recipe(b, base_b), (a.name, b.name), (_written(a), _written(b)),
                                                          everything)]
    if not any(" -> " in line or "only in" in line for line in lines):
        lines.insert(0, "config: identical recipes")
    plans_a = {p.kind: p for p in build_plan([a], registry)}
    plans_b = {p.kind: p for p in build_plan([b], registry)}
    for kind in dict.fromkeys([*plans_a, *plans_b]):
        if kind not in plans_a or kind not in plans_b:
            lines.append(f"{kind}: only in {a.name if kind in plans_a else b.name}")
        elif plans_a[kind].fingerprint == plans_b[kind].fingerprint:
            lines.append(f"{kind}: same stage ({plans_a[kind].status}), computed once for both")
        else:
            lines.append(f"{kind}: differs ({a.name}: {plans_a[kind].status}, {b.name}: {plans_b[kind].status})")
    return lines


def recipe_changes(
    a: Mapping[str, Any], b: Mapping[str, Any], names: tuple[str, str], written: tuple[Mapping[str, Any], Mapping[str, Any]],
    everything: bool = False, prefix: str = "",
) -> list[str]:
    """`dotted.key: a -> b` for every field that differs; a section only one side has is one line with what its file wrote
    (`written`: each file's own values). With `everything`, equal fields (`key: v (both)`) and every field of a one-sided section."""
    lines = []
    for key in sorted(a.keys() | b.keys()):
        here, one, other = f"{prefix}{key}", a.get(key), b.get(key)
        if isinstance(one, Mapping) and isinstance(other, Mapping):
            lines += recipe_changes(one, other, names, (_below(written[0], key), _below(written[1], key)), everything, f"{here}.")
        elif (one is None) != (other is None) and isinstance(one or other, Mapping) and not everything:
            side = 0 if one is not None else 1
            set_there = ", ".join(f"{k}={v!r}" for k, v in _flat(_below(written[side], key)).items())
            lines.append(f"{here}: only in {names[side]}" + (f" ({set_there}; the rest defaults)" if set_there else " (defaults)"))
        elif one != other:
            lines += [f"{k}: {v[0]!r} -> {v[1]!r}" for k, v in _pairs(here, one, other).items()]
        elif everything:
            lines.append(f"{here}: {one!r} (both)")
    return lines


def _pairs(key: str, one: Any, other: Any) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (a's, b's)} for every leaf under `key` that differs (a side without it: `(unset)`)."""
    before, after = _flat(one, key), _flat(other, key)
    return {k: (before.get(k, "(unset)"), after.get(k, "(unset)")) for k in sorted(before.keys() | after.keys()) if before.get(k) != after.get(k)}


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {prefix: value} if prefix else {}
    flat: dict[str, Any] = {}
    for key, child in value.items():
        flat.update(_flat(child, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _below(written: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = written.get(key)
    return value if isinstance(value, Mapping) else {}


def _written(experiment: Experiment) -> dict[str, Any]:
    """What the file itself set (the values it wrote, defaults left out), as plain JSON."""
    return experiment.model_dump(mode="json", exclude_unset=True, exclude=NOT_RECIPE)


def diff_artifacts(a: Manifest, b: Manifest, registry: Registry | None = None, depth: int = 3) -> list[str]:
    """What separates two published artifacts: kind, config, inputs, code, commit. With the `registry`, an input that
    differs is compared in turn (`input sft: …` then what separates the two sft artifacts: their base, data, knobs), down to
    `depth` inputs deep."""
    manifests = ByDigest(registry) if registry is not None else {}  # each input asked of the registry once, when compared
    return _differences(a, b, manifests, depth)


def _differences(a: Manifest, b: Manifest, manifests: ByDigest | dict[str, Manifest], depth: int) -> list[str]:
    lines = [] if a.kind == b.kind else [f"kind: {a.kind} -> {b.kind}"]
    lines += [f"config: {change}" for change in config_changes(a.config, b.config)]
    if a.base.get("from") != b.base.get("from"):
        lines.append(f"from: {a.base.get('from') or '(its own pretraining)'} -> {b.base.get('from') or '(its own pretraining)'}")
    for name in sorted(a.inputs.keys() | b.inputs.keys()):
        if a.inputs.get(name) != b.inputs.get(name):
            lines.append(f"input {name}: {str(a.inputs.get(name))[:12]} -> {str(b.inputs.get(name))[:12]}")
            before, after = manifests.get(a.inputs.get(name, "")), manifests.get(b.inputs.get(name, ""))
            if depth > 0 and before is not None and after is not None and before.kind == after.kind:
                lines += [f"  {line}" for line in _differences(before, after, manifests, depth - 1) if not line.startswith("commit:")]
    if a.code != b.code:
        lines.append(f"code: {a.code} -> {b.code}")
    if a.git_commit != b.git_commit:
        lines.append(f"commit: {a.git_commit} -> {b.git_commit}")
    return lines or ["identical provenance"]


def find_artifact(registry: Registry, prefix: str) -> Manifest:
    """The one manifest whose digest starts with `prefix`."""
    matches = {m.digest: m for m in registry.manifests(where=Where(digest_prefix=prefix))} if HEX.fullmatch(prefix) else {}
    if len(matches) != 1:
        found = "no artifact" if not matches else f"{len(matches)} artifacts"
        raise ConfigError(f"{found} in {registry.root} with a digest starting {prefix!r}; give an experiment file or a longer digest prefix")
    return next(iter(matches.values()))
