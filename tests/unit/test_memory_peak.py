"""Memory as the caching allocator sees it: the peak is the larger of the backward's and the
optimizer step's, checked against this repository's measured H100 runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from shardsim.runtime.records import load_run
from shardsim.simulator.calibration.measurements import read_run_json
from shardsim.simulator.memory import MemoryBreakdown
from shardsim.simulator.predict import predict
from shardsim.specs.hardware.topology import Cluster, load_instance

RUNS = Path(__file__).resolve().parents[2] / "experiments" / "validation" / "gpu"


def test_the_peak_is_the_larger_moment_not_the_sum():
    m = MemoryBreakdown(
        1.0, 1.0, 2.0, gathered_gib=0.5, activations_gib=0.25, overhead_gib=0.5, step_temporaries_gib=1.0
    )
    assert m.allocated_gib == pytest.approx(4.0 + 1.0)
    m = replace(m, activations_gib=3.0)
    assert m.allocated_gib == pytest.approx(4.0 + 3.5)


@pytest.mark.parametrize("name", ["run-ddp.json", "run-zero.json"])
def test_the_committed_h100_runs_memory_is_predicted_within_ten_percent(name):
    inst = load_instance("p5.48xlarge")
    one = replace(inst, device=replace(inst.device, count=1))  # the runs used one GPU of the node
    path = RUNS / name
    m = read_run_json(path, "p5.48xlarge", one)
    p = predict(m.cfg, workload=m.workload, cluster=Cluster(one, 1))
    measured = load_run(path).memory_allocated_gib  # torch.cuda.max_memory_allocated
    allocated = p.memory_allocated_gib  # the CUDA context is not the allocator's
    assert abs(allocated / measured - 1) < 0.10, (allocated, measured)
    tensors = sum(p.memory[k] for k in ("params_gib", "grads_gib", "optimizer_gib")) + max(
        p.memory["gathered_gib"] + p.memory["activations_gib"], p.memory["step_temporaries_gib"]
    )
    # the allocator's peaks: its replay of the step (512 B rounding and unsplit rests, then cached
    # blocks); what the device must hold: the reserved peak and the overhead
    assert tensors < allocated < tensors * 1.01 and allocated < p.memory_reserved_gib
    assert p.memory_required_gib == pytest.approx(p.memory_reserved_gib + p.memory["overhead_gib"])
