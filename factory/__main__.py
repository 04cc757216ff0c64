"""`python -m factory` is the `factory` command."""

from factory.cli import main

main()
