"""experiments/validation/gpu/compare.py: the committed GPU figures follow from the committed
profiles and the current compute model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[2] / "experiments" / "validation" / "gpu"


def _compare_module():
    spec = importlib.util.spec_from_file_location("gpu_compare", GPU / "compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


@pytest.mark.parametrize("name", ["vit-630m-bf16", "gpt2-xl-bf16", "vit-630m-fp32"])
def test_committed_gpu_comparison_is_reproduced(name: str) -> None:
    compare = _compare_module()
    precision = name.rsplit("-", 1)[1]
    rows, total = compare.compare(str(GPU / f"profile-{name}.json"), "p5.48xlarge", precision)
    committed = json.loads((GPU / f"compare-{name}.json").read_text())["total"]
    assert total["model_over_measured"] == pytest.approx(committed["model_over_measured"], rel=1e-9)
    assert total["fwd_measured_ms"] + total["bwd_measured_ms"] == pytest.approx(
        sum(r["fwd_measured_ms"] + r["bwd_measured_ms"] for r in rows)
    )
    assert "| **all blocks** |" in compare.to_markdown(rows, total)
