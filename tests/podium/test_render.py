"""Sample-view rendering: kinds, JSON/XML badges with the error marked, chats, code, folding, truncation, escaping."""

import json
import re

import pytest
from markupsafe import Markup, escape

from factory.podium.render import Badge, json_badge, kind_of, pygments_css, render_row, xml_badge

SCRIPT = "<script>alert(1)</script>"
ATTRIBUTE = '"><img src=x onerror=alert(1)>'
CHAT = [{"role": "user", "content": "hi\nthere"}, {"role": "assistant", "content": "hello"}]
PYTHON = "import os\n\ndef f(x):\n    return x\n\nclass A:\n    pass\n"


def field(row, column, **options):
    return next(f for f in render_row(row, **options) if f.name == column)


def shown_text(html: str) -> str:
    """What a browser shows, still escaped: the tags removed (pygments splits `<script>` over several spans)."""
    return re.sub(r"<[^>]*>", "", html)


@pytest.mark.parametrize(("column", "value", "row", "kind"), [
    ("x", None, {}, "null"),
    ("x", 3, {}, "number"),
    ("x", 2.5, {}, "number"),
    ("x", True, {}, "number"),
    ("x", '{"a": 1}', {}, "json"),
    ("x", '  [1, 2]\n', {}, "json"),
    ("x", '{"a": [1, 2', {}, "json"),
    ("x", b'{"a": 1}', {}, "json"),
    ("payload_json", "not json at all", {}, "json"),
    ("metadata", "plain words", {}, "json"),
    ("x", {"a": 1}, {}, "json"),
    ("x", [1, 2], {}, "json"),
    ("x", json.dumps(CHAT), {}, "chat"),
    ("x", json.dumps({"messages": CHAT}), {}, "chat"),
    ("x", CHAT, {}, "chat"),
    ("x", json.dumps([{"role": "user"}]), {}, "json"),
    ("x", "<a><b/></a>", {}, "xml"),
    ("x", "  <a>\n</a>\n", {}, "xml"),
    ("doc_xml", "hello", {}, "xml"),
    ("code", "x = 1", {}, "code"),
    ("solution", "print(1)", {}, "code"),
    ("content", "x = 1", {"path": "src/a.py"}, "code"),
    ("text", "x = 1", {"path": "lib/a.js"}, "code"),
    ("content", "hello", {"path": "notes.txt"}, "text"),
    ("content", "hello", {"path": "LICENSE"}, "text"),
    ("title", "x = 1", {"path": "a.py"}, "text"),
    ("x", PYTHON, {}, "code"),
    ("x", "int main() {\n  int a = 1;\n  return a;\n}\n", {}, "code"),
    ("x", "Hello world.\nA second line; and more.\nThe end.", {}, "text"),
    ("x", "First point;\nsecond point;\nand that is all.", {}, "text"),
    ("x", "[INST] hi [/INST] hello", {}, "text"),
    ("x", "{{ name }} says hi", {}, "text"),
    ("x", "<|im_start|>user hi<|im_end|>", {}, "text"),
])
def test_kind_of(column, value, row, kind):
    assert kind_of(column, value, {column: value, **row}) == kind


def test_valid_json_is_pretty_printed_with_a_valid_badge():
    data = {"a": 1, "b": [1, "é"]}
    cell = field({"d": json.dumps(data, separators=(",", ":"))}, "d")
    assert cell.badge == Badge(ok=True, label="valid JSON")
    assert cell.html == Markup('<pre class="json">{}</pre>').format(json.dumps(data, indent=2, ensure_ascii=False))
    assert "\n  &#34;b&#34;: [" in cell.html


def test_invalid_json_badge_has_position_and_the_line_is_marked():
    text = '{"a": 1,\n "b" 2}'
    badge = json_badge(text)
    assert (badge.ok, badge.label, badge.line, badge.column) == (False, "invalid JSON", 2, 6)
    assert badge.message == "line 2, column 6: Expecting ':' delimiter"
    cell = field({"d": text}, "d")
    assert cell.badge == badge
    assert cell.html == Markup('<pre class="json">{&#34;a&#34;: 1,\n<mark> &#34;b&#34; 2}</mark>\n<span class="caret">     ^</span></pre>')


