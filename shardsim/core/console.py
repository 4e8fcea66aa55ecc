"""The width text output is laid out for, and the rich console that lays it out.

``COLUMNS`` when it is set (piped or not), else the terminal's width, else — stdout piped or
redirected without ``COLUMNS`` — no limit: every column, lines as long as they need, so that a
file or a pipe gets everything.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

UNLIMITED = 100_000  # the console width that stands for "no limit"


def output_width() -> int | None:
    """Columns to fit stdout's text into; None for no limit (piped, no ``COLUMNS``)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def console(*, wide: bool = False) -> Console:
    """A rich console on stdout at `output_width()` (no limit with `wide`); no highlighting. A
    broken pipe on it raises BrokenPipeError, as `print` does, for the CLI to end with 141
    (rich's own answer is to exit with status 1)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    width = None if wide else output_width()
    return _Console(width=width or UNLIMITED, highlight=False, soft_wrap=width is None)


def labelled(label: str, text: str, width: int | None, indent: int = 2, column: int = 19) -> str:
    """``  label      text``, the text wrapped to `width` under its own first column, at its
    ``, `` separators where it can (an item such as ``optimizer 2.304 ms`` stays whole)."""
    head = " " * indent + label.ljust(column - indent - 1) + " "
    if width is None:
        return head + text
    glued = ", ".join(item.replace(" ", "\0") for item in text.split(", "))
    return textwrap.fill(
        glued,
        width=max(width, column + 20),
        initial_indent=head,
        subsequent_indent=" " * column,
        break_long_words=False,
        break_on_hyphens=False,
    ).replace("\0", " ")
