"""`factory data batch`: look inside the datasets, down to the exact batch a training step consumed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from factory.cli.common import RootOption, out, settings_of
from factory.config import load
from factory.data.catalog import CatalogConfig, open_catalog
from factory.registry import open_registry

data_app = typer.Typer(no_args_is_help=True, help="Look inside datasets and the batches training saw.")


@data_app.command("batch")
def data_batch(
    experiment: Annotated[Path, typer.Argument(help="The experiment file whose run to look into.")],
    step: Annotated[int, typer.Argument(help="The training step (0-based).")],
    root: RootOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Token ids and documents as JSON, for machines.")] = False,
    variant: Annotated[str | None, typer.Option("--variant", help="For a sweep file: the variant whose run to look into (its name).")] = None,
) -> None:
    """Fetch again the exact batch a training step consumed: its sequences and the documents in them."""
    from factory.ops.batch import fetch_batch
    from factory.ops.batch import to_json as batch_json

    root = settings_of(experiment, root).root
    chosen = load(experiment, variant)
    catalog = open_catalog(CatalogConfig.at(root))
    sequences = fetch_batch(chosen, step, open_registry(root / "registry"), catalog)
    if as_json:
        print(json.dumps({"step": step, "sequences": batch_json(sequences)}, indent=2))
        return
    table = Table(title=f"batch of step {step}", title_justify="left")
    for column in ("seq", "tokens", "documents"):
        table.add_column(column)
    for index, sequence in enumerate(sequences):
        documents = ", ".join(f"{d.get('table', '?')}:{d.get('path', d['id'])}" for d in sequence.documents)
        table.add_row(str(index), str(sequence.real_tokens), documents)
    out.print(table)
