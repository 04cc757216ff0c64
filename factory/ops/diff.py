"""`factory diff A B`: two experiments or two artifacts side by side: config, inputs, code identity."""

from __future__ import annotations

from factory.config import Experiment
from factory.config.stages import NOT_RECIPE
from factory.errors import ConfigError
from factory.registry.store import ArtifactStore, Manifest
from factory.ops.plan import build_plan, config_changes


def diff_experiments(a: Experiment, b: Experiment, registry: ArtifactStore) -> list[str]:
    """Recipe changes, then per stage whether the two share an artifact and what separates them."""
    lines = [f"config: {change}" for change in config_changes(a.model_dump(mode="json", exclude=NOT_RECIPE), b.model_dump(mode="json", exclude=NOT_RECIPE))]
    if not lines:
        lines.append("config: identical recipes")
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


def diff_artifacts(a: Manifest, b: Manifest, registry: ArtifactStore | None = None, depth: int = 3) -> list[str]:
    """What separates two published artifacts: kind, config, inputs, code, commit. With the `registry`, an input that
    differs is compared in turn (`input sft: …` then what separates the two sft artifacts: their base, data, knobs), down to
    `depth` inputs deep."""
    manifests = {m.digest: m for m in registry.manifests()} if registry is not None else {}  # read once for every level
    return _differences(a, b, manifests, depth)


def _differences(a: Manifest, b: Manifest, manifests: dict[str, Manifest], depth: int) -> list[str]:
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


def find_artifact(registry: ArtifactStore, prefix: str) -> Manifest:
    """The one manifest whose digest starts with `prefix`."""
    matches = {m.digest: m for m in registry.manifests() if m.digest.startswith(prefix)}
    if len(matches) != 1:
        found = "no artifact" if not matches else f"{len(matches)} artifacts"
        raise ConfigError(f"{found} in {registry.root} with a digest starting {prefix!r}; give an experiment file or a longer digest prefix")
    return next(iter(matches.values()))
