"""The leaderboard (every experiment at the model it exported) and the best model it may mark.

`best_model` is only ever a ranked row: a finished run's exported model (a run that exported none is
marked unfinished on the board and never marked best). It moves only when the leaderboard's blocking check passes: the new leader may not be
worse than the current best on any benchmark by more than the tolerance, and it may not lead on
an own-split score (`val_bpb`) that the current best was not scored on alike. Only scores of the
same benchmark version on the same data are compared.
"""

from collections.abc import Iterator

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    DataVersion,
    DefaultSensorStatus,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)

from factory.evals.leaderboard import REGRESSION_TOLERANCE, held_back, leader
from factory.registry import git_commit
from factory.evals.publish import current_best, current_board, latest_board, mark_best, publish_leaderboard
from factory.registry.layout import HTML_FILE
from resources import FactoryStores

# Refresh whenever an evaluation changes (runs started by the automation sensor included).
REFRESH = AutomationCondition.any_deps_updated() & ~AutomationCondition.in_progress() & ~AutomationCondition.any_deps_in_progress()
NO_REGRESSION = "no_regression"


@asset(
    deps=["evaluations"],
    description="Every experiment at the model it exported (an unfinished run marked), scored on every benchmark; Markdown here, HTML in the artifact.",
    kinds={"markdown", "html"},
    group_name="pipeline",
    automation_condition=REFRESH,
    check_specs=[AssetCheckSpec(
        NO_REGRESSION, asset="leaderboard", blocking=True,
        description=f"The leader is not worse than the current best model on any benchmark by more than {REGRESSION_TOLERANCE:.0%}, "
                    "comparing only scores on the same data.",
    )],
)
def leaderboard(context: AssetExecutionContext, stores: FactoryStores) -> Iterator[MaterializeResult]:
    registry = stores.registry()
    board = current_board(registry)
    manifest, markdown = publish_leaderboard(registry, board, git_commit())
    best, first = current_best(registry), leader(board)
    found = held_back(first, best, board) if first is not None and best is not None else []
    metadata = {
        **manifest.metadata(), "leaderboard": MetadataValue.md(markdown), "experiments": len(board.rows),
        "html": MetadataValue.path(f"{registry.where(manifest.digest)}/{HTML_FILE}"),  # shown, not fetched
    }
    check = AssetCheckResult(
        check_name=NO_REGRESSION, passed=not found,
        description="; ".join(found) or ("no best model yet" if best is None else f"no regression against {best.experiment} ({best.checkpoint})"),
        metadata={"leader": first.experiment if first else "none ranked", "current_best": best.experiment if best else ""},
    )
    yield MaterializeResult(metadata=metadata, data_version=DataVersion(manifest.digest), check_results=[check])


@asset(
    deps=["leaderboard"],
    description="The model marked best: the leaderboard's leader, moved only when the no-regression check passes.",
    kinds={"torch"},
    group_name="pipeline",
    automation_condition=REFRESH,
)
def best_model(context: AssetExecutionContext, stores: FactoryStores) -> MaterializeResult:
    registry = stores.registry()
    board = latest_board(registry)  # the board the leaderboard published (and checked)
    first = leader(board) if board is not None else None
    if first is None:
        said = "none: no evaluations yet" if board is None or not board.rows else f"unchanged: no ranked model ({board.rows[0].note})"
        return MaterializeResult(metadata={"best": said})
    best = current_best(registry)
    if best is not None and (found := held_back(first, best, board)):  # also when run without the leaderboard
        raise Failure(description=f"{first.experiment} is not marked best: " + "; ".join(found))
    manifest = mark_best(registry, first, git_commit())
    context.log.info(f"best model: {first.experiment} at {first.checkpoint} (model {first.model[:12]})")
    return MaterializeResult(
        metadata={**manifest.metadata(), "experiment": first.experiment, "checkpoint": first.checkpoint, "model": first.model,
                  "scores": MetadataValue.json(dict(first.scores))},
        data_version=DataVersion(manifest.digest),
    )


automation = AutomationConditionSensorDefinition(
    "automation", target=AssetSelection.assets("evaluations", "leaderboard", "best_model"),
    default_status=DefaultSensorStatus.RUNNING,
)
