"""Completions from the registry's checkpoints and models, for Podium's side-by-side view.

A checkpoint is named by the sha256 its record gives, so a link to it never changes meaning. It
is loaded only from bytes that hash to that sha256, with the tokenizer and model config of the
stage that saved it. A few loaded models are kept in memory. The list shows each model once (the
checkpoint a model stage exported is the model), with the date it was made and the digest the CLI
prints (`factory leaderboard`, `factory lineage`: the artifact's first 12 hex digits): of the newest
`LISTED` models and training runs, asked of the registry's index, so a registry of years answers at
once; a checkpoint is found by its sha256 through the index too. Listing reads the artifacts' small
files alone (a checkpoint's record, a model's config); a checkpoint's or model's weights, tokenizer and
chat template are fetched when a completion first needs them, so on an object store the page copies
no training artifact to disk and a completion fetches only the checkpoint it loads.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from factory.config.kinds import TOKENIZER, model_kind, provider
from factory.config.schema import ModelConfig
from factory.config.stages import TRAINING_STAGES
from factory.devices import device_for
from factory.errors import ArtifactError
from factory.models.build import new_model
from factory.models.generate import generate
from factory.models.sampling import Sampling
from factory.models.tokenizer import end_of_text, fetched_tokenizer, load_tokenizer
from factory.podium.conversation import rendered
from factory.podium.errors import NotFound, PodiumError
from factory.registry.index import Where
from factory.registry.layout import CHAT_TEMPLATE_FILE, MODEL_CONFIG, MODEL_WEIGHTS
from factory.registry.seam import Registry
from factory.registry.store import Manifest, manifest_of
from factory.train.checkpoint import load_checkpoint
from factory.train.records import kept_in

SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_NEW_TOKENS = 256
MIN_TEMPERATURE = 0.01
MAX_TEMPERATURE = 5.0
"""Sampling temperatures (0 is greedy): below MIN logits / temperature overflow to inf and the draw fails; past MAX it is noise."""
MAX_PROMPT_CHARS = 20_000
LOADED_MODELS = 4
LISTED = 50
"""The page lists the newest this many models, and the checkpoints of the newest this many runs of each training stage; a
link to any other (`/checkpoint/<sha256>`) opens it."""
LISTED_KEPT = 10_000
"""Training artifacts whose listed checkpoints a process keeps (`_LISTED`) before it forgets them all."""


_LISTED: dict[tuple[str, str], list[Candidate]] = {}
"""(registry location, training artifact digest) -> its checkpoints, as `_checkpoints` read them from their records."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Part:
    """One file or directory (`name`) of a published artifact, fetched to local disk when a completion needs it."""

    artifact: Manifest
    name: str

    def holds(self) -> bool:
        """Whether the artifact has this part: the file, or files under the directory."""
        return bool(self.artifact.files_under(self.name))


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """A checkpoint or an exported model that can complete a prompt."""

    sha256: str
    experiment: str
    stage: str
    """The kind of the stage that saved it: one with checkpoints, or the kind of the exported model."""
    step: int
    weights: Part
    model: dict[str, Any]
    tokenizer: str
    """The digest of the artifact whose tokenizer it reads: the tokenizer stage's, or an exported model's own."""
    created: str
    digest: str = ""
    """The registry artifact it is in: the exported model's, or the training stage's that saved the checkpoint."""
    chat_template: Part | None = None
    """The chat template it was fine-tuned with, if it was: a conversation prompts it through this."""

    @property
    def exported(self) -> bool:
        """Whether it is an exported model (its weights alone) rather than a checkpoint."""
        return self.stage == model_kind().name

    @property
    def label(self) -> str:
        """How the page names it: a model by its digest as the CLI prints it, a checkpoint by its stage, step and artifact."""
        short = self.digest[:12]
        where = f"model {short}" if self.exported else f"{self.stage} step {self.step} of {self.stage} {short}"
        return f"{self.experiment} · {where}"

    @property
    def made(self) -> str:
        """When its run made it (the artifact's publication), to the minute, UTC."""
        return self.created[:16].replace("T", " ")

    @property
    def context(self) -> int:
        """Tokens of context its model sees."""
        return ModelConfig.model_validate(self.model).context


@dataclass(frozen=True, kw_only=True, slots=True)
class Completion:
    """What one candidate wrote after a prompt."""

    candidate: Candidate
    prompt: str
    """The text the candidate was prompted with (a conversation rendered through its chat template)."""
    text: str
    tokens: int
    seconds: float
    stopped_at_eos: bool


