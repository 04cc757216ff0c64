"""`make ui`: `dagster dev` on the run's instance serves the lineage, the partition and the metadata."""

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.ports import free_port, serving

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 180
QUERY = """
{
  assetNodes { assetKey { path } dependencyKeys { path } isPartitioned }
  assetOrError(assetKey: {path: ["model"]}) {
    ... on Asset { assetMaterializations(limit: 1) { partition metadataEntries { label } } }
  }
}
"""


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["data"]


@pytest.fixture(scope="module")
def ui(pipeline, tmp_path_factory):
    """`factory ui` (what `make ui` runs) on a copy of the pipeline's root (its runs write there); yields its port."""
    port = free_port()
    home = tmp_path_factory.mktemp("ui")
    root = home / "root"
    shutil.copytree(pipeline["root"], root)
    log = home / "dagster-dev.log"
    # The experiment's file, outside git: the stage assets find its recipe, and the git sensor (running, as under
    # `make ui`) has no commits to start other experiments from while the test drives the UI.
    experiments = home / "experiments"
    experiments.mkdir()
    shutil.copy(pipeline["source"], experiments)
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "factory", "ui", "--root", str(root), "--port", str(port)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "FACTORY_EXPERIMENTS": str(experiments)},
        )
    try:
        listed = lambda: graphql(port, "{ assetNodes { id } }")["assetNodes"]  # noqa: E731  (the code location is served)
        if not serving(listed, process, STARTUP_TIMEOUT_S, 1, (urllib.error.URLError, ConnectionError, KeyError, TypeError)):
            pytest.fail(f"dagster dev did not serve the code location:\n{log.read_text()[-3000:]}")
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def test_ui_shows_lineage_partition_and_metadata(ui, pipeline):
    data = graphql(ui, QUERY)
    parents = {tuple(n["assetKey"]["path"])[0]: {d["path"][0] for d in n["dependencyKeys"]} for n in data["assetNodes"]}
    assert parents["best_model"] == {"leaderboard"}
    assert parents["leaderboard"] == {"evaluations"}
    assert parents["evaluations"] == {"checkpoints"}
    assert parents["model"] == {"pretrain", "sft", "rl", "tokenizer"}
    assert parents["rl"] == {"blend", "tokenizer", "pretrain", "sft", "code_exec_tasks"}
    assert parents["pretrain"] == {"blend", "tokenizer"}
    assert parents["checkpoints"] == {"pretrain", "sft", "rl"}
    assert parents["tokenizer"] == {"blend"}
    assert parents["blend"] == {"filtered_datasets"}
    assert parents["filtered_datasets"] == {"deduped_datasets"}
    assert parents["deduped_datasets"] == {"raw_datasets"}
    partitioned = {n["assetKey"]["path"][0]: n["isPartitioned"] for n in data["assetNodes"]}
    assert partitioned["evaluations"] and not partitioned["leaderboard"]
    [latest] = data["assetOrError"]["assetMaterializations"]
    assert latest["partition"] == pipeline["name"]
    labels = {entry["label"] for entry in latest["metadataEntries"]}
    assert {"digest", "git_commit", "config_hash", "summary/parameters"} <= labels


SHOTS = REPO / ".test-artifacts" / "dagster-ui"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
WAIT_MS = 60_000
"""The most any action or expectation waits for its element or state (a bound on a loaded machine, not how it waits)."""
RUN_TIMEOUT_MS = 240_000
NUX_QUERY = "op=ShouldShowNux"
"""The query Dagster's UI asks on every page before it opens its "Join the Dagster community" dialog (CommunityNux.tsx)."""
NUX_DELAY_MS = 1_000
"""How long after that answer the UI waits before opening the dialog: the test moves the page's clock past it."""
OVERLAY = ".bp5-overlay-backdrop, .bp5-dialog"
ALL_CLICKS = 10
ALL_CLICK_WAIT_MS = 6_000
"""How often the backfill's `All` buttons are clicked, and how long the launch button is given each time to enable."""


