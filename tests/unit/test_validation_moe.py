"""A validation row of a model with experts: the routing its runs had (the records'
`expert_imbalance`) is what its prediction assumes, not the configuration's ideal 1.0."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

import shardsim.simulator.predict as predicting
from shardsim.runtime.validation import load_matrix, measure
from shardsim.runtime.validation.rows import add_attempt, row_for
from shardsim.specs.hardware.topology import make_cluster
from tests.helpers import run_record

MATRIX = Path(__file__).resolve().parents[2] / "shardsim" / "data" / "matrices" / "moe.yaml"


def test_a_row_keeps_the_mean_imbalance_over_layers_and_attempts():
    cfg = load_matrix(MATRIX).configs[1]
    row = row_for(cfg, make_cluster("emu-2x2"))
    assert math.isnan(row.moe_imbalance)
    add_attempt(row, run_record(expert_imbalance=[1.2, 1.4, 1.6]))
    assert row.moe_imbalance == pytest.approx(1.4)
    add_attempt(row, run_record(expert_imbalance=[1.0, 1.2]))
    assert row.moe_imbalance == pytest.approx((1.4 + 1.1) / 2)
    dense = row_for(cfg, make_cluster("emu-2x2"))
    add_attempt(dense, run_record())  # no experts: no imbalance
    assert math.isnan(dense.moe_imbalance)


def test_the_prediction_assumes_the_measured_imbalance(monkeypatch):
    matrix = load_matrix(MATRIX)
    cluster = make_cluster("emu-2x2")
    rows = [row_for(cfg, cluster) for cfg in matrix.configs]
    for row in rows:
        add_attempt(row, run_record(expert_imbalance=[1.5, 1.7]))
    asked: list[float] = []

    def fake_predict(cfg, profile=None):
        asked.append(cfg.moe_imbalance)
        return SimpleNamespace(
            step_time_s=1.0, breakdown={"compute_s": 1.0, "exposed_comm_s": 0.0}, memory_allocated_gib=0.1
        )

    monkeypatch.setattr(predicting, "predict", fake_predict)  # what `rescore` imports when it runs
    profile = SimpleNamespace(probe_s=None, slowed=lambda *a, **k: None)
    v = measure._Validation(matrix, Path("."), Path("."), 1, print, profile, matrix.configs, rows, yard_batch=4)
    v.rescore_all()
    assert asked == pytest.approx([1.6] * len(rows))
    assert all(cfg.moe_imbalance == 1.0 for cfg in matrix.configs)  # the matrix's own stay ideal
    assert all(row.predicted_s == 1.0 for row in rows)


def test_the_moe_matrix_predicts_every_row_and_imbalance_slows_the_expert_parallel_ones():
    for cfg in load_matrix(MATRIX).configs:
        ideal = predicting.predict(cfg).step_time_s
        skewed = predicting.predict(cfg.replace(moe_imbalance=1.5)).step_time_s
        assert skewed > ideal if cfg.strategy.ep > 1 else skewed == pytest.approx(ideal), cfg.strategy.label()
