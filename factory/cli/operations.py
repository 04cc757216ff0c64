"""`factory lineage | reproduce | promote | demote | promotions`: follow an artifact's lineage, reproduce a model, move its aliases."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.tree import Tree as RichTree

from factory.cli.common import RootOption, dagster_home, err, out, settings_of
from factory.config.kinds import model_kind
from factory.data.catalog import CatalogConfig
from factory.errors import ConfigError, FactoryError
from factory.registry import Registry, open_registry
from factory.registry.store import Manifest
from factory.ops.lineage import Lineage, TableVersion, describe
from factory.ops.promote import standing
from factory.ops.reproduce import reproduce as reproduce_model


def lineage(
    target: Annotated[str, typer.Argument(help="An artifact digest (prefix), an experiment name (its models), or namespace.table[@tag].")],
    root: RootOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False,
) -> None:
    """Upstream and downstream of an artifact or a table version: which data and code made it, and what was made from it."""
    graph = Lineage(open_registry(settings_of(None, root).root / "registry"))
    try:
        found = graph.find(target)
    except ConfigError as e:
        err.print(f"error: {e}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    exported = model_kind().name
    if found and isinstance(found[0], TableVersion):
        answer = [{"table": v.ref, "content_tag": v.content_tag, "written_by": [graph.upstream(m.digest) for m in graph.writers(v)],
                   "downstream": [graph.downstream(m.digest) for m in graph.writers(v)],
                   "models": [describe(m) for w in graph.writers(v) for m in graph.descendants(w.digest, exported)]} for v in found]
    else:
        answer = [{"artifact": describe(m), "upstream": graph.upstream(m.digest), "downstream": graph.downstream(m.digest),
                   "models": [describe(d) for d in graph.descendants(m.digest, exported)], "bases": graph.bases(m.digest),
                   "imported": graph.imported(m.digest), "fine_tuned": graph.fine_tuned(m.digest)} for m in found]
    if as_json:
        out.print_json(json.dumps(answer))
        return
    wide = Console(width=None if sys.stdout.isatty() else 200, soft_wrap=True)
    for item in answer:
        heading = item.get("table") or f"{item['artifact']['kind']} {item['artifact']['digest'][:12]}"
        out.print(f"[bold]{heading}[/bold]", highlight=False)
        if "table" in item:
            ups, downs, title = item["written_by"], item["downstream"], "written by"
        else:
            ups, downs, title = [item["upstream"]], [item["downstream"]], "made from"
        for tree in ups:
            wide.print(_lineage_tree(tree, "from", title))
        for tree in downs:
            wide.print(_lineage_tree(tree, "to", "made from it"))
        models = ", ".join(f"{m['experiment']} ({m['digest'][:12]})" for m in item["models"]) or "none yet"
        out.print(f"models trained on it: {models}", highlight=False)
        for base in item.get("bases", []):
            out.print(f"  {base['by']} ({base['stage']}) started from {base['kind']} {base['digest'][:12]} of {base['experiment']}"
                      + (f", named {base['named']}" if base["named"] else ""), highlight=False)
        for checkpoint in item.get("imported", []):
            out.print(f"  started from the Hugging Face checkpoint {checkpoint['path']} (files {checkpoint['files'][:12]}), read by "
                      f"{', '.join(checkpoint['read_by'])}", highlight=False)
        for model in item.get("fine_tuned", []):
            data = ", ".join(model["data"]) or "no table"
            out.print(f"  fine-tuned from it: {model['experiment']} ({model['digest'][:12]}) by {', '.join(model['stages'])} on {data}",
                      highlight=False)


def _lineage_tree(node: dict, key: str, title: str) -> RichTree:
    tree = RichTree(f"[dim]{title}[/dim]")

    def add(parent: RichTree, node: dict) -> None:
        label = f"{node['kind']} {node['digest'][:12]}  {node['experiment']}  commit {node['git_commit'][:12]}  {node['code']}"
        branch = parent.add(label + ("  (shown above)" if node.get("repeated") else ""), highlight=False)
        for ref in node.get("tables", []) + node.get("written", []):
            branch.add(f"[cyan]table[/cyan] {ref}", highlight=False)
        for checkpoint in node.get("external", []):
            branch.add(f"[magenta]Hugging Face checkpoint[/magenta] {checkpoint['path']} (files {checkpoint['files'][:12]})", highlight=False)
        children = node.get(key, [])
        evaluations = [c for c in children if c["kind"] == "evaluations"]
        for child in children:
            if child["kind"] != "evaluations":
                add(branch, child)
        if evaluations:
            branch.add(f"{len(evaluations)} evaluations", highlight=False)

    add(tree, node)
    return tree


def _model(registry: Registry, target: str) -> Manifest:
    """The model a digest prefix or an experiment name (its newest model) names; exit 2 when there is none."""
    try:
        found = [m for m in Lineage(registry).find(target) if isinstance(m, Manifest) and m.kind == model_kind().name]
    except ConfigError as e:
        err.print(f"error: {e}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    if not found:
        err.print(f"error: {target!r} is not a model; give a model's digest (prefix) or an experiment name", markup=False, highlight=False)
        raise typer.Exit(2)
    return found[-1]


def reproduce(
    model: Annotated[str, typer.Argument(help="A model artifact's digest (prefix), or an experiment name (its newest model).")],
    root: RootOption = None,
    keep_going: Annotated[bool, typer.Option("--keep-going", help="Run every stage, not only up to the first that differs.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False,
) -> None:
    """Run a model's lineage again (recorded code, config and inputs; cache bypassed) and compare its bytes stage by stage.

    Exit 0 when every stage gives the same bytes, 1 when one differs (the first is explained), 2 on bad input.
    """
    root = settings_of(None, root).root
    registry = open_registry(root / "registry")
    target = _model(registry, model)
    log = logging.getLogger("factory.reproduce")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    try:
        result = reproduce_model(registry, CatalogConfig.at(root), target, log, keep_going=keep_going, repo=Path.cwd())
    except FactoryError as e:
        err.print(f"error: {e}", markup=False, highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        out.print_json(json.dumps(result.to_json()))
    else:
        out.print(f"model {target.digest[:12]} ({target.experiment}), code from {result.code}", highlight=False)
        for stage in result.stages:
            mark = "[green]same[/green]" if stage.matched else "[red]differs[/red]"
            out.print(f"  {stage.kind:<18} {stage.recorded[:12]}  {mark}", highlight=False)
        first = result.first_difference
        if first is None:
            out.print(f"reproduced: all {len(result.stages)} stages gave the same bytes (recorded for promotion)", highlight=False)
        else:
            out.print(f"first difference: {first.kind}: {first.reason}", markup=False, highlight=False)
    raise typer.Exit(0 if result.matched else 1)


ExperimentsOption = Annotated[Path, typer.Option("--experiments", help="Where the experiment files are (a model's `nondeterministic` reason).")]
AliasOption = Annotated[str, typer.Option("--as", help="The alias: production, or another name.")]


def promote(
    model: Annotated[str, typer.Argument(help="A model artifact's digest (prefix), or an experiment name (its newest model).")],
    alias: AliasOption = "production",
    reason: Annotated[str, typer.Option(help="Why: recorded in the alias's history.")] = "",
    root: RootOption = None,
    experiments: ExperimentsOption = Path("experiments"),
) -> None:
    """Point an alias at a model: only after a matching reproduction (or a stated reason it cannot match) and passing blocking checks.

    The promotion is an append-only record in the registry, and `production_model` is materialized in Dagster.
    Exit 0 when promoted, 1 when refused (the reasons are printed), 2 on bad input.
    """
    root = settings_of(None, root).root
    target = _model(open_registry(root / "registry"), model)
    _promotion(["promote", target.digest, "--as", alias, "--reason", reason], root, experiments)


def demote(
    alias: AliasOption = "production",
    reason: Annotated[str, typer.Option(help="Why: recorded in the alias's history.")] = "",
    root: RootOption = None,
    experiments: ExperimentsOption = Path("experiments"),
) -> None:
    """Roll an alias back to the model it named before; the history keeps both."""
    _promotion(["demote", "--as", alias, "--reason", reason], settings_of(None, root).root, experiments)


def promotions(alias: AliasOption = "production", root: RootOption = None,
               as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False) -> None:
    """What an alias names now, and every promotion and demotion before."""
    try:
        now = standing(open_registry(settings_of(None, root).root / "registry"), alias)
    except ConfigError as e:
        err.print(f"error: {e}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        out.print_json(json.dumps({"alias": alias, "model": now.model, "history": now.records}))
        return
    out.print(f"{alias}: {now.model[:12] if now.model else 'no model'}", highlight=False)
    for record in now.records:
        what = f"{record['model'][:12]} ({record.get('experiment', '')})" if record["action"] == "promote" else record["model"][:12]
        out.print(f"  {record['seq']:>3}  {record['at']}  {record['action']:<8} {what}  by {record['by']}: {record['reason'] or '-'}",
                  highlight=False)


def _promotion(args: list[str], root: Path, experiments: Path) -> None:
    env = {**os.environ, **settings_of(None, root).environ(), "DAGSTER_HOME": str(dagster_home(root)), "PYTHONWARNINGS": "ignore"}
    argv = [sys.executable, "-m", "assets.promote", *args, "--root", str(root), "--experiments", str(experiments)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode == 0:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        if answer["action"] == "promote":
            out.print(f"{answer['alias']} -> {answer['model'][:12]} (record {answer['seq']}; {answer['allowed_by']}; {answer['checks']})",
                      highlight=False)
        else:
            now = answer["model"][:12] if answer["model"] else "no model"
            out.print(f"{answer['alias']} rolled back -> {now} (record {answer['seq']})", highlight=False)
        out.print("production_model materialized" if answer["materialized"] else "production_model was not materialized", highlight=False)
        return
    err.print(done.stderr.strip(), markup=False, highlight=False)
    raise typer.Exit(done.returncode)
