"""experiments/calibration/fit_defaults.py: the shipped training figures (topologies/fitted/training.yaml)
are what it fits to the calibration data in the repository, rounded as it states."""

from __future__ import annotations

import importlib.util
import re
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from shardsim.specs.hardware.topology import TRAINING_FIGURES, fitted_training_figures

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "calibration" / "fit_defaults.py"


def _script():
    spec = importlib.util.spec_from_file_location("fit_defaults", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


@pytest.fixture(scope="module")
def fitted():
    """The script and its fit to the repository's data (about 20 CPU-seconds: one fit for the module)."""
    fd = _script()
    return fd, fd.fit_figures()


@pytest.mark.slow
def test_the_shipped_file_is_the_fit_of_the_repositorys_data(fitted):
    fd, fig = fitted
    assert fd.differences(fd.render(fig), fd.SHIPPED) == []
    assert fitted_training_figures()[0] == fig.shipped


@pytest.mark.slow
def test_rounding_moves_no_figure_by_a_tenth_of_its_standard_error(fitted):
    _, fig = fitted
    for name in TRAINING_FIGURES:
        assert abs(fig.shipped[name] - fig.value[name]) < 0.1 * fig.stderr[name], name


@pytest.mark.parametrize("matmul", [0.777215, 0.7765, 0.77749, 0.6, 0.8686])
def test_the_gemm_fraction_is_the_largest_whose_rate_is_not_above_the_fit(matmul):
    fd, bench = _script(), Decimal("0.8686")
    g = fd.gemm_fraction(matmul, float(bench))
    rate = Decimal(str(round(matmul, 3)))
    assert g.as_tuple().exponent == -3
    assert g * bench <= rate < (g + Decimal("0.001")) * bench


def test_check_names_each_line_that_differs(tmp_path):
    fd = _script()
    text = fd.SHIPPED.read_text()
    path = tmp_path / "training.yaml"
    path.write_text(text)
    assert fd.differences(text, path) == []
    changed = re.sub(r"value: [0-9.]+", "value: 0.5", text, count=1)
    diff = fd.differences(changed, path)
    assert [d[0] for d in diff if d[:1] in "+-" and d[:3] not in ("---", "+++")] == ["-", "+"]
    assert any(d.startswith("+") and "value: 0.5" in d for d in diff)
    assert fd.differences(text, tmp_path / "missing.yaml")  # a missing file differs from any text
