"""Safe HTML for the cells of one dataset row: Podium's sample view.

Each cell gets a kind (null, number, json, xml, chat, code, text) and is rendered so that the
defects one looks for by eye stand out: JSON and XML carry a badge computed on the full value,
with the parser's error line marked in the text; long cells are cut at a character limit.
Everything taken from the data is escaped; only this module's own tags are trusted markup.
"""

from __future__ import annotations

import json
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePosixPath
from xml.dom import minidom
from xml.etree import ElementTree
from xml.parsers.expat import ExpatError

from markupsafe import Markup, escape
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import PythonLexer, get_lexer_for_filename
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

CELL_LIMIT = 20_000  # characters shown before "show all"
FOLD_LINES = 40  # text longer than this (or FOLD_CHARS) shows this many lines, the rest folded
FOLD_CHARS = 4_000
CODE_COLUMNS = frozenset({"code", "function", "program", "source_code", "solution", "snippet"})
SOURCE_COLUMNS = frozenset({"text", "content"})  # holding a file's content when the row has a `path`
CODE_MIN_LINES = 3  # the heuristic wants this many code-like lines...
CODE_MIN_SHARE = 0.3  # ...making up this share of the non-blank lines
CODE_STARTS = re.compile(r"\s*(def |class |import |from \S+ import |return\b|#include\b|function\b)")
CODE_ENDS = ("{", "}", ";")
# The start of a JSON object or array (truncated ones included), not of "[INST]", "{{ var }}" or "[link](url)".
JSON_START = re.compile(r"""\s*(\{\s*(["'}]|\Z)|\[\s*(["'\[{\]\d-]|true\b|false\b|null\b|\Z))""")
# An element, a declaration or a comment; not a chat-template token such as "<|im_start|>".
XML_START = re.compile(r"\s*<[A-Za-z_?!]")
XML_REFUSED = re.compile(r"<!(DOCTYPE|ENTITY)", re.IGNORECASE)  # entity expansion (billion laughs) never starts
XML_POSITION = re.compile(r": line \d+, column \d+$")  # ParseError repeats the position we report ourselves
NOT_IN_CLASS = re.compile(r"[^a-z0-9_-]")
FORMATTER = HtmlFormatter(cssclass="code", nowrap=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class Badge:
    """Whether a JSON or XML cell parses, and where it fails."""

    ok: bool
    label: str
    """"valid JSON", "invalid JSON", "valid XML" or "invalid XML"."""
    message: str = ""
    """For invalid: "line L, column C: <parser message>" (no position when the parser gives none)."""
    line: int | None = None
    """1-based line of the error."""
    column: int | None = None
    """1-based column of the error."""


VALID_JSON = Badge(ok=True, label="valid JSON")
VALID_XML = Badge(ok=True, label="valid XML")


@dataclass(frozen=True, kw_only=True, slots=True)
class Field:
    """One cell of the sample view, rendered."""

    name: str
    """Column name, or "conversation" for a merged prompt/completion pair; plain text, the page escapes it."""
    kind: str
    """One of "null", "number", "json", "xml", "chat", "code", "text"."""
    html: Markup
    """Safe HTML fragment: everything from the data escaped."""
    badge: Badge | None
    """Parse result of a json/xml cell (and of a chat held as JSON), computed on the full value."""
    truncated: bool
    """True when the value was cut at `limit` characters."""
    length: int
    """Characters in the full value (0 for null/number)."""


def kind_of(column: str, value: object, row: Mapping[str, object]) -> str:
    """The kind `value` renders as: null, number, json, xml, chat, code or text.

    First match wins: the value's type (None, number, list/dict); the column name ("json" in it
    or "metadata"; "xml" in it; CODE_COLUMNS); a JSON-looking start; a text/content column of a
    row whose `path` names a source file; an XML-looking text; the code-line heuristic.
    """
    if value is None:
        return "null"
    if isinstance(value, numbers.Number):
        return "number"
    if isinstance(value, (list, tuple, dict)):
        return "chat" if _turns(value) else "json"
    text, name = _as_text(value), column.lower()
    if "json" in name or name == "metadata":
        return _json_kind(text)
    if "xml" in name:
        return "xml"
    if name in CODE_COLUMNS:
        return "code"
    if JSON_START.match(text):
        return _json_kind(text)
    if name in SOURCE_COLUMNS and _path_lexer(row):
        return "code"
    if XML_START.match(text) and text.rstrip().endswith(">"):
        return "xml"
    return "code" if _looks_like_code(text) else "text"


def json_badge(text: str) -> Badge:
    """Whether `text` is JSON (NaN and Infinity refused, as strict parsers do), with the error's position."""
    return _load_json(text)[0]


def xml_badge(text: str) -> Badge:
    """Whether `text` is well-formed XML; a DOCTYPE or entity declaration is refused without parsing."""
    refused = XML_REFUSED.search(text)
    if refused:
        line, column = _position(text, refused.start())
        return _invalid("invalid XML", "DOCTYPE/entities are not parsed", line, column)
    try:
        ElementTree.fromstring(text)
    except ElementTree.ParseError as e:
        line, offset = e.position  # expat counts columns from 0
        return _invalid("invalid XML", XML_POSITION.sub("", str(e)), line, offset + 1)
    return VALID_XML


def render_row(row: Mapping[str, object], *, limit: int = CELL_LIMIT, full: frozenset[str] = frozenset()) -> list[Field]:
    """The row's cells in column order, after a "conversation" when the row has prompt and completion texts.

    Values longer than `limit` characters are cut, except in the columns named in `full`.
    """
    fields = []
    prompt, completion = row.get("prompt"), row.get("completion")
    if isinstance(prompt, (str, bytes)) and isinstance(completion, (str, bytes)):
        fields.append(_conversation(_as_text(prompt), _as_text(completion), None if "conversation" in full else limit))
    for column, value in row.items():
        fields.append(_render_cell(str(column), value, row, None if column in full else limit))
    return fields


def pygments_css() -> str:
    """The CSS rules the highlighted code needs, scoped under `.code`."""
    rules = HtmlFormatter(style="default").get_style_defs(".code").splitlines()
    return "\n".join(rule for rule in rules if rule.startswith(".code"))  # pygments adds bare `pre`/`linenos` rules


def _render_cell(column: str, value: object, row: Mapping[str, object], limit: int | None) -> Field:
    kind = kind_of(column, value, row)
    if kind in ("null", "number"):
        html = Markup('<span class="{}">{}</span>').format(kind, "null" if value is None else value)
        return Field(name=column, kind=kind, html=html, badge=None, truncated=False, length=0)
    text = _as_text(value)
    badge: Badge | None = None
    if kind == "chat":
        badge, data = _json_of(value, text)
        html, truncated = _chat_html(_turns(data) or [], limit)
        return Field(name=column, kind=kind, html=html, badge=badge, truncated=truncated, length=len(text))
    shown = text if limit is None else text[:limit]
    truncated = len(shown) < len(text)
    if kind == "json":
        badge, data = _json_of(value, text)
        pretty = _pretty_json(data, shown) if badge.ok and not truncated else shown
        html = Markup('<pre class="json">{}</pre>').format(_marked(pretty, badge.line, badge.column))
    elif kind == "xml":
        badge = xml_badge(text)
        pretty = _pretty_xml(shown) if badge.ok and not truncated else shown
        html = Markup('<pre class="xml">{}</pre>').format(_marked(pretty, badge.line, badge.column))
    elif kind == "code":
        html = Markup(highlight(shown, _path_lexer(row) or PythonLexer(stripnl=False), FORMATTER))  # pygments escapes
    else:
        html = _text_html(shown)
    return Field(name=column, kind=kind, html=html, badge=badge, truncated=truncated, length=len(text))


def _as_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, (list, tuple, dict)):  # Arrow list/struct/map columns
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def _invalid(label: str, message: str, line: int | None = None, column: int | None = None) -> Badge:
    where = "" if line is None else f"line {line}, column {column}: "
    return Badge(ok=False, label=label, message=where + message, line=line, column=column)


