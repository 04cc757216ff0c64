"""`factory`: the command line, assembled here from one module per command group.

`check` (check, plan, diff: nothing runs), `run`, `evals` (leaderboard, `evals ...`), `ui` (ui, podium), `operations`
(lineage, reproduce, promote, demote, promotions), `data` and `registry`; what they share is in `common`. Each
command imports what it needs when it runs: `factory check` and `factory plan` load no torch, no Kubernetes client
and no plotting. Exit codes: 0 ok, 1 failure, 2 bad input.
"""

from __future__ import annotations

import sys

import typer

from factory.cli import check, data, evals, operations, registry, run, ui
from factory.cli.common import err
from factory.errors import FactoryError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Model Factory: experiments as code, on Dagster.")
# In the order `factory --help` lists them (the groups come after the commands).
for command in (check.check, check.plan, run.run, check.diff, evals.leaderboard, ui.ui, ui.podium,
                operations.lineage, operations.reproduce, operations.promote, operations.demote, operations.promotions):
    app.command()(command)
app.add_typer(evals.evals_app, name="evals")
app.add_typer(data.data_app, name="data")
app.add_typer(registry.registry_app, name="registry")


def main() -> None:
    """Console-script entry point: factory errors and unusable paths end as a message, not a traceback."""
    try:
        app(prog_name="factory")
    except FactoryError as e:
        err.print(f"error: {e}", markup=False, highlight=False)
        sys.exit(e.exit_code)
    except OSError as e:
        from factory.storage.s3_retry import warehouse_outage  # pyarrow is loaded already when this is what failed

        if (outage := warehouse_outage(e)) is not None:
            err.print(f"error: {outage}", markup=False, highlight=False)
            sys.exit(outage.exit_code)
        err.print(f"error: {e.strerror or e}: {e.filename or ''} (check the paths you gave)", markup=False, highlight=False)
        sys.exit(2)
