"""The leaderboard from the registry's evaluation results: built, published as an immutable artifact, found again."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import marshal
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from factory.config.fingerprint import code_identity, sha256_of
from factory.config.kinds import main_training_kind, model_kind
from factory.config.stages import TRAINING_STAGES
from factory.evals.base import EVALUATIONS
from factory.evals.leaderboard import Board, Entry, Row, Runs, entries_of, entry_of, merge, newest_versions, render_html, render_markdown, well_formed
from factory.atomic import write_atomic
from factory.evals import leaderboard, scored_on
from factory.registry.files import read_record
from factory.registry.layout import BEST_FILE, BOARD_FILE, HTML_FILE, MARKDOWN_FILE
from factory.registry.index import ManifestIndex, Where
from factory.registry.seam import Registry
from factory.registry.store import Manifest, Provenance

KIND = "leaderboard"
BOARD_BYTES = 256 << 20
"""A kept board larger than this is damage (a board of 100,000 experiments is about 60 MB)."""
KEPT_FORMAT = f"marshal {marshal.version}"
"""How a kept board and its entries are written (`_keep`)."""
log = logging.getLogger(__name__)
BEST_REF = "best-model"
"""The registry ref of the current best model (a published leaderboard row)."""


def current_board(registry: Registry, sort: str | None = None) -> Board:
    """Every experiment at the model it exported (or marked unfinished) from the evaluation results in the registry, with
    links to its main training's tracker run and the model it started from (`from:`), if made elsewhere.

    Kept under the registry's local root (`cache/boards/`) with the state of the registry's index it was computed at: the
    board, given again while the index holds the same manifests, and each experiment's entry (`leaderboard.Entry`).
    After a change, only the entries of the experiments it touches are computed again (their manifests asked of the
    index), then merged with the others: a new result in a registry of 100,000 manifests reads that experiment's, not
    every result. Where the index cannot say what changed (none can be kept, another index, too old a state), every
    entry is computed from the manifests."""
    index = registry.index()
    state = index.state()
    kinds = tuple(dict.fromkeys((EVALUATIONS, *TRAINING_STAGES, model_kind().name)))
    boards = registry.root / "cache" / "boards"
    cache = boards / f"{sha256_of({'sort': sort, 'kinds': kinds, 'code': _board_code()})[:24]}.kept"
    if state is not None and (board := _cached_board(cache, state)) is not None:
        return board
    kept = boards / f"entries-{sha256_of({'kinds': kinds, 'code': _board_code()})[:24]}.kept"
    state, entries = _entries(registry, index, state, kinds, kept)
    board = merge(entries.values(), sort)
    if state is not None and index.state(refresh=False) == state:  # the rows it read are still those of `state`
        with contextlib.suppress(OSError):  # a registry this process cannot write: computed again next time
            boards.mkdir(parents=True, exist_ok=True)
            _keep(cache, state, board.to_json())
            _keep(kept, state, [entry.to_json() for entry in entries.values()])
    return board


def _keep(path: Path, state: str, data: Any) -> None:
    """Keep `data` (plain JSON values) at `path`, computed at `state`: a line of JSON (the state, the format, the data's
    sha256), then the data in `marshal`'s format, which Python writes and reads several times faster than JSON (0.01 and
    0.03 s against 0.10 and 0.08 s for the entries of 5,555 experiments); a reader of another state parses only the line."""
    try:
        payload = marshal.dumps(data)
    except ValueError as e:  # a value of a type of its own (a str subclass, say), which JSON would have written as its base
        log.debug("the leaderboard at %s is not kept (%s)", path, e)
        return
    head = {"state": state, "format": KEPT_FORMAT, "sha256": hashlib.sha256(payload).hexdigest()}
    write_atomic(path, json.dumps(head).encode() + b"\n" + payload)


@functools.cache
def _board_code() -> str:
    """What computes a board (this module, the leaderboard's and what says which data a score is on): a kept board or entry
    of other code is computed again. Read once per process, when a board is first asked for, not at import."""
    return hashlib.sha256(b"".join(Path(module.__file__).read_bytes() for module in (sys.modules[__name__], leaderboard, scored_on))).hexdigest()


def _cached_board(path: Path, state: str) -> Board | None:
    """The board kept at `path` if it was computed at `state`; None when there is none, it is of another state, or damaged."""
    kept = _kept(path, state, Board.from_json)
    return kept[1] if kept is not None else None


def _kept(path: Path, state: str | None, parse: Callable[[Any], Any]) -> tuple[str, Any] | None:
    """What `_keep` wrote at `path`, parsed by `parse`, and the state it was computed at, if that is `state` (None: any);
    None when there is none, it is of another state (the rest is not parsed), or it is damaged (with a warning)."""
    try:
        first, _, rest = read_record(path, BOARD_BYTES).partition(b"\n")
        head = json.loads(first)
        if not isinstance(head, dict) or not isinstance(kept := head.get("state"), str):
            raise ValueError("it does not start with a state")
        if state not in (None, kept) or head.get("format") != KEPT_FORMAT:  # (another Python's marshal: written again)
            return None
        if hashlib.sha256(rest).hexdigest() != head.get("sha256"):  # marshal is not meant to read damaged bytes
            raise ValueError("its data is not what its sha256 says")
        return kept, parse(marshal.loads(rest))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as e:
        what = "leaderboard entries" if path.name.startswith("entries-") else "leaderboard"
        log.warning("the kept %s %s cannot be read (%s): computing it again", what, path, e)
        return None


def _entries(registry: Registry, index: ManifestIndex, state: str | None, kinds: tuple[str, ...],
             path: Path) -> tuple[str | None, dict[str, Entry]]:
    """Each experiment's entry at the index's state now, and that state: the entries kept at `path` with those the
    changes since touch computed again, or (nothing kept, or the index cannot say what changed) every one."""
    kept = _kept(path, None, lambda data: {entry.experiment: entry for entry in map(Entry.from_json, data)}) if state is not None else None
    changes = index.changes(kept[0], refresh=False) if kept is not None else None  # `state` just brought it up to date
    if changes is None:
        log.debug("leaderboard: every experiment's entry computed")
        return state, _every_entry(registry, kinds)
    state, changed = changes
    entries = kept[1]
    trainings: set[str] = set()  # the runs whose manifests, or models made from them, changed
    touched = {body["experiment"] for body in changed if body["kind"] in kinds}
    for body in changed:
        if body["kind"] in TRAINING_STAGES:
            trainings.add(body["fingerprint"])
        elif body["kind"] == model_kind().name:
            trainings.update(m.fingerprint for last in _last_training(body["inputs"])
                             for m in registry.manifests(where=Where(digest=last), refresh=False) if m.kind in TRAINING_STAGES)
    touched |= {name for name, entry in entries.items() if trainings.intersection(entry.trainings)}
    own = {name: _own(registry, name, kinds) for name in touched}
    versions: dict[str, int] = {}
    for name, entry_versions in [*((n, e.versions) for n, e in entries.items() if n not in touched),
                                 *((n, newest_versions(well_formed(m for m in manifests if m.kind == EVALUATIONS))) for n, manifests in own.items())]:
        for benchmark, version in entry_versions.items():
            versions[benchmark] = max(versions.get(benchmark, 0), version)
    stale = [name for name, entry in entries.items() if name not in touched and entry.stale(versions)]
    if 4 * (len(own) + len(stale)) > len(entries) + 40:  # a new benchmark version, say: listing every kind once is cheaper
        log.debug("leaderboard: every experiment's entry computed (%d of %d touched)", len(own) + len(stale), len(entries))
        return state, _every_entry(registry, kinds)
    log.debug("leaderboard: %d of %d experiments' entries computed again", len(own) + len(stale), len(entries))
    own |= {name: _own(registry, name, kinds) for name in stale}
    for name, manifests in own.items():
        entry = _entry(registry, name, manifests, versions)
        if entry.versions:
            entries[name] = entry
        else:
            entries.pop(name, None)
    return state, entries


def _every_entry(registry: Registry, kinds: tuple[str, ...]) -> dict[str, Entry]:
    """Every experiment's entry, from every manifest of `kinds` (each kind asked of the registry's index once)."""
    manifests = [m for kind in kinds for m in registry.manifests(kind)]
    results, urls, bases = _links(manifests)
    return entries_of(results, runs_of(manifests), urls, bases)


def _own(registry: Registry, experiment: str, kinds: tuple[str, ...]) -> list[Manifest]:
    """An experiment's manifests of `kinds`, in the order `_every_entry` reads them."""
    return [m for kind in kinds for m in registry.manifests(kind, where=Where(experiment=experiment), refresh=False)]


