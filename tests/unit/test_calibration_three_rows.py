"""Calibration from three rows (experiments/calibration/three_rows.py): 3 one-node rows of one
model size of the A100 table (shortest, median and longest sequence), fitted with calibrate's
procedure, predict the other sizes' rows better than the defaults they start from, for every
size with enough rows, when the defaults were not fitted to this table; from the shipped
defaults (fitted to all 78 rows, the held-out ones included: an in-sample bar) the prior keeps
3 rows from doing much harm. The figures: experiments/calibration/three_rows.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "calibration" / "three_rows.py"
HARM_POINTS = 5.0  # most a fit to 3 in-sample rows may add to the shipped defaults' held-out MAE (a guard)


def _script():
    spec = importlib.util.spec_from_file_location("three_rows", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


@pytest.fixture(scope="module")
def script():
    return _script()


@pytest.mark.slow
def test_three_rows_of_one_size_predict_the_other_sizes_better_than_untrained_defaults(script):
    trials = script.run(starts=("untrained",))
    assert [t.size for t in trials] == list(script.SIZES)
    for t in trials:
        assert len(t.seq_lens) == 3 and t.held_out >= 67
        assert t.mae_fitted < t.mae_defaults, t
        assert t.mae_fitted < 0.5 * t.mae_defaults, t  # at least halved: 32-36 % down to 5-15 %
        assert "attention_efficiency" not in t.held or t.size == "mpt-13b", t  # 13b's longest: 8,192


@pytest.mark.slow
def test_from_the_shipped_defaults_three_rows_do_little_harm(script):
    for t in script.run(starts=("shipped",)):
        assert t.mae_fitted < t.mae_defaults + HARM_POINTS, t


def test_the_rule_picks_shortest_median_longest_on_one_node(script):
    from shardsim.simulator.calibration.measurements import read_measurements
    from shardsim.specs.hardware.topology import load_instance

    rows = read_measurements(script.CSV, script.TOPOLOGY, load_instance(script.TOPOLOGY))
    picked = script.pick(rows, "mpt-1b")
    assert [m.info["seq_len"] for m in picked] == [512, 4096, 32768]
    assert all(m.info["gpus"] == 8 and m.info["model"] == "mpt-1b" for m in picked)
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "calibration-3-rows.csv"
    lines = example.read_text().splitlines()
    assert len(lines) == 4 and lines[0] == script.CSV.read_text().splitlines()[0]
    assert all(line in script.CSV.read_text().splitlines() for line in lines[1:])  # rows of the table as they are
