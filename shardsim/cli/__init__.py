"""The `shardsim` command line: `main` parses, runs one command and maps errors to exit statuses."""

from shardsim.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