def _entry(registry: Registry, experiment: str, manifests: list[Manifest], versions: dict[str, int]) -> Entry:
    """An experiment's entry from its own manifests, and from the index, the runs its results name."""
    results, urls, bases = _links(manifests)
    named = {m.summary.get("training", "") for m in results} - {""}
    trained = [m for fingerprint in sorted(named) for m in registry.manifests(where=Where(fingerprint=fingerprint), refresh=False)
               if m.kind in TRAINING_STAGES]
    digests = sorted({m.digest for m in trained})
    alike = {m.fingerprint: m for digest in digests for m in registry.manifests(where=Where(digest=digest), refresh=False)
             if m.kind in TRAINING_STAGES}
    models = {m.fingerprint: m for digest in digests for m in registry.manifests(model_kind().name, where=Where(made_from=digest), refresh=False)}
    runs = runs_of([*alike.values(), *(models[name] for name in sorted(models))])
    return entry_of(experiment, results, versions, runs, urls.get(experiment, ""), bases.get(experiment, ""))


def _links(manifests: Iterable[Manifest]) -> tuple[list[Manifest], dict[str, str], dict[str, str]]:
    """Of manifests of the board's kinds: the evaluation results, each experiment's main training's newest tracker link,
    and the model each experiment started from when made elsewhere (`from:`)."""
    urls: dict[str, tuple[str, str]] = {}
    bases: dict[str, str] = {}
    results = []
    main_training = main_training_kind().name
    for manifest in manifests:
        if manifest.kind == EVALUATIONS:
            results.append(manifest)
        url = manifest.summary.get("tracker_url", "") if manifest.kind == main_training else ""
        if url and manifest.created >= urls.get(manifest.experiment, ("", ""))[0]:
            urls[manifest.experiment] = (manifest.created, url)
        if manifest.base.get("from") and manifest.base.get("model"):
            bases[manifest.experiment] = f"{manifest.base['from']} ({manifest.base['model'][:12]})"
    return results, {name: url for name, (_, url) in urls.items()}, bases


