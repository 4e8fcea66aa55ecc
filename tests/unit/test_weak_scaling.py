"""Weak scaling on GPU clusters: throughput per GPU falls as the cluster grows (stragglers: the
slowest of N ranks sets the pace; the cross-node collectives' latency grows with the ranks)."""

from __future__ import annotations

import pytest

from shardsim.config import RunConfig
from shardsim.simulator.gpu_kernels import slowest_of
from shardsim.simulator.predict import predict


def test_the_slowest_of_n_ranks_grows_with_n():
    assert slowest_of(1, 0.05) == 1.0
    assert slowest_of(64, 0.0) == 1.0
    s = [slowest_of(n, 0.05) for n in (2, 8, 128, 512, 16384)]
    assert s == sorted(s) and s[0] > 1.0
    assert slowest_of(512, 0.05) - 1 == pytest.approx(0.05 * 3.04, rel=0.02)  # E[max of 512 normals] ≈ 3.04


@pytest.mark.parametrize("topology", ["p4d.24xlarge", "p5.48xlarge"])
def test_fsdp_throughput_per_gpu_falls_from_128_to_512_gpus(topology):
    def per_gpu(nodes: int) -> float:
        cfg = RunConfig(workload="mpt-7b", topology=topology, nodes=nodes, precision="bf16", batch_per_device=8,
                        checkpointing="full")  # fmt: skip
        p = predict(cfg)
        return p.samples_per_s / p.world

    loss = 1 - per_gpu(64) / per_gpu(16)
    assert 0.015 < loss < 0.10, loss
