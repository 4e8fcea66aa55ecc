"""`shardsim predict` and `import shardsim.simulator.predict` load none of the libraries that
only a sweep's tables, plots and files need (matplotlib, pyarrow, scipy, pandas): each is
checked in a fresh interpreter, whose `sys.modules` says what was loaded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TABLE_AND_PLOT_LIBRARIES = ("matplotlib", "pyarrow", "scipy", "pandas")
PREDICT = (
    "import contextlib, io\n"
    "from shardsim.cli import main\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    assert main(['predict', '--workload', 'tiny-gpt', '--topology', 'g4dn.12xlarge', '--json']) == 0\n"
)


def _loaded(code: str) -> list[str]:
    """The libraries of `TABLE_AND_PLOT_LIBRARIES` that `code` leaves in `sys.modules`."""
    check = f"\nimport json, sys\nprint(json.dumps([m for m in {TABLE_AND_PLOT_LIBRARIES!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", code + check], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("code", ["import shardsim.simulator.predict\n", PREDICT], ids=["import", "command"])
def test_predict_loads_no_table_or_plot_library(code: str) -> None:
    assert _loaded(code) == []


def test_the_check_sees_a_library_that_is_loaded() -> None:
    assert {"matplotlib", "pandas"} <= set(_loaded("import shardsim.report.plots\n"))