def test_json_constants_and_runaway_input_are_invalid_without_crashing():
    assert json_badge('{"a": NaN}').message == "NaN is not valid JSON"
    assert not json_badge("1" * 5000).ok
    assert not json_badge("[" * 100_000).ok


def test_cut_json_keeps_the_badge_of_the_full_text_and_shows_the_raw_cut():
    text = json.dumps({"xs": list(range(100))})
    cell = field({"d": text}, "d", limit=50)
    assert (cell.truncated, cell.length, cell.badge) == (True, len(text), Badge(ok=True, label="valid JSON"))
    assert cell.html == Markup('<pre class="json">{}</pre>').format(text[:50])
    whole = field({"d": text}, "d", limit=50, full=frozenset({"d"}))
    assert not whole.truncated and "\n  &#34;xs&#34;: [\n    0," in whole.html


def test_arrow_lists_and_structs_render_as_valid_json():
    cell = field({"s": {"a": [1, 2], "b": None}}, "s")
    assert (cell.kind, cell.badge.ok, cell.length) == ("json", True, len('{"a": [1, 2], "b": null}'))
    assert "\n  &#34;b&#34;: null\n" in cell.html


def test_valid_xml_is_pretty_printed_keeping_comments_and_prefixes():
    cell = field({"x": '<a><b k="1">t</b><!-- c --><n:c xmlns:n="u"/></a>'}, "x")
    assert cell.badge == Badge(ok=True, label="valid XML")
    assert cell.html == Markup('<pre class="xml">{}</pre>').format('<a>\n  <b k="1">t</b>\n  <!-- c -->\n  <n:c xmlns:n="u"/>\n</a>')


def test_invalid_xml_badge_has_position_and_the_line_is_marked():
    badge = xml_badge("<a>\n  <b></a>")
    assert (badge.ok, badge.label, badge.line, badge.column) == (False, "invalid XML", 2, 8)
    assert badge.message == "line 2, column 8: mismatched tag"
    cell = field({"x": "<a>\n  <b></a>"}, "x")
    assert "<mark>  &lt;b&gt;&lt;/a&gt;</mark>\n" in cell.html and '<span class="caret">       ^</span>' in cell.html


@pytest.mark.parametrize("text", [
    '<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]><lolz>&lol2;</lolz>',
    '<!ENTITY x "y"><a/>',
])
def test_doctype_and_entities_are_refused_unparsed(text):
    badge = xml_badge(text)
    assert not badge.ok and badge.message.endswith("DOCTYPE/entities are not parsed")
    assert "lollol" not in field({"x": text}, "x").html


def test_chat_from_a_messages_json():
    cell = field({"m": json.dumps({"messages": CHAT})}, "m")
    assert (cell.kind, cell.badge.ok) == ("chat", True)
    assert cell.html == Markup(
        '<div class="chat">'
        '<div class="turn role-user"><div class="role">user</div><div class="content">hi\nthere</div></div>'
        '<div class="turn role-assistant"><div class="role">assistant</div><div class="content">hello</div></div>'
        '</div>')


def test_prompt_and_completion_make_a_conversation_first():
    fields = render_row({"id": 7, "prompt": "Q?", "completion": "A."})
    assert [(f.name, f.kind) for f in fields] == [("conversation", "chat"), ("id", "number"), ("prompt", "text"), ("completion", "text")]
    html = fields[0].html
    user, assistant = '<div class="content">Q?</div>', '<div class="content">A.</div>'
    assert html.index('<div class="role">user</div>' + user) < html.index('<div class="role">assistant</div>' + assistant)
    assert [f.name for f in render_row({"prompt": "Q?", "answer": "A."})] == ["prompt", "answer"]


def test_conversation_is_cut_across_turns():
    conversation = render_row({"prompt": "p" * 15, "completion": "c" * 10}, limit=20)[0]
    assert (conversation.truncated, conversation.length) == (True, 25)
    assert '<div class="content">' + "c" * 5 + "</div>" in conversation.html
    assert not render_row({"prompt": "p" * 15, "completion": "c" * 10}, limit=20, full=frozenset({"conversation"}))[0].truncated


