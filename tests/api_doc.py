"""docs/api.md's example: its ```python cells run in order in one namespace, each followed on the
page by the output it prints (an ``Output:`` line and a ```text block). `test_api` checks the
shown outputs are what the cells print; ``python tests/api_doc.py`` writes them into the page."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "api.md"
# a cell, then (where shown) its output
CELL = re.compile(r"^```python\n(.*?)^```\n(?:\nOutput:\n\n```text\n(.*?)^```\n)?", re.S | re.M)


def cells(text: str) -> list[tuple[str, str | None]]:
    """Each cell's code and the output shown after it (None: none shown)."""
    return [(m.group(1), m.group(2)) for m in CELL.finditer(text)]


def run_cells(text: str, where: str = DOC.name) -> tuple[list[str], dict[str, Any]]:
    """What each cell prints, run in order from the repository's root, and the namespace they leave."""
    ns: dict[str, Any] = {}
    printed = []
    here = Path.cwd()
    os.chdir(ROOT)  # the example names files relative to the repository
    try:
        for i, (code, _) in enumerate(cells(text)):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                exec(compile(code, f"{where} cell {i + 1}", "exec"), ns)
            printed.append(buf.getvalue())
    finally:
        os.chdir(here)
    return printed, ns


def with_outputs(text: str, printed: list[str]) -> str:
    """`text` with each cell's shown output replaced by `printed` (none where it prints nothing)."""
    outputs = iter(printed)

    def block(m: re.Match) -> str:
        out = next(outputs)
        out = out if not out or out.endswith("\n") else out + "\n"
        shown = f"\nOutput:\n\n```text\n{out}```\n" if out else ""
        return f"```python\n{m.group(1)}```\n{shown}"

    return CELL.sub(block, text)


def main() -> int:
    text = DOC.read_text()
    printed, _ = run_cells(text)
    DOC.write_text(with_outputs(text, printed))
    print(f"{DOC.relative_to(ROOT)}: the outputs of {len(printed)} cells written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
