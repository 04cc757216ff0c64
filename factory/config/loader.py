"""Markdown experiment files -> frozen `Experiment`, with errors that name file:line and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from factory.config.schema import Experiment
from factory.errors import ConfigError

FENCE = "---"


def load(path: str | Path) -> Experiment:
    """Parse one experiment file into a frozen, validated `Experiment`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: no such experiment file") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the file as UTF-8 text ({e})") from e
    front, first_line, body = split_front_matter(path, text)
    raw, lines = parse_yaml(path, front, first_line)
    raw.setdefault("name", path.stem)
    raw.setdefault("description", body.strip())
    try:
        return Experiment.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(path, e, lines, first_line)) from e


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


def parse_yaml(path: Path, front: str, first_line: int) -> tuple[dict[str, Any], dict[tuple, int]]:
    """Parse front matter; return the mapping and the line of every key path."""
    try:
        node = yaml.compose(front, Loader=yaml.SafeLoader)
        data = yaml.safe_load(front)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = first_line + mark.line if mark else first_line
        raise ConfigError(f"{path}:{line}: invalid YAML: {e.problem or e}") from e
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
            if key in seen:
                dotted = ".".join(str(p) for p in (*prefix, key))
                raise ConfigError(f"{path}:{line}: {dotted}: key given twice; keep one")
            seen.add(key)
            out[(*prefix, key)] = line
            _index_lines(path, value_node, (*prefix, key), first_line, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(path, item, (*prefix, i), first_line, out)


def describe_validation_error(path: Path, error: ValidationError, lines: dict[tuple, int], first_line: int) -> str:
    """One line per problem: `file:line: dotted.field: what is wrong (found X)`."""
    messages = []
    for problem in error.errors():
        loc = tuple(problem["loc"])
        line = _line_of(loc, lines, first_line)
        dotted = ".".join(str(p) for p in loc) or "(front matter)"
        messages.append(f"{path}:{line}: {dotted}: {_explain(problem, loc)}")
    return "\n".join(messages)


def _line_of(loc: tuple, lines: dict[tuple, int], default: int) -> int:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return default


def _explain(problem: dict, loc: tuple) -> str:
    kind = problem["type"]
    if kind == "extra_forbidden":
        allowed = ", ".join(sorted(_fields_at(Experiment, loc[:-1])))
        return f"unknown key; allowed here: {allowed}"
    if kind == "missing":
        return "required field is missing"
    message = problem["msg"].removeprefix("Value error, ")
    if "input" in problem and not isinstance(problem["input"], dict):
        message += f" (found {problem['input']!r})"
    return message


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)