def test_code_is_highlighted_with_the_lexer_of_the_path():
    js = field({"path": "x.js", "content": "const f = 1;"}, "content")
    py = field({"path": "x.py", "content": "const f = 1;"}, "content")
    assert js.html.startswith('<div class="code"><pre>') and '<span class="kd">const</span>' in js.html
    assert '<span class="kd">' not in py.html and '<span class="n">const</span>' in py.html
    assert '<span class="k">def</span>' in field({"code": PYTHON}, "code").html


def test_long_text_is_folded():
    lines = [f"line {i}" for i in range(50)]
    html = field({"t": "\n".join(lines)}, "t").html
    assert html == Markup('<div class="text">{}<details><summary>10 more lines</summary>{}</details></div>').format(
        "\n".join(lines[:40]), "\n".join(lines[40:]))
    assert "<details>" in field({"t": "w" * 5000}, "t").html
    assert field({"t": "\n".join(lines[:40])}, "t").html == Markup('<div class="text">{}</div>').format("\n".join(lines[:40]))


def test_long_values_are_cut_unless_shown_in_full():
    cell = field({"t": "x" * 30}, "t", limit=10)
    assert (cell.truncated, cell.length) == (True, 30)
    assert "x" * 10 in cell.html and "x" * 11 not in cell.html
    whole = field({"t": "x" * 30}, "t", limit=10, full=frozenset({"t"}))
    assert (whole.truncated, whole.length) == (False, 30) and "x" * 30 in whole.html
    assert [(f.truncated, f.length) for f in render_row({"n": None, "i": 10**30}, limit=5)] == [(False, 0), (False, 0)]


def test_bytes_are_decoded_with_replacement():
    cell = field({"b": b"caf\xc3\xa9 \xff"}, "b")
    assert (cell.kind, cell.html) == ("text", Markup('<div class="text">café \ufffd</div>'))


@pytest.mark.parametrize(("row", "column", "kind"), [
    ({"t": "look: " + SCRIPT + ATTRIBUTE}, "t", "text"),
    ({"t": ("look: " + SCRIPT + ATTRIBUTE + "\n") * 60}, "t", "text"),
    ({"code": SCRIPT + ATTRIBUTE}, "code", "code"),
    ({"path": "x.html", "content": SCRIPT + ATTRIBUTE}, "content", "code"),
    ({"j": json.dumps({SCRIPT: ATTRIBUTE})}, "j", "json"),
    ({"j": json.dumps([SCRIPT, ATTRIBUTE])}, "j", "json"),
    ({"j": json.dumps([SCRIPT, ATTRIBUTE])[:30]}, "j", "json"),
    ({"j_json": SCRIPT + ATTRIBUTE}, "j_json", "json"),
    ({"s": {"k": [SCRIPT, ATTRIBUTE]}}, "s", "json"),
    ({"x": "<a>" + SCRIPT + '<b k="&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"/></a>'}, "x", "xml"),
    ({"x": "<a>" + SCRIPT + ATTRIBUTE}, "x", "xml"),
    ({"m": json.dumps([{"role": ATTRIBUTE, "content": SCRIPT}])}, "m", "chat"),
    ({"m": [{"role": SCRIPT, "content": [ATTRIBUTE]}]}, "m", "chat"),
    ({"prompt": SCRIPT, "completion": ATTRIBUTE}, "conversation", "chat"),
    ({SCRIPT: "look: " + SCRIPT + ATTRIBUTE}, SCRIPT, "text"),
])
def test_data_is_escaped_in_every_kind(row, column, kind):
    cell = field(row, column)
    assert cell.kind == kind
    assert "<script>" not in cell.html and "<img" not in cell.html
    assert "&lt;script&gt;" in shown_text(cell.html)
    assert type(cell.name) is str  # a plain str: the page's autoescape escapes the column name


def test_field_html_is_markup_so_templates_do_not_escape_it_twice():
    assert all(isinstance(f.html, Markup) for f in render_row({"a": None, "b": 1, "c": "x", "d": "{}", "e": "<a/>", "code": "x"}))
    assert escape(field({"c": "<"}, "c").html) == Markup('<div class="text">&lt;</div>')


def test_pygments_css_is_scoped_under_code():
    css = pygments_css()
    assert ".code .k {" in css
    assert all(rule.startswith(".code") for rule in css.splitlines())
