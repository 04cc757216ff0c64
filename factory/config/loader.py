"""Markdown experiment files -> frozen `Experiment`s, with errors that name file:line and field.

A file is YAML front matter between `---` lines, then a Markdown body (the reasoning).
`extends: other.md` inherits the other file's recipe (deep merge, lists replaced; `name` and
`sweep` are not inherited). `sweep:` maps dotted paths to lists of values; the grid expands
into one named variant per combination.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from factory.config.files import outside_roots, read_text
from factory.config.settings import extends_roots
from factory.config.front_matter import parse_yaml, split_front_matter
from factory.config.kinds import experiment_model, plugin_hint
from factory.config.schema import Experiment
from factory.config.section import UNKNOWN_KEY
from factory.errors import ConfigError

NOT_INHERITED = ("name", "sweep")
RESERVED = ("source", "variant", "bound")
"""Experiment fields set by the loader (and `bound` by resolving `from`), never by the file."""
DEFAULT_MAX_VARIANTS = 256
MAX_EXTENDS_DEPTH = 16
"""Files on one `extends` chain (each read, parsed and merged once per file that extends it)."""
Location = tuple[Path, int]
Reader = Callable[[Path], str]


@dataclass(frozen=True, kw_only=True, slots=True)
class Document:
    """One file's front matter after `extends` is resolved, with where every key was written."""

    path: Path
    raw: dict[str, Any]
    locations: dict[tuple, Location]
    body: str


def load(path: str | Path, variant: str | None = None) -> Experiment:
    """One experiment of a file: the file's only one, or the sweep variant named `variant`."""
    return pick_variant(path, load_file(path), variant)


def pick_variant(path: str | Path, variants: list[Experiment], name: str | None) -> Experiment:
    """The experiment called `name` among the ones a file defines; a file of one experiment needs no name."""
    names = ", ".join(experiment.name for experiment in variants)
    if name is None:
        if len(variants) == 1:
            return variants[0]
        raise ConfigError(f"{path}: is a sweep of {len(variants)} variants; pick one with --variant NAME: {names}")
    for experiment in variants:
        if experiment.name == name:
            return experiment
    raise ConfigError(f"{path}: has no variant {name!r}; its variants: {names}")


def load_file(path: str | Path, max_variants: int = DEFAULT_MAX_VARIANTS) -> list[Experiment]:
    """Every experiment a file defines: one, or one per sweep variant."""
    return load_text(Path(path), _read(Path(path)), max_variants)


def load_text(path: Path, text: str, max_variants: int = DEFAULT_MAX_VARIANTS, read: Reader | None = None) -> list[Experiment]:
    """Like `load_file`, for the text of `path` given directly; `read` fetches files it extends (e.g. at a git commit)."""
    document = read_document(path, text, chain=(), read=read or _read)
    raw = dict(document.raw)
    for reserved in RESERVED:
        if reserved in raw:
            where, line = document.locations[(reserved,)]
            raise ConfigError(f"{where}:{line}: {reserved}: set by the loader, not by the file; remove it")
    sweep = raw.pop("sweep", None)
    raw.setdefault("name", path.stem)
    raw.setdefault("description", document.body.strip())
    raw["source"] = str(path)
    grid = _sweep_grid(document, sweep, max_variants)
    experiments = [_validate(document, raw, variant) for variant in grid]
    _refuse_repeated_recipes(document, sweep, experiments)
    _refuse_name_collisions(document, experiments)
    return experiments


