"""The `shardsim` command line: `main` parses, runs one command and maps errors to exit statuses.

Imported by the `shardsim` program (or ``python -m``), this first has the signals that end a
command recorded while the rest loads (`interrupts.recording`): `main` then ends at once with
the signal's one line and status, never an import's traceback."""

import os
import sys

from shardsim.core import interrupts

if os.path.basename(sys.argv[0]) in ("shardsim", "-m"):
    interrupts.recording()

from shardsim.cli.app import build_parser, main  # noqa: E402

__all__ = ["build_parser", "main"]
