"""`python -m factory` is the `factory` command."""

import sys

from factory.config.architectures import architectures
from factory.config.kinds import stage_kinds
from factory.errors import PluginError


def main() -> None:
    """Register the plugins: stage kinds (with the source kinds) and model architectures (a broken plugin is exit 2, said
    in one line), then run the command."""
    try:
        stage_kinds()  # the source kinds with them
        architectures()
    except PluginError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    from factory.cli import main as command

    command()


if __name__ == "__main__":
    main()
