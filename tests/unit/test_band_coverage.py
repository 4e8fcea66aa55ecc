"""The band covers the truth: leave-one-group-out on the A100 calibration table (by model size)
and on the project's own measured runs (experiments/validation, by run), as
experiments/readings/band_coverage.py computes them (experiments/readings/band-coverage.md);
and the model's own error by device and stack."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.simulator.calibration import coverage as C
from shardsim.simulator.calibration.band import PSEUDO_ROWS, pooled_error
from shardsim.simulator.model_error import NOT_MEASURED, ModelError, collective_error, step_error, total_sigma

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "readings" / "band_coverage.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("band_coverage", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_held_out_model_sizes_of_the_a100_table_are_covered(script):
    log_ratio, jac, groups, stated = script.table_rows()
    assert len(set(groups)) >= 8 and stated.measured
    errors, bands = C.linear_held_out(log_ratio, jac, groups, stated)
    cov = C.coverage(errors, bands, groups)
    assert 0.60 <= cov.one_sigma <= 0.80 and 0.90 <= cov.two_sigma <= 0.99, cov
    # the parameters' share alone is narrower: the model's own error is what widens it
    assert np.all(C.linear_held_out(log_ratio, jac, groups, None)[1] < bands)


def test_held_out_runs_of_the_projects_own_measurements_are_covered(script):
    errors, groups = script.validation_rows()
    cov = C.coverage(errors, C.stated_held_out(errors, groups), groups)
    assert cov.rows >= 100 and cov.groups >= 10
    assert 0.60 <= cov.one_sigma <= 0.80 and 0.90 <= cov.two_sigma <= 0.99, cov


def test_the_stated_errors_are_the_measured_ones(script):
    """The figures model_error states for the emulated clusters are those of the committed rows."""
    errors, _ = script.validation_rows()
    assert step_error("host CPU share").sigma == pytest.approx(math.sqrt(np.mean(errors**2)), abs=0.0015)


def test_what_was_not_measured_says_so_and_borrows_nothing():
    a100 = step_error("NVIDIA A100 SXM4 40GB", "pytorch")
    assert a100.measured and "experiments/calibration" in a100.source
    for err in (
        step_error("NVIDIA T4"),
        step_error("NVIDIA V100 SXM2 32GB"),
        step_error("NVIDIA A100 SXM4 40GB", "smp"),  # a stack never seen
        collective_error("p5.48xlarge", 1),  # within one node: not what was measured
        collective_error("p4d.24xlarge", 2),
        collective_error("p5.48xlarge", 2, "gloo"),
    ):
        assert not err.measured and err.sigma == NOT_MEASURED > 2 * a100.sigma
        assert "not measured here" in err.text()
    assert collective_error("p5.48xlarge", 4).measured


@settings(derandomize=True, max_examples=50, deadline=None)
@given(
    stated=st.floats(0.01, 0.3),
    residuals=st.lists(st.floats(-0.5, 0.5), min_size=0, max_size=40),
    fitted=st.integers(0, 3),
)
def test_the_pooled_error_lies_between_the_stated_and_the_rows_own(stated, residuals, fitted):
    r = np.array(residuals)
    pooled = pooled_error(ModelError(stated, True, "s", "x"), r, fitted).sigma
    dof = max(len(r) - fitted, 0)
    if dof == 0:  # no row beyond the fitted parameters: the stated error, and what the rows miss by
        assert pooled == pytest.approx(math.sqrt(stated**2 + float(r @ r) / PSEUDO_ROWS))
    else:
        own = math.sqrt(float(r @ r) / dof)
        assert min(stated, own) - 1e-12 <= pooled <= max(stated, own) + 1e-12


def test_errors_add_as_independent_ones():
    assert total_sigma(0.03, 0.04) == pytest.approx(0.05) and total_sigma() == 0
