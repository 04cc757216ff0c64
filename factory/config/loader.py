"""Markdown experiment files -> frozen `Experiment`s, with errors that name file:line and field.

A file is YAML front matter between `---` lines, then a Markdown body (the reasoning).
`extends: other.md` inherits the other file's recipe (deep merge, lists replaced; `name` and
`sweep` are not inherited). `sweep:` maps dotted paths to lists of values; the grid expands
into one named variant per combination.
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from factory.config.schema import Experiment
from factory.errors import ConfigError

FENCE = "---"
NOT_INHERITED = ("name", "sweep")
DEFAULT_MAX_VARIANTS = 256
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
    for reserved in ("source", "variant"):
        if reserved in raw:
            where, line = document.locations[(reserved,)]
            raise ConfigError(f"{where}:{line}: {reserved}: set by the loader, not by the file; remove it")
    sweep = raw.pop("sweep", None)
    raw.setdefault("name", path.stem)
    raw.setdefault("description", document.body.strip())
    raw["source"] = str(path)
    grid = _sweep_grid(document, sweep, max_variants)
    return [_validate(document, raw, variant) for variant in grid]


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
    here = path.resolve()
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


def split_front_matter(path: Path, text: str) -> tuple[str, int, str]:
    """Return (front matter YAML, its first line number, Markdown body)."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != FENCE:
        raise ConfigError(
            f"{path}:1: an experiment file starts with a '---' line, then YAML front matter, "
            "then a closing '---' line and the Markdown body"
        )
    for index, line in enumerate(lines[1:], start=1):
        if line.strip() == FENCE:
            return "".join(lines[1:index]), 2, "".join(lines[index + 1 :])
    raise ConfigError(f"{path}:1: the front matter opened on line 1 is never closed: add a '---' line after it")


class _Yaml12Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser when PyYAML has it: ~10x faster
    """SafeLoader with YAML 1.2 booleans: only true/false, so a rule's `on:` key stays the word `on`."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def parse_yaml(path: Path, front: str, first_line: int) -> tuple[dict[str, Any], dict[tuple, int]]:
    """Parse front matter; return the mapping and the line of every key path.

    The result is shared between callers (a file many others extend is parsed once): treat it as read-only."""
    return _parse_yaml(str(path), front, first_line)


@functools.lru_cache(maxsize=256)
def _parse_yaml(name: str, front: str, first_line: int) -> tuple[dict[str, Any], dict[tuple, int]]:
    path = Path(name)
    loader = _Yaml12Loader(front)
    try:
        node = loader.get_single_node()  # parsed once: the node tree gives the lines, then the values
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = first_line + mark.line if mark else first_line
        raise ConfigError(f"{path}:{line}: invalid YAML: {e.problem or e}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}:{first_line}: invalid YAML: {e}") from e
    finally:
        loader.dispose()
    if data is None:
        data, node = {}, None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:{first_line}: the front matter must be a mapping of sections, found {type(data).__name__}")
    lines: dict[tuple, int] = {}
    if node is not None:
        _index_lines(path, node, (), first_line, lines)
    return data, lines


def _index_lines(path: Path, node: yaml.Node, prefix: tuple, first_line: int, out: dict[tuple, int]) -> None:
    out.setdefault(prefix, first_line + node.start_mark.line)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            line = first_line + key_node.start_mark.line
            if not isinstance(key, str) or not isinstance(key_node, yaml.ScalarNode):
                raise ConfigError(f"{path}:{line}: keys must be plain words, found {key!r}")
            if key in seen:
                dotted = ".".join(str(p) for p in (*prefix, key))
                raise ConfigError(f"{path}:{line}: {dotted}: key given twice; keep one")
            seen.add(key)
            out[(*prefix, key)] = line
            _index_lines(path, value_node, (*prefix, key), first_line, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(path, item, (*prefix, i), first_line, out)


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
    try:
        return Experiment.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(document.path, e, locations)) from e


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
    if kind == "extra_forbidden":
        fields = _fields_at(model, loc[:-1]) + (["extends", "sweep"] if len(loc) == 1 and model is Experiment else [])
        reserved = ("source", "variant") if len(loc) == 1 and model is Experiment else ()  # set by the loader, not the file
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
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: no such experiment file") from e
    except (OSError, UnicodeDecodeError, ValueError) as e:  # ValueError: a path no file system accepts
        raise ConfigError(f"{path}: cannot read the file as UTF-8 text ({e})") from e