def read_document(path: Path, text: str, chain: tuple[Path, ...], read: Reader) -> Document:
    """Parse one file and everything it extends; `chain` is the files already on the way here."""
    front, first_line, body = split_front_matter(path, text)
    parsed, lines = parse_yaml(path, front, first_line)
    locations: dict[tuple, Location] = {key: (path, line) for key, line in lines.items()}
    raw = dict(parsed)  # the parse is shared: only this top level is changed here, and deeper levels are copied before changes
    parent_name = raw.pop("extends", None)
    if parent_name is None:
        return Document(path=path, raw=raw, locations=locations, body=body)
    line = lines[("extends",)]
    if not isinstance(parent_name, str) or not parent_name.strip() or "\0" in parent_name:
        raise ConfigError(f"{path}:{line}: extends: expected the path of another experiment file, found {parent_name!r}")
    parent_path = (path.parent / parent_name).resolve()
    if refused := outside_roots(parent_path, extends_roots(path)):
        raise ConfigError(f"{path}:{line}: extends: {refused}; extend an experiment file of this repository")
    here = path.resolve()
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise ConfigError(f"{path}:{line}: extends: a chain of more than {MAX_EXTENDS_DEPTH} files; extend a file nearer the base")
    if parent_path in (*chain, here):
        cycle = " -> ".join(str(p) for p in (*chain, here, parent_path))
        raise ConfigError(f"{path}:{line}: extends: cycle {cycle}; an experiment cannot extend itself")
    try:
        parent_text = read(parent_path)
    except ConfigError as e:
        raise ConfigError(f"{path}:{line}: extends: {e}") from e
    parent = read_document(parent_path, parent_text, (*chain, here), read)
    inherited = {k: v for k, v in parent.raw.items() if k not in NOT_INHERITED}
    inherited_locations = {k: v for k, v in parent.locations.items() if not k or k[0] not in NOT_INHERITED}
    return Document(path=path, raw=deep_merge(inherited, raw), locations={**inherited_locations, **locations}, body=body)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) is replaced by the override."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _sweep_grid(document: Document, sweep: Any, max_variants: int) -> list[dict[str, Any]]:
    """The sweep's combinations as {dotted path: value}; a file without a sweep is one empty variant."""
    if sweep is None:
        return [{}]
    path, line = document.locations.get(("sweep",), (document.path, 1))
    if not isinstance(sweep, dict) or not sweep:
        raise ConfigError(f"{path}:{line}: sweep: expected a mapping of dotted paths to lists of values, found {sweep!r}")
    for dotted, values in sweep.items():
        key_path, key_line = document.locations[("sweep", dotted)]
        if not re.fullmatch(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+", str(dotted)):
            raise ConfigError(f"{key_path}:{key_line}: sweep.{dotted}: expected a dotted path to a field, like pretrain.lr")
        if dotted.split(".")[0] in ("name", "sweep", "extends", "description"):
            raise ConfigError(f"{key_path}:{key_line}: sweep.{dotted}: only recipe fields can be swept")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{key_path}:{key_line}: sweep.{dotted}: expected a non-empty list of values, found {values!r}")
    size = 1
    for values in sweep.values():
        size *= len(values)
    if size > max_variants:
        raise ConfigError(f"{path}:{line}: sweep: expands to {size} variants, more than the limit of {max_variants}; shrink the grid")
    return [dict(zip(sweep, combination, strict=True)) for combination in itertools.product(*sweep.values())]


def _validate(document: Document, raw: dict[str, Any], variant: dict[str, Any]) -> Experiment:
    raw = copy.deepcopy(raw)
    locations = dict(document.locations)
    for dotted, value in variant.items():
        keys = tuple(dotted.split("."))
        _set(raw, keys, value, document)
        locations[keys] = document.locations[("sweep", dotted)]
    if variant:
        raw["name"] = variant_name(raw["name"], variant)
        raw["variant"] = variant
    _refuse_non_finite(document.path, raw, (), locations)
    model = experiment_model()  # the built-in sections and those of the installed stage-kind plugins
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(document.path, e, locations, model)) from e


def _refuse_non_finite(path: Path, value: Any, keys: tuple, locations: dict[tuple, Location]) -> None:
    """`.inf` and `.nan` pass YAML and would crash a stage (or a JSON plan) later: refuse them where they were written."""
    if isinstance(value, float) and not math.isfinite(value):
        where, line = location_of(keys, locations, (path, 2))
        raise ConfigError(f"{where}:{line}: {'.'.join(str(k) for k in keys)}: {value} is not a finite number; write a number")
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, child in children:
        _refuse_non_finite(path, child, (*keys, key), locations)


def _refuse_repeated_recipes(document: Document, sweep: dict[str, list] | None, experiments: list[Experiment]) -> None:
    """Two values of one axis that its field reads alike (`300` and `300.0` for a whole number) would train one recipe twice
    under two names: refused at the later value, once the fields have read them."""
    if not sweep:
        return
    positions = list(itertools.product(*(range(len(values)) for values in sweep.values())))  # the grid's order
    seen: dict[str, int] = {}
    for index, experiment in enumerate(experiments):
        recipe = json.dumps(experiment.model_dump(mode="json", exclude={"name", "variant"}), sort_keys=True)
        first = seen.setdefault(recipe, index)
        if first == index:
            continue
        axis, dotted = next((a, d) for a, d in enumerate(sweep) if positions[first][a] != positions[index][a])
        earlier, later = positions[first][axis], positions[index][axis]
        path, line = document.locations.get(("sweep", dotted, later), document.locations[("sweep", dotted)])
        raise ConfigError(
            f"{path}:{line}: sweep.{dotted}: values {earlier + 1} and {later + 1} ({sweep[dotted][earlier]!r} and "
            f"{sweep[dotted][later]!r}) are one value once the field reads them, so variants {experiments[first].name!r} and "
            f"{experiment.name!r} would be one recipe twice; keep one of the two values"
        )


