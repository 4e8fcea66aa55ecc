"""Memory as tools report it: a prediction's allocated (torch max_memory_allocated), reserved
(max_memory_reserved) and process (nvidia-smi) figures per rank; the runtime's reading of the
process total; the committed GPU runs' allocated peaks (reserved and process need a GPU run)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from shardsim.cli import main
from shardsim.config import build_config
from shardsim.core.units import GIB
from shardsim.runtime.records import load_run
from shardsim.runtime.trainer import process_memory_gib, smi_process_mib
from shardsim.simulator import memory as M
from shardsim.simulator.network.nccl_runs import channels
from shardsim.simulator.predict import predict
from shardsim.specs.hardware.topology import Cluster, load_instance, make_cluster

ROOT = Path(__file__).resolve().parents[2]
GPU_RUNS = ROOT / "experiments" / "validation" / "gpu"


def _cfg(**kw):
    base = {"workload": "gpt2-xl", "topology": "p4d.24xlarge", "nodes": 1, "precision": "bf16", "strategy": "zero"}
    return build_config(base | kw, "test")


def test_process_is_reserved_plus_the_context_plus_nccl_buffers_per_communicator():
    p = predict(_cfg())
    parts = p.memory_process
    assert 0 < p.memory_allocated_gib < p.memory_reserved_gib < p.memory_process_gib
    assert p.memory_process_gib == pytest.approx(sum(parts.values()))
    assert parts["cuda_context_gib"] == pytest.approx(M.CUDA_CONTEXT_BYTES["lazy"] / GIB)  # A100: lazy loading
    per_comm = channels(make_cluster("p4d.24xlarge", 1)) * M.RING_PEERS * M.NCCL_BUFFER_BYTES / GIB
    assert parts["nccl_buffers_gib"] == pytest.approx(per_comm)  # one data-parallel group of 8
    hybrid = predict(_cfg(nodes=2, strategy="zero2d", degree=8))  # shard and replicate groups: two
    assert hybrid.memory_process["nccl_buffers_gib"] == pytest.approx(2 * per_comm)
    # what `fits` compares is the process total; cuBLAS's workspace (A100: the default 8.125 MiB) is the allocator's
    assert p.memory_required_gib == pytest.approx(p.memory_process_gib)
    assert p.memory["overhead_gib"] == pytest.approx(parts["cuda_context_gib"] + parts["nccl_buffers_gib"])
    assert M.cublas_workspace_bytes(80) == 4096 * 1024 * 2 + 16 * 1024 * 8 < M.cublas_workspace_bytes(90) == 32 << 20


def test_a_volta_stack_loads_eagerly_and_a_cpu_has_neither_part():
    v100 = predict(_cfg(topology="p3dn.24xlarge", precision="fp32", workload="small-gpt"))
    assert v100.memory_process["cuda_context_gib"] == pytest.approx(M.CUDA_CONTEXT_BYTES["eager"] / GIB)
    cpu = predict(
        build_config({"workload": "tiny-gpt", "topology": "emu-2x2", "precision": "fp32", "backend": "gloo"}, "test")
    )
    assert cpu.memory_process["cuda_context_gib"] == 0 and cpu.memory_process["nccl_buffers_gib"] == 0
    assert cpu.memory_process_gib == pytest.approx(cpu.memory_reserved_gib)


def test_predict_prints_and_carries_all_three(capsys):
    argv = ["predict", "--workload", "gpt2-xl", "--topology", "p4d.24xlarge", "--nodes", "1", "--precision", "bf16"]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"memory_allocated_gib", "memory_reserved_gib", "memory_process_gib", "memory_required_gib"} <= set(d)
    assert set(d["memory_process"]) == {"reserved_gib", "cuda_context_gib", "nccl_buffers_gib"}
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "memory as tools" in text and "(max_memory_reserved)" in text and "(nvidia-smi: + CUDA context" in text


@pytest.mark.parametrize("name", ["ddp", "zero"])
def test_the_committed_gpu_runs_allocated_peak_within_10_percent(name):
    """run-ddp.json / run-zero.json (H100, vit-630m, one rank) recorded max_memory_allocated only:
    their reserved and process totals need a GPU run (`PeakMemory` now records both)."""
    rec = load_run(GPU_RUNS / f"run-{name}.json")
    assert rec.memory_reserved_gib is None and rec.memory_process_gib is None
    inst = load_instance("p5.48xlarge")
    one = Cluster(replace(inst, device=replace(inst.device, count=1)), 1)
    cfg = build_config(
        {"workload": "vit-630m", "topology": "p5.48xlarge", "nodes": 1, "strategy": name, "precision": "bf16",
         "batch_per_device": 8, "checkpointing": "full"}, "test")  # fmt: skip
    p = predict(cfg, cluster=one)
    assert abs(p.memory_allocated_gib / rec.memory_allocated_gib - 1) < 0.10
    assert p.memory_process["nccl_buffers_gib"] == 0  # one rank: no peer, no NCCL buffers


def test_nvidia_smi_output_is_read_for_this_process_only():
    out = "1234, 15000\n999, 7\n1234, 500\n"
    assert smi_process_mib(out, 1234) == 15500 and smi_process_mib(out, 42) is None
    assert smi_process_mib("No running processes found\n", 1234) is None


def test_a_cpu_run_has_no_process_reading():
    import torch

    assert process_memory_gib(torch.device("cpu")) is None
