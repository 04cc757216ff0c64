"""Stage kinds: what each stage of an experiment is, declared once, built in or installed as a plugin.

A `StageKind` says everything the factory needs to plan, fingerprint, place, run and show one stage: its name,
the experiment section that holds its typed config (its presence turns the stage on), the kinds it reads, whether
it produces checkpoints, its run function and a description. The built-in kinds are declared in
`factory.stages.builtin`; an installed package adds kinds through the entry-point group `model_factory.stages`
(each entry point names a `StageKind`). Everything else (the stage lists, the Dagster assets, the plan, the
experiment schema's extra sections) is derived from `stage_kinds()`. What other modules need of particular kinds (the
exported model, the blend and the tokenizer, the kinds that write table versions, check them or read source files, the
main training, the report's training plots) are roles the kinds declare, so a plugin kind can take one and no module outside
a kind's own names it.

A plugin that cannot be loaded, a duplicate name, an unknown upstream kind or a section that collides with a
built-in one is a `PluginError` naming the plugin and what to change, raised where the registry is first read.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint
from typing import Any, Literal

from pydantic import create_model

from factory.config.plugins import example_declaring, load_declarations, plugin_name, resolve
from factory.config.schema import Experiment, TrainedModel, blended_datasets
from factory.config.section import Section
from factory.config.source_kinds import source_kinds
from factory.errors import ConfigError, PluginError

ENTRY_POINT_GROUP = "model_factory.stages"
BUILTIN_MODULE = "factory.stages.builtin"
"""Declares the built-in kinds as `BUILTIN_KINDS`, in the order they run."""
BUILT_IN = "built in"
BLEND = "blend"
"""The role of the artifact that holds the training mixture (`blend.json`), read by training and evaluation."""
TOKENIZER = "tokenizer"
"""The role of the artifact that holds the tokenizer (`tokenizer.json`) training and generation encode with."""
EXPORTS_MODEL = "exports the model"
MAIN_TRAINING = "is the main training"


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """Where one stage runs: never part of its fingerprint."""

    nodes: int = 1
    processes: int = 1
    """Ranks per node."""
    gpus: int = 0
    """GPUs per node."""
    roles: Mapping[str, Any] = field(default_factory=dict)
    """Stage-specific: RL's `learners` and `actors` ranks, and the `backend` they meet over."""


def one_rank(experiment: Experiment) -> Placement:
    """The placement of a stage that runs as one process."""
    return Placement()


def as_resources_say(experiment: Experiment) -> Placement:
    """The placement of a stage spread as the experiment's `resources` say: nodes x processes_per_node ranks."""
    resources = experiment.resources
    return Placement(nodes=resources.nodes, processes=resources.processes_per_node, gpus=resources.gpus)