def _refuse_name_collisions(document: Document, experiments: list[Experiment]) -> None:
    """Two variants whose values read the same once normalised (`1e-3` and `0.001` both give `lr=0.001`) would share a partition."""
    seen: dict[str, Experiment] = {}
    for experiment in experiments:
        if (other := seen.setdefault(experiment.name, experiment)) is not experiment:
            path, line = document.locations.get(("sweep",), (document.path, 1))
            raise ConfigError(
                f"{path}:{line}: sweep: variants {other.variant} and {experiment.variant} are both named {experiment.name!r}; "
                "make the swept values distinct (each variant's name is made of its values, lowercased, other characters as '-')"
            )


def variant_name(base: str, variant: Mapping[str, Any]) -> str:
    """A readable partition key: the base name, then `leaf=value` per swept field."""
    leaves = [dotted.split(".")[-1] for dotted in variant]
    parts = []
    for (dotted, value), leaf in zip(variant.items(), leaves, strict=True):
        label = leaf if leaves.count(leaf) == 1 else dotted
        text = re.sub(r"[^a-z0-9._-]+", "-", str(value).lower()).strip("-") or "x"
        parts.append(f"{label}={text}")
    return ".".join([base, *parts])


def _set(raw: dict[str, Any], keys: tuple[str, ...], value: Any, document: Document) -> None:
    target = raw
    for depth, key in enumerate(keys[:-1]):
        child = target.setdefault(key, {})
        if not isinstance(child, dict):
            path, line = document.locations[("sweep", ".".join(keys))]
            raise ConfigError(f"{path}:{line}: sweep.{'.'.join(keys)}: {'.'.join(keys[: depth + 1])} is not a section")
        target = child
    target[keys[-1]] = value


def describe_validation_error(
    path: Path, error: ValidationError, locations: dict[tuple, Location], model: type[BaseModel] = Experiment
) -> str:
    """One line per problem: `file:line: dotted.field: what is wrong (found X)`; `model` is what was validated."""
    messages = []
    for problem in error.errors():
        loc = tuple(problem["loc"])
        where_path, line = location_of(loc, locations, (path, 2))
        dotted = ".".join(str(p) for p in loc) or "(front matter)"
        messages.append(f"{where_path}:{line}: {dotted}: {_explain(problem, loc, model)}")
    return "\n".join(messages)


def key_locations(path: Path) -> dict[tuple, Location]:
    """Where every key of a file, and of the files it extends, was written."""
    return read_document(path, _read(path), chain=(), read=_read).locations


def location_of(loc: tuple, locations: dict[tuple, Location], default: Location) -> Location:
    """The place of the deepest written key on the way to `loc`."""
    for end in range(len(loc), -1, -1):
        if loc[:end] in locations:
            return locations[loc[:end]]
    return default


def _explain(problem: dict, loc: tuple, model: type[BaseModel]) -> str:
    kind = problem["type"]
    if kind == UNKNOWN_KEY:
        return problem["msg"]
    if kind == "extra_forbidden":
        top = len(loc) == 1 and issubclass(model, Experiment)
        if top and (hint := plugin_hint(str(loc[0]))):
            return hint
        fields = _fields_at(model, loc[:-1]) + (["extends", "sweep"] if top else [])
        reserved = RESERVED if top else ()  # set by the loader, not the file
        allowed = ", ".join(sorted(f for f in fields if f not in reserved))
        return f"unknown key; allowed here: {allowed}"
    if kind == "missing":
        return "required field is missing"
    message = problem["msg"].removeprefix("Value error, ")
    if "input" in problem and not isinstance(problem["input"], dict):
        message += f" (found {_short(problem['input'])})"
    return message


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The fields of the section at `loc` (a key of a mapping of sections, or an index of a list, is stepped over)."""
    keyed = False
    for part in loc:
        if keyed:  # `part` names an entry of a dict/tuple of sections, not a field
            keyed = False
            continue
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field else None
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        candidates += [inner for c in list(candidates) for inner in getattr(c, "__args__", ())]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return []
        model = nested[0]
        keyed = getattr(annotation, "__origin__", None) in (dict, tuple) or any(
            getattr(c, "__origin__", None) in (dict, tuple) for c in candidates
        )
    return list(model.model_fields)


def _read(path: Path) -> str:
    return read_text(path)


def reader(texts: Mapping[Path, str]) -> Reader:
    """Read files from a snapshot of texts (e.g. at a commit), so `extends` and `from` resolve at that commit too."""
    by_path = {path.resolve(): text for path, text in texts.items()}

    def read(path: Path) -> str:
        if path.resolve() not in by_path:
            raise ConfigError(f"no such file {path} at that commit")
        return by_path[path.resolve()]

    return read
