"""The commands' promise for nccl-tests files, checked by fuzzing the logs a user can pass: exit 0
with a finite answer, or exit 2 with exactly one line on stderr (one more line on stderr, naming
the dropped rows, only with exit 0).

Hypothesis writes logs of several sections (collectives, ranks and nodes of their own, with or
without their starting and Rank lines), sizes whose time is 0 or no number, and junk lines (NCCL's
own log lines, blank lines, text nccl-tests does not print) between any two lines, and runs
`collective --compare` and `calibrate --nccl-tests` on them.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.nccl_logs import Section, section
from tests.unit.test_fuzz_inputs import _finite, _refuse_constant, run

CASES = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
OPS = ("all_reduce", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall")
JUNK = (
    "",
    "   ",
    "node-0:4100:4100 [0] NCCL INFO Bootstrap : Using eth0",
    "node-1:4107:4107 [3] NCCL WARN Cuda failure 'out of memory'",
    "# Out of bounds values : 0 OK",
    "# Avg bus bandwidth    : nan",
    "#  Rank  0 Group  0 Pid   4100 on     node-0 device  0 [0x10] NVIDIA",
    "Warning: something else",
    "1024 256 float sum -1",
)
TIMES = ("0.00", "0", "nan", "-nan", "inf", "-1.5", "N/A", "1e400", "30.00")

sections = st.builds(
    lambda op, sizes, shape, starting, rank_lines, times: Section(op, sizes, *shape, starting, rank_lines, times),
    op=st.sampled_from(OPS),
    sizes=st.lists(st.sampled_from([0, 4, 8, 1024, 65536, 1 << 20, 1 << 26]), min_size=1, max_size=6).map(tuple),
    shape=st.sampled_from([(8, 2), (8, 2), (4, 1), (2, 1)]),  # (ranks, nodes): g4dn.12xlarge holds 4 a node
    starting=st.sampled_from([True, True, False]),
    rank_lines=st.sampled_from([True, True, False]),
    times=st.lists(st.tuples(st.sampled_from([0, 4, 8, 1024, 65536]), st.sampled_from(TIMES)), max_size=3).map(tuple),
)


@st.composite
def logs(draw) -> str:
    """One to three sections (mostly one), with junk lines put between any of their lines."""
    n = draw(st.sampled_from([1, 1, 1, 2, 3]))
    lines = [line for s in draw(st.lists(sections, min_size=n, max_size=n)) for line in section(s).splitlines()]
    for _ in range(draw(st.integers(0, 2))):
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(JUNK)))
    return "\n".join(lines) + "\n"


def _promise(text: str, name: str, argv: list[str]) -> tuple[int, str]:
    """Run `argv` (FILE: the log, written as `name`) and hold it to the promise: (exit status, stdout)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d, name)
        path.write_text(text)
        full = [a.replace("FILE", str(path)) for a in argv]
        code, out, err = run(full)
    lines = [line for line in err.splitlines() if line.strip()]
    shown = f"shardsim {' '.join(full)}\nexit {code}\nstderr:\n{err}\nlog:\n{text}"
    assert "Traceback" not in err and code in (0, 2), shown
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("shardsim"), shown
    else:
        assert len(lines) <= 1 and all(": dropped " in line for line in lines), shown
    return code, out


@pytest.mark.slow
@CASES
@given(
    text=logs(),
    name=st.sampled_from(["run.log", "all_gather_perf.log"]),
    op=st.sampled_from([None, "all_reduce"]),
    nodes=st.sampled_from([None, "2"]),
)
def test_compare_keeps_its_promise_on_any_log(text: str, name: str, op: str | None, nodes: str | None) -> None:
    argv = ["collective", "--topology", "g4dn.12xlarge", "--compare", "FILE", "--json"]
    code, out = _promise(text, name, argv + (["--op", op] if op else []) + (["--nodes", nodes] if nodes else []))
    if code == 0:
        doc = json.loads(out, parse_constant=_refuse_constant)  # strict JSON: no NaN or Infinity
        assert _finite(doc) and doc["rows"], doc
        assert all(r["measured_time_us"] > 0 and r["size_bytes"] > 0 for r in doc["rows"]), doc


@pytest.mark.slow
@settings(CASES, max_examples=12)
@given(text=logs())
def test_calibrate_keeps_its_promise_on_any_log(text: str) -> None:
    argv = ["calibrate", "--topology", "g4dn.12xlarge", "--nccl-tests", "FILE", "--folds", "0"]
    _promise(text, "run.log", [*argv, "--force"])
