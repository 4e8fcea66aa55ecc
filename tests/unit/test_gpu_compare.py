"""experiments/validation/gpu/compare.py puts each profiled block's measured times (the committed
GPU profiles, its input) beside the compute model's for that GPU, and totals them. That the
committed compare-*.json and .md are what it gives today is checked by
experiments/check_regenerated.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from shardsim.simulator.hardware.profile import load_profile
from shardsim.simulator.workload.resolve import load_workload

GPU = Path(__file__).resolve().parents[2] / "experiments" / "validation" / "gpu"


def _compare_module():
    spec = importlib.util.spec_from_file_location("gpu_compare", GPU / "compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


@pytest.mark.parametrize("name", ["vit-630m-bf16", "gpt2-xl-bf16", "vit-630m-fp32"])
def test_each_profiled_block_is_put_beside_the_model_and_totalled(name: str) -> None:
    compare = _compare_module()
    precision = name.rsplit("-", 1)[1]
    path = GPU / f"profile-{name}.json"
    rows, total = compare.compare(str(path), "p5.48xlarge", precision)
    w = load_workload(json.loads(path.read_text())["workload"])
    prof = load_profile(str(path), w.name)
    batch = max(prof.blocks)
    flops = {b.name: (b.fwd_flops + b.bwd_flops) * batch for b in w.blocks}
    assert [r["block"] for r in rows] == [b.name for b in w.blocks if prof.block_time(b.name, batch)]
    for r in rows:
        fwd, bwd = prof.block_time(r["block"], batch)
        assert (r["fwd_measured_ms"], r["bwd_measured_ms"]) == (fwd * 1e3, bwd * 1e3)
        model = r["fwd_model_ms"] + r["bwd_model_ms"]
        assert r["model_over_measured"] == pytest.approx(model / (r["fwd_measured_ms"] + r["bwd_measured_ms"]))
        assert r["achieved_tflops"] == pytest.approx(flops[r["block"]] / (fwd + bwd) / 1e12)
    for side in ("fwd_measured_ms", "fwd_model_ms", "bwd_measured_ms", "bwd_model_ms"):
        assert total[side] == pytest.approx(sum(r[side] for r in rows))
    measured = total["fwd_measured_ms"] + total["bwd_measured_ms"]
    assert total["model_over_measured"] == pytest.approx((total["fwd_model_ms"] + total["bwd_model_ms"]) / measured)
    assert total["blocks"] == len(rows)
    assert total["blocks_within_15pct"] == sum(abs(r["model_over_measured"] - 1) <= 0.15 for r in rows)
    md = compare.to_markdown(rows, total)
    assert f"| **all blocks** | {total['fwd_measured_ms']:.2f} ms |" in md
    assert f"model / measured (forward + backward): {total['model_over_measured']:.3f};" in md