@pytest.fixture(scope="module")
def chromium(ui):
    """Debian's chromium (Playwright, no downloaded browser)."""
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is not installed: `make test` installs it (make browser)"
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def browser_page(chromium, ui):
    """A page on `dagster dev` in a fresh context: no local storage, as for a person opening the UI the first time."""
    from playwright.sync_api import expect

    context = chromium.new_context(base_url=f"http://127.0.0.1:{ui}", viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    expect.set_options(timeout=WAIT_MS)
    yield page
    expect.set_options(timeout=None)  # Playwright's default again, for the modules after this one
    context.close()


def wait_enabled(locator, timeout_ms: int) -> bool:
    """Whether `locator` is enabled within `timeout_ms`."""
    from playwright.sync_api import expect

    try:
        expect(locator).to_be_enabled(timeout=timeout_ms)
    except AssertionError:
        return False
    return True


def open_launch_dialog(page, ready) -> None:
    """Click `Materialize…` and wait until the launch dialog shows `ready`. Dagster first asks to confirm when upstream
    assets of other experiments (this one has no sft or rl) were never materialized: confirm when it asks."""
    from playwright.sync_api import expect

    page.get_by_role("button", name="Materialize…").click()
    confirm = page.get_by_role("button", name="Confirm", exact=True)
    expect(confirm.or_(ready).first).to_be_visible()
    if confirm.is_visible():
        confirm.click()
    expect(ready).to_be_visible()


def pick_partition(page, dialog, name: str) -> None:
    """Choose `name` in the launch dialog's partition selector. The selector's list re-renders while partitions load, and
    an entry found during a re-render is detached before it can be clicked: reopen the list and try again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(4):
        dialog.get_by_text("Select a partition or create one").click()
        try:
            page.locator(".dagster-popover").get_by_text(name, exact=True).first.click(timeout=10_000)
            return
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
    raise AssertionError(f"partition {name} could not be picked in the launch dialog")


@pytest.mark.browser
def test_the_ui_opens_with_no_dialog_over_the_asset_graph(browser_page):
    """A fresh instance (`nux: enabled: false` in the dagster.yaml factory writes): Dagster's UI answers that it shows no
    community dialog, and none opens once its delay is past, on the first page or on the asset graph."""
    from playwright.sync_api import expect

    page = browser_page
    page.clock.install()  # the page's timers run on: the test only moves them past NUX_DELAY_MS when it checks
    with page.expect_response(lambda response: NUX_QUERY in response.url) as nux:
        page.goto("/")
    assert nux.value.json()["data"]["shouldShowNux"] is False
    lineage = page.get_by_role("navigation").get_by_role("link", name="Lineage")  # its name is its icon's and its text: "lineage Lineage"
    expect(lineage).to_be_visible()
    page.clock.fast_forward(2 * NUX_DELAY_MS)
    expect(page.locator(OVERLAY)).to_have_count(0)
    page.screenshot(path=str(SHOTS / "first-page.png"))
    lineage.click()  # a dialog's backdrop would take this click
    for group in ("data", "pipeline", "evals", "post"):
        expect(page.locator("[class*=collapsedGroupNode]").get_by_text(group, exact=True)).to_be_visible()
    page.clock.fast_forward(2 * NUX_DELAY_MS)
    expect(page.locator(OVERLAY)).to_have_count(0)
    page.screenshot(path=str(SHOTS / "asset-graph.png"))


@pytest.mark.browser
def test_a_person_sees_the_lineage_materializes_a_partition_and_backfills_evaluations(browser_page, pipeline):
    from playwright.sync_api import expect

    page = browser_page
    # The lineage from the corpus to the leaderboard, upstream of the leaderboard and downstream of training.
    page.goto("/assets/leaderboard?view=lineage&lineageScope=upstream&lineageDepth=12")
    for name in ("raw_datasets", "deduped_datasets", "filtered_datasets", "blend", "tokenizer", "pretrain", "checkpoints", "evaluations"):
        expect(page.get_by_text(name, exact=True).first).to_be_visible()
    page.screenshot(path=str(SHOTS / "lineage.png"))
    page.goto("/assets/pretrain?view=lineage&lineageScope=downstream&lineageDepth=12")
    for name in ("model", "checkpoints", "evaluations", "leaderboard", "best_model"):
        expect(page.get_by_text(name, exact=True).first).to_be_visible()

    # Materialize the experiment's partition of `model` and wait for the run to succeed.
    page.goto("/assets/model")
    dialog = page.locator(".bp5-dialog")
    open_launch_dialog(page, dialog.get_by_text("Select a partition or create one"))
    pick_partition(page, dialog, pipeline["name"])
    page.keyboard.press("Escape")
    dialog.get_by_role("button", name="Launch 1 run").click()
    page.get_by_role("link", name="View", exact=True).first.click()
    expect(page.get_by_text(f"partition: {pipeline['name']}").first).to_be_visible()
    expect(page.get_by_text("Success", exact=True).first).to_be_visible(timeout=RUN_TIMEOUT_MS)
    page.screenshot(path=str(SHOTS / "run.png"))

    # Backfill evaluations: every checkpoint on every benchmark.
    page.goto("/assets/evaluations")
    launch = dialog.get_by_role("button", name="Launch backfill")
    open_launch_dialog(page, launch)
    # One `All` per dimension (checkpoint, benchmark). The second renders once its partitions load: wait for both. `All`
    # selects the keys the dimension has loaded when it is clicked (none yet, on a loaded machine, and the launch button
    # stays disabled), so it is clicked again until both selections hold keys: selecting all twice selects all.
    all_keys = dialog.get_by_role("button", name="All", exact=True)
    expect(all_keys).to_have_count(2)
    for _ in range(ALL_CLICKS):
        for button in all_keys.all():
            button.click()
        if wait_enabled(launch, ALL_CLICK_WAIT_MS):
            break
    expect(launch).to_be_enabled()
    launch.click()
    page.get_by_role("link", name="View", exact=True).first.click()
    expect(page.get_by_text("Succeeded", exact=True).first).to_be_visible(timeout=RUN_TIMEOUT_MS)
    page.screenshot(path=str(SHOTS / "backfill.png"))
