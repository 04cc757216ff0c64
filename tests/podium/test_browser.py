"""Podium in a real headless Chromium (Debian's, driven by Playwright): what a person does to inspect data.

`factory podium` runs as a subprocess on the test store. Screenshots go to .test-artifacts/podium/.
"""

import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from tests.ports import free_port, serving, stopped

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / ".test-artifacts" / "podium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
START_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    """`factory podium` on the test store; yields its address."""
    port = free_port()
    log = tmp_path_factory.mktemp("podium-server") / "podium.log"
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "factory", "podium", "--root", str(store), "--port", str(port)],
                                   cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        home = lambda: urllib.request.urlopen(base + "/", timeout=5).close() or True  # noqa: E731
        if not serving(home, process, START_TIMEOUT_S, 0.2, (urllib.error.URLError, ConnectionError)):
            pytest.fail(f"factory podium did not start:\n{log.read_text()}")
        yield base
    finally:
        stopped(process, 30)


@pytest.fixture(scope="module")
def chromium():
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is not installed: `make test` installs it (make browser)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium, server):
    """A fresh page; any JavaScript dialog (an injected alert) fails the test."""
    context = chromium.new_context(base_url=server, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    yield page
    context.close()
    assert not dialogs, f"a script ran in the page: {dialogs}"


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=False)


def test_open_a_table_filter_and_open_a_broken_sample(page):
    page.goto("/")
    page.get_by_role("link", name="sft.samples").click()
    expect(page.locator("h1")).to_have_text("sft.samples")
    expect(page.locator("#summary")).to_contain_text("rows 1–50 of 131")
    shot(page, "table")
    page.select_option("#new-filter-column", "label")
    page.select_option("#new-filter-operator", "=")
    page.fill("#new-filter-value", "broken")
    page.click("#apply")
    # Version 2 fixed sample 1; the broken one is in v1. Time travel to it with the snapshot picker.
    expect(page.locator("#summary")).to_contain_text("no rows")
    page.select_option("#snapshot", page.locator("#snapshot option", has_text="· v1").get_attribute("value"))
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#summary")).to_contain_text("rows 1–50 of 130")
    page.select_option("#new-filter-column", "label")
    page.select_option("#new-filter-operator", "=")
    page.fill("#new-filter-value", "broken")
    page.click("#apply")
    expect(page.locator("#summary")).to_contain_text("rows 1–1 of 1 (filtered from 130)")
    shot(page, "filtered")
    page.locator("a.open-row").first.click()
    metadata = page.locator("#field-metadata")
    expect(metadata.locator(".badge")).to_have_text("invalid JSON")
    expect(metadata).to_contain_text("line 1")
    expect(page.locator("#field-conversation .turn")).to_have_count(2)
    shot(page, "sample-invalid-json")
    page.locator("#prev").click()
    expect(page.locator("#field-metadata .badge")).to_have_text("valid JSON")


def test_hostile_cells_render_as_text(page):
    page.goto("/t/sft.samples/row/2")
    expect(page.locator("#field-prompt")).to_contain_text("<script>alert('cell')</script>")
    expect(page.locator("#field-completion")).to_contain_text('"><img src=x onerror=alert(1)>')
    assert page.locator("main script, main img").count() == 0
    page.goto("/t/sft.samples?col=prompt&col=completion")
    expect(page.locator("#rows")).to_contain_text("<script>alert('cell')</script>")
    assert page.locator("main script, main img").count() == 0


def test_a_huge_cell_is_cut_until_asked(page):
    page.goto("/t/sft.samples/row/3")
    prompt = page.locator("#field-prompt")
    expect(prompt).to_contain_text("60000 characters")
    assert len(prompt.locator(".body").text_content()) < 30_000
    prompt.locator("a.show-all").click()
    expect(page).to_have_url(re.compile(r"[?&]full=prompt"))  # the link loads another page: read its field, not this one's
    expect(prompt.locator(".cut")).to_have_count(0)
    assert len(prompt.locator(".body").text_content()) >= 60_000


def test_generate_from_a_sample_side_by_side_and_save_the_prompt(page):
    page.goto("/t/sft.samples/row/0")
    page.click("#generate-from-sample")
    expect(page.locator("#prompt")).to_have_value(re.compile(r"^def add\(a, b\):"))
    boxes = page.locator("label.candidate input")
    expect(boxes).to_have_count(2)
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.fill("input[name=new_tokens]", "8")
    page.click("#generate")
    completions = page.locator("#completions .completion")
    expect(completions).to_have_count(2)
    expect(completions.nth(0)).to_contain_text("pretrain step 10")
    expect(completions.nth(1)).to_contain_text("pretrain step 10")
    written = [completions.nth(i).locator("pre.content strong").inner_text() for i in range(2)]
    assert written[0] != written[1], "two checkpoints of different weights write different text"
    shot(page, "generate")
    page.fill("#note", "a sample the model gets wrong")
    page.click("#save-prompt")
    expect(page.locator("h1")).to_have_text("podium.custom_prompts")
    expect(page.locator("#saved")).to_contain_text("podium.custom_prompts@v")
    expect(page.locator("#rows")).to_contain_text("a sample the model gets wrong")
    expect(page.locator("#rows")).to_contain_text("sft.samples@")
    shot(page, "custom-prompts")


def test_sql_box_and_diff(page):
    page.goto("/t/sft.samples/sql")
    page.fill("#sql-text", "SELECT label, count(*) AS n FROM t WHERE score >= ? GROUP BY label ORDER BY n DESC")
    page.fill("#sql-params", "[0]")
    page.click("#run-sql")
    expect(page.locator("#sql-rows")).to_contain_text("hostile")
    shot(page, "sql")
    page.fill("#sql-text", "SELECT * FROM read_text('/etc/passwd')")
    page.click("#run-sql")
    expect(page.locator("#error")).to_contain_text("disabled")
    expect(page.locator("body")).not_to_contain_text("root:")
    page.goto("/t/sft.samples/diff")
    expect(page.locator("#diff-summary")).to_contain_text("3 rows added, 2 rows removed")
    shot(page, "diff")
