"""The leaderboard from the registry's evaluation results: built, published as an immutable artifact, found again."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path

from factory.config.fingerprint import code_identity, sha256_of
from factory.config.kinds import main_training_kind, model_kind
from factory.config.stages import TRAINING_STAGES
from factory.evals.base import EVALUATIONS
from factory.evals.leaderboard import Board, Row, Runs, build_board, render_html, render_markdown
from factory.atomic import write_atomic
from factory.evals import leaderboard
from factory.registry.files import load_record
from factory.registry.layout import BEST_FILE, BOARD_FILE, HTML_FILE, MARKDOWN_FILE
from factory.registry.store import ArtifactStore, Manifest, Provenance

KIND = "leaderboard"
BOARD_BYTES = 256 << 20
"""A kept board larger than this is damage (a board of 100,000 experiments is about 60 MB)."""
log = logging.getLogger(__name__)
BEST_REF = "best-model"
"""The registry ref of the current best model (a published leaderboard row)."""


def current_board(registry: ArtifactStore, sort: str | None = None) -> Board:
    """Every experiment at the model it exported (or marked unfinished) from the evaluation results in the registry, with
    links to its main training's tracker run and the model it started from (`from:`), if made elsewhere.

    A board is kept under the registry's local root (`cache/boards/`) with the state of the registry's index it was
    computed at, and given again while the index holds the same manifests: a registry of 100,000 manifests answers at
    once until one is published or removed (then the board is computed again, reading the results)."""
    index = registry.index()
    state = index.state()
    kinds = tuple(dict.fromkeys((EVALUATIONS, *TRAINING_STAGES, model_kind().name)))
    cache = registry.root / "cache" / "boards" / f"{sha256_of({'sort': sort, 'kinds': kinds, 'code': _board_code()})[:24]}.json"
    if state is not None and (board := _cached_board(cache, state)) is not None:
        return board
    board = _board(registry, sort, kinds)
    if state is not None and index.state() == state:  # nothing changed while it was computed
        with contextlib.suppress(OSError):  # a registry this process cannot write: computed again next time
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(cache, json.dumps({"state": state, "board": board.to_json()}))
    return board


@functools.cache
def _board_code() -> str:
    """What computes a board (this module and the leaderboard's): a kept board of other code is computed again. Read once
    per process, when a board is first asked for, not at import."""
    return hashlib.sha256(Path(__file__).read_bytes() + Path(leaderboard.__file__).read_bytes()).hexdigest()


def _cached_board(path: Path, state: str) -> Board | None:
    """The board kept at `path` if it was computed at `state`; None when there is none, it is of another state, or damaged."""
    try:
        kept = load_record(path, BOARD_BYTES)
        return Board.from_json(kept["board"]) if kept["state"] == state else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as e:
        log.warning("the kept leaderboard %s cannot be read (%s): computing it again", path, e)
        return None


def _board(registry: ArtifactStore, sort: str | None, kinds: tuple[str, ...]) -> Board:
    urls: dict[str, tuple[str, str]] = {}
    bases: dict[str, str] = {}
    results = []
    main_training = main_training_kind().name
    # the kinds it reads, each asked of the registry's index once: results, the runs, their links and bases, the models
    manifests = [m for kind in kinds for m in registry.manifests(kind)]
    for manifest in manifests:
        if manifest.kind == EVALUATIONS:
            results.append(manifest)
        url = manifest.summary.get("tracker_url", "") if manifest.kind == main_training else ""
        if url and manifest.created >= urls.get(manifest.experiment, ("", ""))[0]:
            urls[manifest.experiment] = (manifest.created, url)
        if manifest.base.get("from") and manifest.base.get("model"):
            bases[manifest.experiment] = f"{manifest.base['from']} ({manifest.base['model'][:12]})"
    return build_board(results, runs_of(manifests), {name: url for name, (_, url) in urls.items()}, sort, bases)


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
        last = [model.inputs[name] for name in TRAINING_STAGES if name in model.inputs][-1:]
        exported.update((fingerprint, model.digest) for digest in last for fingerprint in trainings.get(digest, []))
    return Runs(exported=exported, steps=steps)


def publish_leaderboard(registry: ArtifactStore, board: Board, commit: str) -> tuple[Manifest, str]:
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


def latest_board(registry: ArtifactStore) -> Board | None:
    """The most recently published leaderboard, or None."""
    digest = registry.ref(KIND)
    return None if digest is None else Board.from_json(json.loads((registry.open(digest) / BOARD_FILE).read_text()))


def current_best(registry: ArtifactStore) -> Row | None:
    """The model currently marked best, or None."""
    digest = registry.ref(BEST_REF)
    return None if digest is None else Row(**json.loads((registry.open(digest) / BEST_FILE).read_text()))


def mark_best(registry: ArtifactStore, row: Row, commit: str) -> Manifest:
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

