"""`factory registry verify`: the registry's damaged manifests and artifacts."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from factory.cli.common import RootOption, out, settings_of
from factory.registry import open_registry
from factory.registry.verify import verify

registry_app = typer.Typer(no_args_is_help=True, help="The artifact registry: manifests and published artifacts.")


@registry_app.command("verify")
def registry_verify(
    root: RootOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False,
) -> None:
    """Read every manifest and every byte of the artifacts they name; list what is damaged (exit 1), or say all is intact."""
    store = open_registry(settings_of(None, root).root / "registry")
    damaged = verify(store)
    if as_json:
        out.print_json(json.dumps({"registry": store.location, "damaged": [d.to_json() for d in damaged]}))
    elif damaged:
        for damage in damaged:
            out.print(f"{damage.kind} {damage.path}: {damage.problem}", markup=False, highlight=False)
        out.print(f"{len(damaged)} damaged in {store.location}; rerun their stages to publish them again",
                  markup=False, highlight=False)
    else:
        out.print(f"registry {store.location}: every manifest and artifact intact", markup=False, highlight=False)
    if damaged:
        raise typer.Exit(1)
