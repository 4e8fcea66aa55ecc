"""Shared test helpers: synthetic topologies built in code; a configuration's plan; a run's record."""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from shardsim.config import RunConfig, Strategy
from shardsim.runtime.processes import alive
from shardsim.runtime.records import LAB_KEYS, LabReadings, RunRecord
from shardsim.simulator.hardware.profile import Profile
from shardsim.simulator.results import strategy_key
from shardsim.specs.hardware.topology import Cluster, InstanceType, parse_instance


def instance(
    *,
    devices: int = 1,
    nic_gbps: float = 100.0,
    nic_count: int = 1,
    nic_latency_us: float = 5.0,
    fabric: str = "nvswitch",
    port_GBps: float = 100.0,
    fabric_latency_us: float = 1.0,
    shared_GBps: float | None = None,
    memory_gib: float = 16.0,
    name: str = "test-node",
) -> InstanceType:
    fab = {"kind": fabric, "port_GBps": port_GBps, "efficiency": 1.0, "latency_us": fabric_latency_us}
    if shared_GBps:
        fab["shared_GBps"] = shared_GBps
    data = {
        "name": name,
        "device": {
            "model": "TestGPU",
            "count": devices,
            "memory_gib": memory_gib,
            "memory_bandwidth_GBps": 1000.0,
            "memory_efficiency": 1.0,
            "peak_tflops": {"fp32": 10.0, "fp16": 100.0, "bf16": 100.0},
            "matmul_efficiency": {"fp32": 1.0, "fp16": 1.0, "bf16": 1.0},
        },
        "fabric": fab,
        "nic": {"count": nic_count, "rate_gbps": nic_gbps, "efficiency": 1.0, "latency_us": nic_latency_us},
        "host": {"cores": 8, "memory_gib": 64},
    }
    return parse_instance(data, "<test>")


def one_tier(nodes: int, nic_gbps: float = 100.0, latency_us: float = 5.0) -> Cluster:
    """n nodes of one device each: every edge crosses exactly one NIC pair (one tier)."""
    return Cluster(instance(devices=1, nic_gbps=nic_gbps, nic_latency_us=latency_us), nodes)


def plan_ops(cfg: RunConfig, profile: Profile | None = None) -> list:
    """The ops of `cfg`'s plan on its topology (block times from `profile` when given)."""
    from shardsim.config import resolve
    from shardsim.simulator.compute import ComputeModel
    from shardsim.simulator.strategies.build import build_plan
    from shardsim.simulator.workload.resolve import load_workload
    from shardsim.specs.hardware.topology import make_cluster

    w = load_workload(cfg.workload)
    cluster = make_cluster(cfg.topology, cfg.nodes)
    cfg, res = resolve(cfg, cluster.world, len(w.layers))
    return build_plan(cfg, res, w, ComputeModel(cluster.instance.device, cfg.precision, profile)).ops


def run_record(**fields: Any) -> RunRecord:
    """A run's record: small-gpt, zero over emu-2x2's 4 ranks, 3 steps of 1 s, on CPU; `fields` replace
    any of it, `LabReadings`' fields among them (set in its `lab`; the strategy's key follows the
    `world` given)."""
    cfg = RunConfig(workload="small-gpt", topology="emu-2x2", nodes=2, backend="gloo", strategy=Strategy("zero"))
    base: dict[str, Any] = dict(
        run_id="run", finished_at="2026-01-01T00:00:00+00:00", config=cfg.to_dict(), topology=cfg.topology,
        nodes=cfg.nodes, world=4, device="cpu", workload=cfg.workload,
        strategy=strategy_key(cfg.strategy, fields.get("world", 4)), label="zero", nproc_per_node=4, global_batch=16,
        steps=3, warmup=1, step_time_s=1.0, step_time_min_s=1.0, step_time_max_s=1.0, step_time_iqr_s=0.0,
        step_time_std_s=0.0, step_times_s=[1.0] * 3, warmup_times_s=[1.5], step_cpu_times_s=[1.0] * 3,
        samples_per_s=16.0, memory_allocated_gib=0.5, memory_reserved_gib=None,
        memory_allocated_by_rank_gib=[0.5] * 4, memory_measure="cpu_peak_rss",
        backend="gloo", lab=LabReadings(threads_per_rank=1), losses=[8.5, 8.5, 8.45, 8.4], loss_first=8.5,
        loss_last=8.4, torch_version="2.13.0", hostname="host",
    )  # fmt: skip
    lab = {k: fields.pop(k) for k in LAB_KEYS if k in fields}
    if lab:
        fields["lab"] = dataclasses.replace(fields.get("lab", base["lab"]), **lab)
    return RunRecord(**(base | fields))


def gone_within(pids: Iterable[int], seconds: float) -> bool:
    """Whether every one of `pids` has ended within `seconds` (polled every 20 ms)."""
    pids = list(pids)
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def private_device(path: Path, major: int = 1, minor: int = 7) -> Path:
    """A character device node at `path` (default 1, 7: a private /dev/full; 1, 3: /dev/null),
    never the machine's own; the test is skipped where mknod is not allowed (it needs root)."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("mknod is not allowed here")
    return path