@dataclass(frozen=True, kw_only=True, slots=True)
class TableNeed:
    """A pinned table version a stage reads: where the experiment file names it, and the columns the stage needs."""

    where: tuple[str | int, ...]
    """The key path of the reference in the experiment file (its `file:line` in errors)."""
    table: str
    """`namespace.table@tag`."""
    columns: tuple[str, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetNeed:
    """A dataset of the experiment file (`data.datasets`) a stage reads, where the file names it, and the columns its
    source must keep: the data stages ingest, dedup and filter it for the stage, blended or not."""

    where: tuple[str | int, ...]
    """The key path of the reference in the experiment file (its `file:line` in errors)."""
    dataset: str
    columns: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Training:
    """What a training kind declares (`factory.plugin.training_kind`): the platform's loop runs it with what every training
    stage gets (ranks and GPUs, DDP/FSDP, precision, compile, the tracker, checkpoints, bitwise resume)."""

    batches: str | Callable[[Any], Callable[[Any], Iterable[Any]]]
    """`batches(inputs)`, given a `factory.stages.trainer.TrainingInputs`: the batch source, a function from a loader
    position (None: the start) to this rank's `Batch`es of the global batches from there on, each saying its position."""
    loss: str | Callable[..., Any] | None = None
    """`loss(model, x, y, frozen, config)`: the summed loss of one micro-batch (rows of the batch's `x` and `y` on the model's
    device; `frozen`: the models of `frozen` by name; `config`: the kind's section), which the loop averages over the global
    batch's `Batch.units`; None: the next-token cross-entropy."""
    frozen: tuple[str, ...] = ()
    """Frozen models the loss reads: `reference` (a copy of the weights the stage starts from)."""
    starts_from_model: bool = True
    """Whether it trains a model made before it (this file's last training stage, `from:` or `model.from_hf`), rather
    than one initialised from the seed."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricsPlot:
    """How the run report draws the metrics log (`metrics.jsonl`) of a kind with checkpoints, in a section of its own."""

    title: str
    """The section's heading."""
    file: str
    """The PNG's file name in the report artifact."""
    alt: str
    """The image's alternative text."""
    curves: Literal["loss", "rewards"] = "loss"
    """`loss`: the training (and eval) loss against step; `rewards`: RL's mean reward, pass and format rates, and KL."""


@dataclass(frozen=True, kw_only=True)
class StageKind:
    """One kind of stage. A plugin declares one in its own module and names it in the `model_factory.stages` entry points."""

    name: str
    """The stage's name: its Dagster asset, its registry kind, its place in `factory plan`."""
    description: str
    """What the stage computes, shown in the Dagster UI."""
    run: str | Callable[[Any], dict[str, Any]]
    """Computes the stage in the stage process: `run(ctx)`, given a `factory.runtime.context.StageContext`, stages files
    under `ctx.out` and returns the summary recorded in the manifest. A `module:function` string is imported only by the
    process that runs this kind."""
    reads: tuple[str, ...] = ()
    """The kinds whose artifacts it reads (those the experiment does not run are left out): its upstream."""
    reads_in: Callable[[Experiment], Iterable[str]] | None = None
    """Which of `reads` an experiment's stage reads, when that depends on its config (default: all of them); one left
    out is no part of its fingerprint."""
    section: str | None = None
    """The experiment file's section holding its config; the stage runs when the section is present."""
    config: type[Section] | None = None
    """The section's type (a frozen `Section`, a docstring per field): `factory check` validates the section with it."""
    checkpoints: bool = False
    """Whether its artifact holds checkpoints (`step_NNNNNN.pt`, or a directory `step_NNNNNN/` when sharded, each with its
    record `step_NNNNNN.json`, at the top of the artifact) and `run.json`, which names the final one: they become
    `checkpoints` partitions and are evaluated, and the model stage exports the final one when the kind ends the chain.
    Such a stage takes a slot of the `training` pool. A training kind (`training_kind`) gets all of it from the loop; another
    writes it with `factory.plugin.save_final`."""
    settings: type[Section] | None = None
    """The type of its stage settings: what `fingerprint` returns, and what the stage process parses once and its run
    function reads (`ctx.settings`). A kind with checkpoints has settings extending `TrainedModel` (its checkpoints are
    evaluated with the model they name)."""
    fingerprint: Callable[[Experiment], Section | dict[str, Any]] | None = None
    """The part of the experiment that changes its output (placement excluded), as its `settings`; the fingerprint
    hashes their canonical dump. Default: its section and the seed."""
    present: Callable[[Experiment], bool] | None = None
    """Whether an experiment runs this stage; default: its section is present."""
    placement: Callable[[Experiment], Placement] = one_rank
    """Where it runs: one process by default (`as_resources_say` spreads it over `resources`)."""
    artifact: frozenset[str] = frozenset()
    """What its artifact is made of, shown as the asset's kinds in the Dagster UI (`torch`, `iceberg`, ...)."""
    group: str = "pipeline"
    """The Dagster asset group it is shown in."""
    extra_inputs: tuple[str, ...] = ()
    """Assets outside the stage chain it reads (e.g. `code_exec_tasks`)."""
    tables: Callable[[Experiment], Iterable[TableNeed]] | None = None
    """The pinned table versions it reads, which `factory check` verifies exist with the columns it needs."""
    imports: tuple[str, ...] = ()
    """The modules its run function imports when it runs; a warm interpreter imports them once ahead (its own module
    stays light, as reading the registry imports it)."""
    scope: Literal["experiment", "checkpoints"] = "experiment"
    """`experiment`: one stage per experiment, in its chain (every plugin kind). `checkpoints`: a batch over `checkpoints`
    partitions, outside any experiment's chain: the built-in evaluation, which the `evaluations` asset runs with the
    batch as its settings."""
    exports_model: bool = False
    """Whether its artifact is the experiment's exported model: what `factory lineage EXPERIMENT` answers, what is reproduced,
    promoted and served by Podium, and what the run report and the promoted model wait on. One kind at most."""
    writes_tables: bool = False
    """Whether it writes Iceberg table versions and lists them in its artifact's `datasets.json`: lineage joins table
    versions to artifacts through them."""
    dataset_checks: bool = False
    """Whether it runs the blocking dataset checks (`factory.data.checks.CHECKS`) on the table versions it writes and
    keeps their outcomes in its artifact (`checks.json`): each is a blocking Dagster asset check of its asset, and a failure
    blocks everything downstream."""
    reads_sources: bool = False
    """Whether it reads source files from outside the registry: its settings hold the `sources` and their `files` digest,
    which `factory plan` and `factory reproduce` compare with the files there today."""
    runs_filters: bool = False
    """Whether it runs the datasets' filters that plugins declare (`filters.custom`): their packages' code enters its code
    identity."""
    provides: str | None = None
    """The shared input its artifact holds for the stages downstream: `BLEND` (the training mixture) or `TOKENIZER`. One
    kind at most provides each."""
    main_training: bool = False
    """Whether it is the experiment's main training (pretraining on the blend): its tracker run is the one the run report
    and the leaderboard link, the report's summary and control decisions read its logs, and `factory data batch` replays
    its loader. One kind at most."""
    plot: MetricsPlot | None = None
    """How the run report draws its metrics log; a kind with checkpoints and none is drawn as a loss curve under its name."""
    training: Training | None = None
    """For a kind the platform's training loop runs: its batch source and loss (`factory.plugin.training_kind`)."""
    datasets: Callable[[Experiment], Iterable[DatasetNeed]] | None = None
    """The datasets of the file it reads: the data stages compute them for it, and `factory check` verifies each is
    defined and keeps the columns it needs."""
    origin: str = BUILT_IN
    """Who declared it: `built in`, or the plugin's entry point and package (set by the registry)."""

    def runs_in(self, experiment: Experiment) -> bool:
        """Whether `experiment` runs this stage."""
        if self.present is not None:
            return self.present(experiment)
        return self.section is not None and getattr(experiment, self.section, None) is not None

    def reads_of(self, experiment: Experiment) -> tuple[str, ...]:
        """The kinds of `reads` this experiment's stage reads, before leaving out those the experiment does not run."""
        wanted = set(self.reads_in(experiment)) if self.reads_in is not None else set(self.reads)
        return tuple(name for name in self.reads if name in wanted)

    def config_of(self, experiment: Experiment) -> dict[str, Any]:
        """The part of `experiment` that changes this stage's output, as plain JSON."""
        if self.fingerprint is not None:
            value = self.fingerprint(experiment)
            return value.model_dump(mode="json") if isinstance(value, Section) else value
        section = getattr(experiment, self.section) if self.section else None
        return {**({self.section: section.model_dump(mode="json")} if section is not None else {}), "seed": experiment.seed}

    def read_settings(self, config: Mapping[str, Any]) -> Any:
        """`config` (a stage spec's or a manifest's) parsed as this kind's settings."""
        if self.settings is None:
            raise ConfigError(f"stage kind {self.name!r} ({self.origin}) declares no settings type to read its config with")
        return self.settings.model_validate(config)

    def run_function(self) -> Callable[[Any], dict[str, Any]]:
        """The run function, imported now when declared as `module:function`."""
        return resolve(self.run)

    def metrics_plot(self) -> MetricsPlot | None:
        """How the run report draws its metrics log: its `plot`, a loss curve under its name for another kind with
        checkpoints, None for a kind without."""
        if self.plot is not None or not self.checkpoints:
            return self.plot
        return MetricsPlot(title=self.name, file=f"{self.name}.png", alt=f"{self.name} loss")

    def unique_roles(self) -> set[str]:
        """The roles it holds that one kind at most may hold, as phrases (`exports the model`)."""
        return ({EXPORTS_MODEL} if self.exports_model else set()) | ({MAIN_TRAINING} if self.main_training else set()) | (
            {_provides(self.provides)} if self.provides else set())


@functools.cache
def registered_kinds() -> tuple[StageKind, ...]:
    """Every registered stage kind, upstream before downstream: the built-in ones, then each plugin's after what it reads.
    The source kinds are registered with them, so a broken source plugin is said wherever the stages are first read."""
    source_kinds()
    builtin: tuple[StageKind, ...] = importlib.import_module(BUILTIN_MODULE).BUILTIN_KINDS
    kinds = list(builtin)
    for entry, declared in load_declarations(ENTRY_POINT_GROUP, StageKind, "stage kind"):
        plugin = _registered(entry, declared)
        _check(plugin, kinds, builtin)
        after = max((i for i, k in enumerate(kinds) if k.name in plugin.reads), default=len(kinds) - 1)
        kinds.insert(after + 1, plugin)
    return tuple(_exporter_reads_every_training(kinds))


def _exporter_reads_every_training(kinds: list[StageKind]) -> list[StageKind]:
    """The kinds, the exporting one reading every kind with checkpoints (a plugin's too): it exports the last one the
    experiment runs, and a failed one stops the export."""
    trained = [k.name for k in kinds if k.checkpoints and k.scope == "experiment"]
    return [dataclasses.replace(k, reads=tuple(dict.fromkeys((*k.reads, *trained)))) if k.exports_model else k for k in kinds]


def exported(names: Iterable[str]) -> list[str]:
    """Of the kinds `names` (those an experiment runs), the kinds with checkpoints that no other of them reads: the last
    training stages of the chain, one of which the model stage exports (more than one: the file must choose, `export`)."""
    chosen = [stage_kind(name) for name in names]
    trained = [kind for kind in chosen if kind.checkpoints and kind.scope == "experiment"]
    return [kind.name for kind in trained if not any(kind.name in other.reads for other in trained if other is not kind)]


def chain_ends_twice(ends: list[str]) -> str:
    """Why a file whose training chain has several last stages (`exported`) must say which one the model stage exports."""
    return (f"{' and '.join(ends)} both end the training chain (neither reads the other): add `export: <one of them>` to say whose "
            "final weights the model stage exports")


def stage_kinds() -> tuple[StageKind, ...]:
    """The kinds of an experiment's chain (`scope` experiment), upstream first: what plans, assets and lists derive from."""
    return tuple(kind for kind in registered_kinds() if kind.scope == "experiment")


def trains(experiment: Experiment) -> bool:
    """Whether a kind with checkpoints runs in `experiment`: then it has checkpoints to evaluate and a model to export."""
    return any(kind.checkpoints and kind.runs_in(experiment) for kind in stage_kinds())


def computed_datasets(experiment: Experiment) -> tuple[str, ...]:
    """The datasets the data stages compute, in `data.datasets` order: those the blend draws from and those the stages
    it runs declare they read (`StageKind.datasets`: `sft.data`'s, a plugin's); a dataset no stage reads enters no
    fingerprint."""
    read = {*blended_datasets(experiment), *(need.dataset for need in dataset_needs(experiment))}
    return tuple(name for name in experiment.data.datasets if name in read)


def dataset_needs(experiment: Experiment) -> list[DatasetNeed]:
    """The datasets of the file that the stages it runs read (`StageKind.datasets`), where the file names each."""
    return [need for kind in stage_kinds() if kind.datasets is not None and kind.runs_in(experiment) for need in kind.datasets(experiment)]


def stage_kind(name: str) -> StageKind:
    """The registered kind named `name` (of any scope); a ConfigError naming the known ones otherwise."""
    for kind in registered_kinds():
        if kind.name == name:
            return kind
    raise ConfigError(f"unknown stage {name!r}; stages are: {', '.join(k.name for k in registered_kinds())}")


def model_kind() -> StageKind:
    """The kind whose artifact is the experiment's exported model."""
    return _holder(EXPORTS_MODEL)


def main_training_kind() -> StageKind:
    """The kind that is the experiment's main training (pretraining)."""
    return _holder(MAIN_TRAINING)


def provider(role: str) -> StageKind:
    """The kind whose artifact provides `role` (`BLEND` or `TOKENIZER`) to the stages downstream."""
    return _holder(_provides(role))


def _provides(role: str) -> str:
    return f"provides the {role}"


def _holder(role: str) -> StageKind:
    found = next((kind for kind in stage_kinds() if role in kind.unique_roles()), None)
    if found is None:
        raise ConfigError(f"no registered stage kind {role} (kinds: {', '.join(k.name for k in stage_kinds())})")
    return found


def plugin_sections() -> dict[str, StageKind]:
    """{section: kind} of the installed plugins' experiment sections."""
    return {kind.section: kind for kind in stage_kinds() if kind.origin != BUILT_IN and kind.section}


@functools.cache
def experiment_model() -> type[Experiment]:
    """The experiment file's schema: the built-in sections plus one optional section per installed plugin kind."""
    sections = plugin_sections()
    if not sections:
        return Experiment
    fields: dict[str, Any] = {section: (kind.config | None, None) for section, kind in sections.items()}
    return create_model("Experiment", __base__=Experiment, __doc__=Experiment.__doc__, **fields)


def plugin_hint(section: str) -> str | None:
    """For a section no installed kind declares: which package of this checkout's `examples/` would declare it."""
    if (package := example_declaring(ENTRY_POINT_GROUP, section)) is None:
        return None
    return f"section of the stage kind {section!r}, which is not installed: install the package that declares it (pip install -e {package})"


def _registered(entry: EntryPoint, kind: StageKind) -> StageKind:
    """A plugin's kind as registered: named after its plugin, its typed section under its own name by default."""
    if kind.scope != "experiment":
        raise PluginError(f"{plugin_name(entry)}: a plugin kind is a stage of an experiment (scope 'experiment'); checkpoints are "
                          "scored by the built-in evaluation, with benchmarks (factory/evals/benchmarks.py)")
    if kind.section and kind.config is None:
        raise PluginError(f"{plugin_name(entry)}: section {kind.section!r} has no config type; give the StageKind a `config=` Section class")
    if kind.checkpoints and not (kind.settings and issubclass(kind.settings, TrainedModel)):
        raise PluginError(f"{plugin_name(entry)}: a kind with checkpoints gives `settings=` a Section extending TrainedModel (its "
                          "checkpoints are evaluated with the model it names), built by its `fingerprint`")
    if kind.checkpoints and not {BLEND, TOKENIZER} <= set(kind.reads):
        raise PluginError(f"{plugin_name(entry)}: a kind with checkpoints reads the blend and the tokenizer (`reads`): its checkpoints "
                          "are evaluated on the blend's held-out data, with the tokenizer; `training_kind` declares both")
    section = kind.section or (kind.name if kind.config is not None else None)  # a typed config lives under its name
    return dataclasses.replace(kind, origin=plugin_name(entry), section=section)


def _check(plugin: StageKind, kinds: list[StageKind], builtin: tuple[StageKind, ...]) -> None:
    if clash := next((k for k in kinds if k.name == plugin.name), None):
        raise PluginError(f"{plugin.origin} declares the stage kind {plugin.name!r}, which {clash.origin} declares already; "
                          "rename one of them")
    if unknown := [name for name in plugin.reads if name not in {k.name for k in kinds}]:
        raise PluginError(f"{plugin.origin}: stage kind {plugin.name!r} reads {', '.join(map(repr, unknown))}, which no stage kind "
                          f"declares (known: {', '.join(k.name for k in kinds)}); fix `reads`")
    for role in plugin.unique_roles():
        if holder := next((k for k in kinds if role in k.unique_roles()), None):
            raise PluginError(f"{plugin.origin}: stage kind {plugin.name!r} {role}, as {holder.name!r} ({holder.origin}) does "
                              "already; one kind at most may: drop the role from the plugin's kind")
    if plugin.checkpoints and any(k.exports_model and k.name in plugin.reads for k in kinds):
        raise PluginError(f"{plugin.origin}: stage kind {plugin.name!r} has checkpoints and reads the exported model, which exports the "
                          "last kind with checkpoints: start it from a training kind (`reads`), or drop `checkpoints`")
    if plugin.section in Experiment.model_fields:
        raise PluginError(f"{plugin.origin}: section {plugin.section!r} of stage kind {plugin.name!r} is a built-in section of "
                          "the experiment file; give the kind a section of its own (its name, by default)")
    if plugin.section and (clash := next((k for k in kinds if k.section == plugin.section and k not in builtin), None)):
        raise PluginError(f"{plugin.origin}: section {plugin.section!r} is {clash.origin}'s already; give the kind a section "
                          "of its own")
