"""Front matter -> a mapping with the line of every key, parsed within fixed bounds.

Experiment files come from pull requests and run unattended, so the parse is bounded before any
value is built: libyaml composes the node graph (linear in the text), then one walk counts the
nodes as aliases would expand them, the nesting depth and the value of every integer (whatever base it is
written in), and refuses a file over any limit with its `file:line` (a 370-byte "billion laughs" file
expands to 10^9 nodes; `0x` and 5,000 `f`s is one integer Python would print only as a crash).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml

from factory.errors import ConfigError

FENCE = "---"
MAX_YAML_NODES = 10_000
"""Nodes of the front matter once aliases are expanded; a real recipe has a few hundred."""
MAX_YAML_DEPTH = 32
"""Nesting depth of mappings and lists; a recipe nests four or five deep."""
MAX_INT = 2**63 - 1
"""Largest magnitude of an integer value (a 64-bit integer), however it is written: no setting takes a larger one."""
INT_WIDTHS = {2: 63, 8: 21, 10: 19, 16: 16}
"""Digits (leading zeros aside) a base needs for MAX_INT: more cannot be in range, so they are never converted."""
SEXAGESIMAL_DIGITS = 2
INT_TAG = "tag:yaml.org,2002:int"


class _Yaml12Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser when PyYAML has it: ~10x faster
    """SafeLoader with YAML 1.2 booleans and exponents: only true/false are booleans, so a rule's `on:` key stays the word
    `on`; `1e-3` is a number, as a person writing a learning rate means (YAML 1.1 would give the string '1e-3')."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Yaml12Loader.add_implicit_resolver(  # YAML 1.2 exponents: `1e-3` and `3e4` are numbers (1.1 needs a dot and a signed exponent)
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"), list("-+.0123456789"))


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
    """Parse front matter; return the mapping and the line of every key path.

    The result is shared between callers (a file many others extend is parsed once): treat it as read-only."""
    return _parse_yaml(str(path), front, first_line)


@functools.lru_cache(maxsize=256)
def _parse_yaml(name: str, front: str, first_line: int) -> tuple[dict[str, Any], dict[tuple, int]]:
    path = Path(name)
    loader = _Yaml12Loader(front)
    try:
        _check_depth(path, front, first_line)  # before composing: libyaml's composer recurses per level and would crash
        node = loader.get_single_node()  # parsed once: the node tree gives the lines, then the values
        if node is not None:
            check_bounds(path, node, first_line)
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


def _check_depth(path: Path, front: str, first_line: int) -> None:
    """Refuse nesting deeper than MAX_YAML_DEPTH from the event stream, which libyaml produces without recursing."""
    events = _Yaml12Loader(front)
    depth = 0
    try:
        while (event := events.get_event()) is not None and not isinstance(event, yaml.StreamEndEvent):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    line = first_line + event.start_mark.line
                    raise ConfigError(f"{path}:{line}: the front matter nests deeper than {MAX_YAML_DEPTH} levels; flatten it")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.MarkedYAMLError as e:  # newer libyaml scans ahead and stops very deep flow nesting itself: said the same way
        if "nesting depth" not in str(e.problem or ""):
            raise
        mark = e.problem_mark or e.context_mark
        line = first_line + (mark.line if mark else 0)
        raise ConfigError(f"{path}:{line}: the front matter nests deeper than {MAX_YAML_DEPTH} levels; flatten it") from e
    finally:
        events.dispose()


def check_bounds(path: Path, root: yaml.Node, first_line: int) -> None:
    """Refuse a node graph over the limits, walking at most MAX_YAML_NODES nodes (aliases walked again, as they expand)."""
    stack = [(root, 1)]
    counted = 1  # nodes counted when pushed, so one node of many aliases cannot fill the stack past the limit
    while stack:
        node, depth = stack.pop()
        line = first_line + node.start_mark.line
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(f"{path}:{line}: the front matter nests deeper than {MAX_YAML_DEPTH} levels; flatten it")
        if isinstance(node, yaml.ScalarNode):
            if node.tag == INT_TAG and yaml_int(node.value) is None:
                shown = node.value if len(node.value) <= 24 else node.value[:20] + "..."
                raise ConfigError(f"{path}:{line}: {shown!r} is not an integer within ±{MAX_INT} (64 bits); "
                                  "no setting takes a larger one")
            continue
        children = [child for pair in node.value for child in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        counted += len(children)
        if counted > MAX_YAML_NODES:
            raise ConfigError(
                f"{path}:{line}: the front matter expands to more than {MAX_YAML_NODES} values (anchors and aliases "
                "count each time they are used); write the recipe out plainly"
            )
        stack += [(child, depth + 1) for child in children]


def yaml_int(text: str) -> int | None:
    """The value of a YAML 1.1 integer (sign, `_` groups, `0b`, `0x`, leading-`0` octal, base 60 as `1:30`), or None when
    `text` is not one or lies beyond ±MAX_INT. Never converts more digits than MAX_INT has: each step costs a few digits."""
    body = text.replace("_", "")
    sign = -1 if body.startswith("-") else 1
    body = body[1:] if body[:1] in ("-", "+") else body
    if ":" in body:  # base 60: `1:30` is 90; the first group may be any width, the others 0..59
        first, *rest = body.split(":")
        value = _in_base(first, 10)
        for group in rest:
            if value is None or len(group) > SEXAGESIMAL_DIGITS or (digit := _in_base(group, 10)) is None or digit >= 60:
                return None
            value = value * 60 + digit
            if value > MAX_INT:
                return None
    else:
        base = {"0b": 2, "0x": 16}.get(body[:2].lower(), 8 if len(body) > 1 and body.startswith("0") else 10)
        value = _in_base(body[2:] if base in (2, 16) else body, base)
    return None if value is None or value > MAX_INT else sign * value


def _in_base(digits: str, base: int) -> int | None:
    significant = digits.lstrip("0") or ("0" if digits else "")
    if not significant or len(significant) > INT_WIDTHS[base] or not significant.isascii():
        return None
    try:
        return int(significant, base)
    except ValueError:
        return None


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
