"""The `production_model` asset, and `python -m assets.promote`: promotion gated on reproduction and the blocking checks.

`factory promote MODEL --as production` calls this through a subprocess. A model is promoted only
when a reproduction of it matched (or its experiment file says why it cannot), and every blocking
asset check of its experiment passed at its latest evaluation. The promotion is an append-only
record in the registry; `production_model` is then materialized, so the Dagster UI shows which
model the alias names, since when, and its history. `demote` records a rollback the same way.
"""

import argparse
import json
import sys
import warnings
from pathlib import Path

from dagster import (
    AssetCheckKey, AssetExecutionContext, AssetKey, Config, DagsterInstance, DataVersion, MaterializeResult, MetadataValue, PreviewWarning,
    asset, materialize,
)

from assets.execution import resources_at
from assets.stages import CHECK_SPECS
from factory.config.kinds import model_kind
from factory.errors import FactoryError
from factory.registry import open_registry
from factory.registry.index import Where
from factory.ops.promote import demote, grounds, promote, standing
from resources import FactoryStores


CHECK_HISTORY = 200
"""Check executions searched for the experiment's latest (newest first)."""


class PromotionConfig(Config):
    alias: str = "production"
    """The alias whose model this shows."""


@asset(
    deps=[model_kind().name],
    description="The model an alias (production) names, from the registry's promotion history: who promoted it, why, and what allowed it.",
    kinds={"torch"},
    group_name="pipeline",
)
def production_model(context: AssetExecutionContext, config: PromotionConfig, stores: FactoryStores) -> MaterializeResult:
    registry = stores.registry()
    now = standing(registry, config.alias)
    history = [{k: r.get(k) for k in ("seq", "action", "model", "experiment", "reason", "allowed_by", "by", "at")} for r in now.records]
    if now.model is None:
        return MaterializeResult(metadata={"alias": config.alias, "model": "none", "history": MetadataValue.json(history)},
                                 data_version=DataVersion("none"))
    promoted = next(r for r in reversed(now.records) if r["action"] == "promote" and r["model"] == now.model)
    context.log.info(f"{config.alias}: {promoted['experiment']} ({now.model[:12]})")
    return MaterializeResult(
        metadata={
            "alias": config.alias, "model": now.model, "experiment": promoted["experiment"], "git_commit": promoted["git_commit"],
            "promoted_by": promoted["by"], "promoted_at": promoted["at"], "reason": promoted["reason"],
            "allowed_by": promoted["allowed_by"], "checks": promoted["checks"],
            "artifact": MetadataValue.path(registry.where(now.model)), "history": MetadataValue.json(history),
        },
        data_version=DataVersion(now.model),
    )


def blocking_checks(instance: DagsterInstance, experiment: str) -> tuple[str, list[str]]:
    """A summary of the experiment's blocking asset checks at their latest evaluation, and the ones that did not pass."""
    keys = [AssetCheckKey(AssetKey(asset_name), spec.name) for asset_name, specs in CHECK_SPECS.items() for spec in specs if spec.blocking]
    problems = []
    for key in keys:
        # Check executions do not carry the partition here; the run that evaluated them does.
        history = instance.event_log_storage.get_asset_check_execution_history(key, limit=CHECK_HISTORY)
        record = next((r for r in history if _partition_of(instance, r.run_id) == experiment), None)
        name = f"{key.asset_key.to_user_string()} check {key.name}"
        if record is None:
            problems.append(f"{name} never ran for {experiment}: materialize the experiment")
        elif record.status.value != "SUCCEEDED":
            problems.append(f"{name} is {record.status.value.lower()} for {experiment} at its latest evaluation")
    return f"{len(keys) - len(problems)} of {len(keys)} blocking checks passed", problems


def _partition_of(instance: DagsterInstance, run_id: str) -> str | None:
    run = instance.get_run_by_id(run_id)
    return run.tags.get("dagster/partition") if run is not None else None


def main(argv: list[str] | None = None) -> int:
    """Entry point: exit 0 when recorded, 1 when refused (the reasons on stderr), 2 on bad input."""
    warnings.filterwarnings("ignore", category=PreviewWarning)
    parser = argparse.ArgumentParser(prog="python -m assets.promote")
    parser.add_argument("action", choices=["promote", "demote"])
    parser.add_argument("model", nargs="?", help="the model's full digest (promote)")
    parser.add_argument("--as", dest="alias", default="production")
    parser.add_argument("--reason", default="")
    parser.add_argument("--root", type=Path, default=Path(".factory"))
    parser.add_argument("--experiments", type=Path, default=Path("experiments"))
    args = parser.parse_args(argv)
    registry = open_registry(args.root / "registry")
    instance = DagsterInstance.get()
    try:
        if args.action == "promote":
            model = next(iter(registry.manifests(model_kind().name, Where(digest=args.model))), None)
            if model is None:
                print(f"error: no model artifact {args.model}", file=sys.stderr)
                return 2
            allowed_by, problems = grounds(registry, model, args.experiments)
            checks, failed = blocking_checks(instance, model.experiment)
            if problems or failed:
                print(f"refused: {model.experiment} ({model.digest[:12]}) is not promoted to {args.alias}:", file=sys.stderr)
                for problem in [*problems, *failed]:
                    print(f"  - {problem}", file=sys.stderr)
                return 1
            seq = promote(registry, model, args.alias, args.reason, allowed_by or "", checks)
            answer = {"action": "promote", "seq": seq, "alias": args.alias, "model": model.digest, "allowed_by": allowed_by, "checks": checks}
        else:
            seq, now = demote(registry, args.alias, args.reason)
            answer = {"action": "demote", "seq": seq, "alias": args.alias, "model": now}
    except FactoryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = materialize([production_model], instance=instance, resources=resources_at(args.root, args.experiments),
                         run_config={"ops": {"production_model": {"config": {"alias": args.alias}}}}, raise_on_error=False)
    answer["materialized"] = result.success
    print(json.dumps(answer))
    return 0 if result.success else 1


if __name__ == "__main__":
    raise SystemExit(main())