def _load_json(text: str) -> tuple[Badge, object]:
    try:
        return VALID_JSON, json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        return _invalid("invalid JSON", e.msg, e.lineno, e.colno), None
    except (ValueError, RecursionError) as e:  # NaN/Infinity, an integer past the digit limit, nesting too deep
        return _invalid("invalid JSON", str(e)), None


def _json_of(value: object, text: str) -> tuple[Badge, object]:
    """Badge and data of a json/chat cell: a list or dict is valid as it stands, a text is parsed."""
    return (VALID_JSON, value) if isinstance(value, (list, tuple, dict)) else _load_json(text)


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


def _json_kind(text: str) -> str:
    chat = '"role"' in text and '"content"' in text and _turns(_load_json(text)[1])  # parse only what may be a chat
    return "chat" if chat else "json"


def _turns(data: object) -> list[tuple[str, object]] | None:
    """(role, content) of a list of messages, or of an object's "messages" list; None for anything else."""
    if isinstance(data, dict):
        data = data.get("messages")
    if not isinstance(data, (list, tuple)) or not data:
        return None
    if not all(isinstance(m, dict) and "role" in m and "content" in m for m in data):
        return None
    return [(str(m["role"]), m["content"]) for m in data]


def _path_lexer(row: Mapping[str, object]) -> Lexer | None:
    path = row.get("path")
    if not isinstance(path, (str, bytes)) or not path:
        return None
    return _lexer_for_name(PurePosixPath(_as_text(path)).name)


