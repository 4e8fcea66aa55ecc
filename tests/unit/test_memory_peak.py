"""Memory as the caching allocator sees it: the peak is the larger of the backward's and the
optimizer step's, checked against this repository's measured H100 runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from shardsim.simulator.calibration.measurements import read_run_json
from shardsim.simulator.hardware.topology import Cluster, load_instance
from shardsim.simulator.memory import MemoryBreakdown
from shardsim.simulator.predict import predict

RUNS = Path(__file__).resolve().parents[2] / "experiments" / "validation" / "gpu"


def test_the_peak_is_the_larger_moment_not_the_sum():
    m = MemoryBreakdown(
        1.0, 1.0, 2.0, gathered_gib=0.5, activations_gib=0.25, overhead_gib=0.5, step_temporaries_gib=1.0
    )
    assert m.total_gib == pytest.approx(4.5 + 1.0)
    m = replace(m, activations_gib=3.0)
    assert m.total_gib == pytest.approx(4.5 + 3.5)


@pytest.mark.parametrize("name", ["run-ddp.json", "run-zero.json"])
def test_the_committed_h100_runs_memory_is_predicted_within_ten_percent(name):
    inst = load_instance("p5.48xlarge")
    one = replace(inst, device=replace(inst.device, count=1))  # the runs used one GPU of the node
    path = RUNS / name
    m = read_run_json(path, "p5.48xlarge", one)
    p = predict(m.cfg, workload=m.workload, cluster=Cluster(one, 1))
    measured = json.loads(path.read_text())["memory_per_rank_gib"]  # torch.cuda.max_memory_allocated
    allocated = p.memory["total_gib"] - p.memory["overhead_gib"]  # the CUDA context is not the allocator's
    assert abs(allocated / measured - 1) < 0.10, (allocated, measured)
    # what the device must hold: the peak with the allocator's reserve and the runtime overhead
    assert p.memory_per_rank_gib == pytest.approx(allocated * 1.05 + p.memory["overhead_gib"])
