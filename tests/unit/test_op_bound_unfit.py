"""The op bound keeps out of a sweep only what it would simulate: a configuration beyond it that
does not fit in memory is a row of its memory (never planned), one that fits is dropped."""

from __future__ import annotations

import math

import pytest

from shardsim.config import load_config
from shardsim.simulator import predict as predict_module
from shardsim.simulator import scale
from shardsim.simulator.scale import plan_ops_estimate
from shardsim.simulator.workload.resolve import load_workload
from shardsim.sweep.space import OVER_OP_BOUND, SweepSpace, enumerate_configs, unfit
from shardsim.sweep.task import predict_row

BOUND = 157  # below every configuration of the space: each is beyond it


def test_beyond_the_bound_what_does_not_fit_is_kept_and_what_fits_is_dropped(monkeypatch) -> None:
    base = load_config(
        None,
        {"workload": "llama-3.1-8b", "topology": "p5.48xlarge", "nodes": 1, "precision": "bf16", "seq_len": 8192},
    )
    space = SweepSpace(strategies=("zero", "pipeline"), pp=(2, 4), microbatches=(1, 8), tp_degrees=(1, 2))
    w = load_workload(base.workload, base.shape, base.source)
    every = enumerate_configs(base, space, w).candidates
    assert all(plan_ops_estimate(c.cfg, len(w.layers)) > BOUND for c in every)
    out = {c.label for c in every if unfit(c.cfg, c.cluster, w)}
    assert out and len(out) < len(every)
    monkeypatch.setattr(scale, "MAX_PLAN_OPS", BOUND)
    got = enumerate_configs(base, space, w)
    assert {c.label for c in got.candidates} == out
    assert got.dropped_kinds[OVER_OP_BOUND] == len(every) - len(out)
    monkeypatch.setattr(predict_module, "build_plan", lambda *a, **k: pytest.fail("planned beyond the bound"))
    for c in got.candidates:
        row = predict_row(c, w, "auto")
        assert not row["fits"] and math.isnan(row["step_time_s"]), c.label