def candidates(registry: Registry, chosen: Collection[str] = (), newest: int | None = LISTED) -> list[Candidate]:
    """The published models and the checkpoints no model was exported from, newest first (one entry per sha256): of the
    `newest` models and training runs (None: all of them), and every `chosen` one (by sha256: a checkpoint a model was
    exported from too, when a link names it)."""
    found: dict[str, Candidate] = {}
    exported: set[tuple[str, int]] = set()  # (training artifact, step): the checkpoints that are a model listed already
    for manifest in registry.manifests(model_kind().name, newest=newest):
        candidate = _model(registry, manifest)
        if candidate is not None:
            found.setdefault(candidate.sha256, candidate)
            last = [manifest.inputs[name] for name in TRAINING_STAGES if name in manifest.inputs][-1:]  # what the model stage exports
            exported.update((digest, candidate.step) for digest in last)
    for manifest in (m for kind in TRAINING_STAGES for m in registry.manifests(kind, newest=newest)):
        for c in _checkpoints(registry, manifest):
            if (c.digest, c.step) not in exported or c.sha256 in chosen:
                found.setdefault(c.sha256, c)
    for sha256 in set(chosen) - found.keys() if newest is not None else ():  # all of them were read: it is none
        if (candidate := find_candidate(registry, sha256)) is not None:
            found[sha256] = candidate
    return sorted(found.values(), key=lambda c: (c.created, c.experiment, c.stage, c.step), reverse=True)


def find_candidate(registry: Registry, sha256: str) -> Candidate | None:
    """The model or checkpoint with this sha256: asked of the registry's index by the sha256 of an artifact's file (a model's
    weights, a checkpoint file), else (a sharded checkpoint, whose sha256 is its listing's) looked for among every one."""
    holding = Where(file_sha256=sha256)
    for manifest in registry.manifests(model_kind().name, holding):
        if (candidate := _model(registry, manifest)) is not None and candidate.sha256 == sha256:
            return candidate
    for manifest in (m for kind in TRAINING_STAGES for m in registry.manifests(kind, holding)):
        if found := [c for c in _checkpoints(registry, manifest) if c.sha256 == sha256]:
            return found[0]
    return next((c for c in candidates(registry, chosen={sha256}, newest=None) if c.sha256 == sha256), None)


def _checkpoints(registry: Registry, manifest: Manifest) -> list[Candidate]:
    """The checkpoints a training artifact holds, from their records (read alone; a damaged one is left out). An artifact
    never changes, so what its records said is kept (`_LISTED`): a page view reads the records of new artifacts only."""
    tokenizer = manifest.inputs.get(provider(TOKENIZER).name)
    if tokenizer is None or "model" not in manifest.config:
        return []
    if (kept := _LISTED.get((registry.location, manifest.digest))) is not None:
        return kept

    unread: list[str] = []
    out = []
    for saved in kept_in(registry, manifest, unread=unread):
        weights = Part(artifact=manifest, name=saved.path.as_posix())
        if not SHA256.match(str(saved.sha256)) or not weights.holds():
            continue
        out.append(Candidate(
            sha256=saved.sha256, experiment=manifest.experiment, stage=manifest.kind, step=saved.step, weights=weights,
            model=dict(manifest.config["model"]), tokenizer=tokenizer, created=manifest.created, digest=manifest.digest,
            chat_template=_template(manifest),
        ))
    if not unread:  # a record that could not be read (its object missing or damaged) is read again at the next view
        if len(_LISTED) >= LISTED_KEPT:
            _LISTED.clear()
        _LISTED[(registry.location, manifest.digest)] = out
    return out


def _model(registry: Registry, manifest: Manifest) -> Candidate | None:
    weights = manifest.files.get(MODEL_WEIGHTS)
    try:
        config = json.loads(registry.read(manifest, MODEL_CONFIG) or b"")
    except (ArtifactError, OSError, ValueError):
        return None
    if weights is None or not isinstance(config, dict) or "model" not in config:
        return None
    return Candidate(
        sha256=str(weights["sha256"]), experiment=manifest.experiment, stage=manifest.kind, step=int(config.get("steps", 0)),
        weights=Part(artifact=manifest, name=MODEL_WEIGHTS), model=dict(config["model"]),
        tokenizer=manifest.digest, created=manifest.created, digest=manifest.digest,
        chat_template=_template(manifest),
    )


def _template(manifest: Manifest) -> Part | None:
    return Part(artifact=manifest, name=CHAT_TEMPLATE_FILE) if CHAT_TEMPLATE_FILE in manifest.files else None


