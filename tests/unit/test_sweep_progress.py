"""A sweep's progress: on stderr, a bar on a terminal, lines with -v
elsewhere, nothing otherwise; with an estimate of the time left."""

from __future__ import annotations

import argparse
import logging

import pytest

from shardsim.cli import main
from shardsim.cli import sweep as sweep_cli
from shardsim.config import RunConfig
from shardsim.simulator.workload.resolve import load_workload
from shardsim.sweep import progress as progress_module
from shardsim.sweep.execute import predict_all
from shardsim.sweep.progress import SweepProgress, format_duration, left_text, time_left
from shardsim.sweep.space import SweepSpace, enumerate_configs


def test_the_time_left_follows_the_share_of_the_work_done() -> None:
    assert time_left(10.0, 0.0) is None
    assert time_left(10.0, 0.25) == pytest.approx(30.0)
    assert time_left(10.0, 1.0) == 0.0
    assert [format_duration(s) for s in (4.4, 59.6, 65, 3725)] == ["4 s", "1 min 00 s", "1 min 05 s", "1 h 02 min"]
    assert left_text(10.0, 0.25, 3, 12) == "about 30 s left"
    assert left_text(0.0, 0.0, 0, 12) == "estimating"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lines(monkeypatch):
    """The progress lines logged, and a clock to move."""
    clock = _Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock)
    got: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    log = logging.getLogger("shardsim")
    handler, level = _Keep(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield got, clock
    log.removeHandler(handler)
    log.setLevel(level)


def test_lines_now_and_then_with_the_time_left(lines) -> None:
    got, clock = lines
    p = SweepProgress("lines")
    p(0, 40, 0.0)
    clock.now += 2
    p(1, 40, 0.1)  # too soon for a line
    clock.now += 8
    p(10, 40, 0.5)  # 10 s for half the work
    clock.now += 10
    p(40, 40, 1.0)
    assert got == [
        "predicting 40 configurations",
        "predicted 10 of 40 configurations in 10 s; about 10 s left",
        "predicted 40 configurations in 20 s",
    ]


def test_the_bar_shows_the_time_left(lines, monkeypatch) -> None:
    got, clock = lines
    with SweepProgress("bar") as p:
        p(0, 40, 0.0)
        assert p.bar is not None and p.bar.tasks[0].fields["left"] == "estimating"
        clock.now += 30
        p(4, 40, 0.75)
        task = p.bar.tasks[0]
        assert (task.completed, task.total, task.fields["left"]) == (4, 40, "about 10 s left")
    assert not p.bar.live.is_started and not got


def test_predict_all_reports_from_zero_to_all_of_the_work() -> None:
    base = RunConfig(workload="tiny-gpt", nodes=1)
    w = load_workload(base.workload, base.shape, base.source)
    cands = enumerate_configs(base, SweepSpace(strategies=("ddp", "zero2d", "zero")), w).candidates
    seen: list[tuple[int, int, float]] = []
    predict_all(cands, w, workers=2, progress=lambda *a: seen.append(a))
    assert [s[0] for s in seen] == list(range(len(cands) + 1)) and seen[0][2] == 0.0
    assert seen[-1][2] == pytest.approx(1.0) and all(a[2] <= b[2] for a, b in zip(seen, seen[1:], strict=False))


def _ns(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"no_progress": False, "json": False, "verbose": 0, "quiet": 0, **kw})


@pytest.mark.parametrize(
    ("tty", "kw", "mode"),
    [
        (True, {}, "bar"),
        (True, {"json": True}, None),
        (True, {"quiet": 1}, None),
        (True, {"no_progress": True}, None),
        (False, {}, None),
        (False, {"verbose": 1}, "lines"),
        (True, {"json": True, "verbose": 1}, "lines"),
        (False, {"verbose": 1, "no_progress": True}, None),
    ],
)
def test_progress_shows_on_a_terminal_or_when_asked(monkeypatch, tty, kw, mode) -> None:
    monkeypatch.setattr(sweep_cli.sys.stderr, "isatty", lambda: tty)
    assert sweep_cli._progress_mode(_ns(**kw)) == mode


def test_a_sweep_with_v_logs_its_progress_and_without_says_nothing(capsys) -> None:
    # 2 configurations, predicted both times (--no-cache: the second would be served from the first)
    argv = "sweep --workload tiny-gpt --nodes 1 --strategies ddp,zero --tp 1 --workers 1 --no-cache".split()
    assert main(argv) == 0
    assert capsys.readouterr().err == ""
    assert main([*argv, "-v"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "shardsim: predicting 2 configurations"
    assert err[-1].startswith("shardsim: predicted 2 configurations in ")