@lru_cache(maxsize=256)
def _lexer_for_name(name: str) -> Lexer | None:
    """The lexer pygments picks for a file name; None when it knows none but plain text."""
    try:
        lexer = get_lexer_for_filename(name, stripnl=False)
    except ClassNotFound:
        return None
    return None if isinstance(lexer, TextLexer) else lexer


def _looks_like_code(text: str) -> bool:
    """At least CODE_MIN_LINES lines, and CODE_MIN_SHARE of the non-blank ones, open with a keyword or end in { } ;."""
    lines = [line for line in text.split("\n") if line.strip()]
    hits = sum(1 for line in lines if CODE_STARTS.match(line) or line.rstrip().endswith(CODE_ENDS))
    return hits >= CODE_MIN_LINES and hits >= CODE_MIN_SHARE * len(lines)


def _pretty_json(data: object, text: str) -> str:
    try:
        return json.dumps(data, indent=2, ensure_ascii=False, default=str)
    except RecursionError:  # deeper than the pure-Python encoder (used with indent) walks: show it as it came
        return text


def _pretty_xml(text: str) -> str:
    try:
        root = minidom.parseString(text).documentElement
        _drop_blank_text(root)
        return root.toprettyxml(indent="  ").rstrip("\n")
    except (ExpatError, RecursionError):  # minidom walks the tree recursively; show it as it came
        return text


def _drop_blank_text(node: minidom.Node) -> None:
    """Remove whitespace-only text, which toprettyxml would print again next to its own indentation."""
    for child in list(node.childNodes):
        if child.nodeType == child.TEXT_NODE and not child.data.strip():
            node.removeChild(child)
        else:
            _drop_blank_text(child)


def _position(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of `index` in `text`."""
    return text.count("\n", 0, index) + 1, index - text.rfind("\n", 0, index)


def _marked(text: str, line: int | None, column: int | None) -> Markup:
    """`text` escaped, its line `line` in <mark> with a caret under `column`, when that line is shown."""
    lines = text.split("\n")  # as the parsers count lines
    if line is None or not 1 <= line <= len(lines):
        return escape(text)
    at = lines[line - 1]
    indent = "".join(c if c == "\t" else " " for c in at[: (column or 1) - 1])  # tabs kept so the caret lines up
    marked = Markup('<mark>{}</mark>\n<span class="caret">{}^</span>').format(at, indent)
    return Markup("\n").join([*lines[: line - 1], marked, *lines[line:]])


def _text_html(text: str) -> Markup:
    lines = text.split("\n")
    if len(lines) <= FOLD_LINES and len(text) <= FOLD_CHARS:
        return Markup('<div class="text">{}</div>').format(text)
    head = "\n".join(lines[:FOLD_LINES])[:FOLD_CHARS]
    rest = text[len(head):].removeprefix("\n")
    if not rest:
        return Markup('<div class="text">{}</div>').format(text)
    more = rest.count("\n") + (not rest.endswith("\n"))
    summary = f"{more} more line" + ("" if more == 1 else "s")
    return Markup('<div class="text">{}<details><summary>{}</summary>{}</details></div>').format(head, summary, rest)


def _chat_html(turns: list[tuple[str, object]], limit: int | None) -> tuple[Markup, bool]:
    """The turns as divs, their contents cut once `limit` characters are shown; and whether any was cut."""
    parts = []
    for role, content in turns:
        text = content if isinstance(content, str) else "" if content is None else _pretty_json(content, str(content))
        if limit is not None and len(text) > limit:
            if limit:
                parts.append(_turn_html(role, text[:limit]))
            return Markup('<div class="chat">{}</div>').format(Markup("").join(parts)), True
        parts.append(_turn_html(role, text))
        limit = None if limit is None else limit - len(text)
    return Markup('<div class="chat">{}</div>').format(Markup("").join(parts)), False


def _turn_html(role: str, text: str) -> Markup:
    css = NOT_IN_CLASS.sub("-", role.lower())
    return Markup('<div class="turn role-{}"><div class="role">{}</div><div class="content">{}</div></div>').format(css, role, text)


def _conversation(prompt: str, completion: str, limit: int | None) -> Field:
    html, truncated = _chat_html([("user", prompt), ("assistant", completion)], limit)
    return Field(name="conversation", kind="chat", html=html, badge=None, truncated=truncated, length=len(prompt) + len(completion))