def checked_temperature(value: float) -> float:
    """`value` when it is 0 (greedy) or a finite temperature in [MIN_TEMPERATURE, MAX_TEMPERATURE]; else what to change."""
    if value == 0 or MIN_TEMPERATURE <= value <= MAX_TEMPERATURE:  # nan and inf compare false: refused too
        return value
    raise PodiumError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and {MAX_TEMPERATURE}, not {value}")


class Generator:
    """Loads candidates on demand (a few at a time) and completes prompts with them."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._loaded: OrderedDict[str, tuple[torch.nn.Module, Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def find(self, sha256: str) -> Candidate:
        """The candidate with this sha256."""
        if not SHA256.match(sha256):
            raise NotFound(f"{sha256!r} is not a checkpoint sha256 (64 hex digits)")
        if (candidate := find_candidate(self.registry, sha256)) is not None:
            return candidate
        raise NotFound(f"no published checkpoint or model has sha256 {sha256[:12]}…; it may not be published yet")

    def complete(self, candidate: Candidate, prompt: str, new_tokens: int = 64, temperature: float = 0.0, seed: int = 0,
                 chat: bool = False) -> Completion:
        """The candidate's continuation of `prompt`: greedy, or sampled at `temperature` from `seed`. With `chat`, the
        prompt is a conversation (turns as JSON, or text as one user turn) given through the candidate's chat template."""
        if not prompt:
            raise PodiumError("the prompt is empty: pick a sample or write a prompt")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise PodiumError(f"the prompt has {len(prompt)} characters; at most {MAX_PROMPT_CHARS} are generated from")
        if not 1 <= new_tokens <= MAX_NEW_TOKENS:
            raise PodiumError(f"new tokens must be between 1 and {MAX_NEW_TOKENS}, not {new_tokens}")
        checked_temperature(temperature)
        with self._lock:  # one generation at a time: the models share the CPU (or the GPU)
            model, tokenizer, eos = self._model(candidate)
            template = self._fetched(candidate, candidate.chat_template) if chat and candidate.chat_template else None
            text = rendered(prompt, template) if chat else prompt
            ids = tokenizer.encode(text).ids
            if not ids:
                raise PodiumError("the prompt encodes to no tokens")
            sampling = Sampling(new_tokens=new_tokens, temperature=temperature, eos_id=eos)
            started = time.perf_counter()
            done = generate(model, [ids], sampling, context=candidate.context, seeds=[seed] if temperature > 0 else None)[0]
            seconds = time.perf_counter() - started
        tokens = list(done.text_tokens)
        return Completion(candidate=candidate, prompt=text, text=tokenizer.decode(tokens, skip_special_tokens=True), tokens=len(tokens),
                          seconds=seconds, stopped_at_eos=done.finish == "eos")

    def _model(self, candidate: Candidate) -> tuple[torch.nn.Module, Any, int]:
        """The candidate's model (on this machine's device), its tokenizer and the token that ends its text."""
        if candidate.sha256 in self._loaded:
            self._loaded.move_to_end(candidate.sha256)
            return self._loaded[candidate.sha256]
        try:
            # an exported model.pt holds the weights alone
            state = load_checkpoint(self._fetched(candidate, candidate.weights), candidate.sha256)
            tokenizer_file = fetched_tokenizer(self.registry, manifest_of(self.registry, candidate.tokenizer))
            tokenizer = load_tokenizer(tokenizer_file)
            eos = end_of_text(tokenizer, tokenizer_file)
            model = new_model(ModelConfig.model_validate(candidate.model), tokenizer.get_vocab_size())
            model.load_state_dict(state if candidate.exported else state["model"])
        except (ArtifactError, OSError, RuntimeError, ValueError, KeyError) as e:
            raise PodiumError(f"{candidate.label} cannot be loaded: {e}") from e
        model.to(device_for(None)).eval()  # the machine Podium serves from: its GPU when it has one
        self._loaded[candidate.sha256] = (model, tokenizer, eos)
        while len(self._loaded) > LOADED_MODELS:
            self._loaded.popitem(last=False)
        return model, tokenizer, eos

    def _fetched(self, candidate: Candidate, part: Part) -> Path:
        """Where `part` of a candidate's artifacts is on this machine (fetched from an object store)."""
        if not part.holds():
            raise PodiumError(f"{candidate.label} cannot be loaded: artifact {part.artifact.digest[:12]} has no {part.name}; "
                              "rerun its stage to publish it again")
        try:
            return self.registry.fetch(part.artifact, part.name)
        except (ArtifactError, OSError) as e:
            raise PodiumError(f"{candidate.label} cannot be loaded: {part.name} of artifact {part.artifact.digest[:12]}: {e}") from e