def runs_of(manifests: Iterable[Manifest]) -> Runs:
    """Which training stages published their artifact (and at which final step), and which a model stage exported: the
    model stage reads the last training stage its experiment runs (`factory.stages.model`)."""
    manifests = list(manifests)
    trainings: dict[str, list[str]] = {}  # digest -> fingerprints: stages whose bytes are identical share one digest
    for m in manifests:
        if m.kind in TRAINING_STAGES:
            trainings.setdefault(m.digest, []).append(m.fingerprint)
    steps = {m.fingerprint: m.summary["steps"] for m in manifests if m.kind in TRAINING_STAGES and isinstance(m.summary.get("steps"), int)}
    exported: dict[str, str] = {}
    models = model_kind().name
    for model in (m for m in manifests if m.kind == models):
        exported.update((fingerprint, model.digest) for digest in _last_training(model.inputs) for fingerprint in trainings.get(digest, []))
    return Runs(exported=exported, steps=steps)


def _last_training(inputs: Mapping[str, str]) -> list[str]:
    """The digest of the last training stage a model's inputs name (the weights it exported), as a list of none or one."""
    return [inputs[name] for name in TRAINING_STAGES if name in inputs][-1:]


def publish_leaderboard(registry: Registry, board: Board, commit: str) -> tuple[Manifest, str]:
    """Publish the board (JSON, Markdown, HTML); the same results give the same artifact. Returns it and its Markdown."""
    inputs = {f"{row.experiment}/{name}": digest for row in board.rows for name, digest in row.digests.items()}
    code = code_identity("local")
    fingerprint = sha256_of({"kind": KIND, "inputs": inputs, "sort": board.sort, "code": code})
    markdown = render_markdown(board)
    manifest = registry.lookup(fingerprint)
    if manifest is None:
        with registry.staging() as out:
            (out / BOARD_FILE).write_text(json.dumps(board.to_json(), indent=2, sort_keys=True))
            (out / MARKDOWN_FILE).write_text(markdown + "\n")
            (out / HTML_FILE).write_text(render_html(board))
            manifest = registry.publish(
                out, kind=KIND, fingerprint=fingerprint, config={"sort": board.sort}, inputs=inputs, code=code,
                provenance=Provenance(experiment="*", config_hash=sha256_of(inputs)[:16], git_commit=commit),
                summary={"experiments": len(board.rows), "best": board.rows[0].experiment if board.rows else ""},
            )
    registry.set_ref(KIND, manifest.digest)  # the newest leaderboard, even when it was reused
    return manifest, markdown


def latest_board(registry: Registry) -> Board | None:
    """The most recently published leaderboard, or None."""
    digest = registry.ref(KIND)
    return None if digest is None else Board.from_json(json.loads((registry.open(digest) / BOARD_FILE).read_text()))


def current_best(registry: Registry) -> Row | None:
    """The model currently marked best, or None."""
    digest = registry.ref(BEST_REF)
    return None if digest is None else Row(**json.loads((registry.open(digest) / BEST_FILE).read_text()))


def mark_best(registry: Registry, row: Row, commit: str) -> Manifest:
    """Mark `row` as the best model: publish it and move the ref (the previous ones stay in the registry)."""
    fingerprint = sha256_of({"kind": BEST_REF, "row": row.to_json()})
    manifest = registry.lookup(fingerprint)
    if manifest is None:
        with registry.staging() as out:
            (out / BEST_FILE).write_text(json.dumps(row.to_json(), indent=2, sort_keys=True))
            manifest = registry.publish(
                out, kind=BEST_REF, fingerprint=fingerprint, config={}, inputs=dict(row.digests), code=code_identity("local"),
                provenance=Provenance(experiment=row.experiment, config_hash=fingerprint[:16], git_commit=commit),
                summary={"experiment": row.experiment, "checkpoint": row.checkpoint, "model": row.model,
                         **{f"score/{k}": v for k, v in row.scores.items()}},
            )
    registry.set_ref(BEST_REF, manifest.digest)
    return manifest

