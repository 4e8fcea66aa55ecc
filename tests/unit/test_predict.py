"""Step prediction: invariants that must hold whatever the calibration."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from shardsim.cli import main
from shardsim.config import RunConfig, Strategy, load_config
from shardsim.simulator.predict import predict
from shardsim.specs.hardware.topology import Cluster
from shardsim.specs.model.library import PRESETS
from shardsim.specs.model.workload import Block, Workload
from tests.helpers import instance

SEED = RunConfig()  # vit-630m, 8 x g4dn.12xlarge, batch 4, fp32, checkpointing, zero


def uniform_workload(layers: int = 8) -> Workload:
    blocks = tuple(
        Block(
            f"layer{i}",
            params=1000,
            fwd_flops=1e9,
            bwd_flops=2e9,
            fwd_mem_elems=0.0,
            act_elems=10.0,
            in_elems=1.0,
            out_elems=1.0,
        )
        for i in range(layers)
    )
    return Workload("uniform", blocks)


def fast_cluster(nodes: int, devices: int = 1) -> Cluster:
    inst = instance(devices=devices, nic_gbps=1e12, port_GBps=1e12, nic_latency_us=0.0, fabric_latency_us=0.0)
    return Cluster(inst, nodes)


@pytest.mark.parametrize(("P", "M"), [(2, 4), (4, 4), (4, 8), (8, 16)])
def test_gpipe_bubble_fraction_on_infinitely_fast_links(P: int, M: int) -> None:
    cfg = RunConfig(
        workload="uniform",
        topology="x",
        nodes=P,
        batch_per_device=M // P if M % P == 0 else M,
        strategy=Strategy("pipeline", pp=P, microbatches=M, schedule="gpipe"),
        checkpointing=False,
    )
    cfg = cfg.replace(batch_per_device=M)  # per-replica batch = M * P: divisible by M
    p = predict(cfg, workload=uniform_workload(8), cluster=fast_cluster(P))
    busy = p.step_time_s - p.breakdown["optimizer_s"]
    assert p.breakdown["bubble_s"] / busy == pytest.approx((P - 1) / (M + P - 1), rel=0.01)
    assert p.breakdown["exposed_comm_s"] == pytest.approx(0.0, abs=1e-9)


def test_1f1b_has_the_same_bubble_as_gpipe_but_less_memory() -> None:
    base = RunConfig(
        workload="uniform",
        topology="x",
        nodes=4,
        batch_per_device=8,
        checkpointing=False,
        strategy=Strategy("pipeline", pp=4, microbatches=8, schedule="gpipe"),
    )
    g = predict(base, workload=uniform_workload(8), cluster=fast_cluster(4))
    o = predict(
        base.replace(strategy=base.strategy.replace(schedule="1f1b")),
        workload=uniform_workload(8),
        cluster=fast_cluster(4),
    )
    assert o.step_time_s == pytest.approx(g.step_time_s, rel=1e-6)
    assert o.memory["activations_gib"] < g.memory["activations_gib"]


def test_zero2d_with_degree_world_is_zero() -> None:
    z = predict(SEED)
    z2 = predict(SEED.replace(strategy=Strategy("zero2d", degree=32)))
    assert z2.to_dict() == z.to_dict()


@pytest.mark.parametrize(
    "strategy",
    [Strategy("zero"), Strategy("zero2d", degree=4), Strategy("ddp"), Strategy("pipeline", pp=4, microbatches=4)],
)
def test_faster_inter_node_links_never_slow_a_step(strategy: Strategy) -> None:
    untied = replace(PRESETS["bert-large"], tied_embeddings=False)  # its pipeline with the other kinds' parameters
    cfg = SEED.replace(workload=untied, strategy=strategy)
    times = []
    for gbps in (25, 50, 100, 400):
        inst = instance(devices=4, nic_gbps=gbps, fabric="pcie", port_GBps=15.75, shared_GBps=31.5, memory_gib=80)
        times.append(predict(cfg, cluster=Cluster(inst, 8)).step_time_s)
    assert all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:], strict=False))
    assert times[-1] < times[0]


def test_zero2d_memory_falls_as_degree_grows() -> None:
    mems = [predict(SEED.replace(strategy=Strategy("zero2d", degree=d))).memory_allocated_gib for d in (1, 2, 4, 8, 16)]
    mems.append(predict(SEED).memory_allocated_gib)
    assert all(b < a for a, b in zip(mems, mems[1:], strict=False))


@pytest.mark.parametrize(
    "strategy",
    [Strategy("zero"), Strategy("zero2d", degree=4), Strategy("ddp"), Strategy("pipeline", pp=2, microbatches=4)],
)
def test_a_step_is_never_faster_than_its_compute(strategy: Strategy) -> None:
    p = predict(SEED.replace(strategy=strategy))
    b = p.breakdown
    assert p.step_time_s >= b["compute_s"]
    total = b["compute_s"] + b["exposed_comm_s"] + b["bubble_s"] + b["optimizer_s"]
    assert total == pytest.approx(p.step_time_s, rel=1e-6)


def test_prediction_is_deterministic() -> None:
    cfg = SEED.replace(strategy=Strategy("pipeline", pp=4, microbatches=8, degree=2))
    assert predict(cfg).to_json() == predict(cfg).to_json()


def test_gradient_accumulation_all_reduces_only_at_the_boundary() -> None:
    one = predict(SEED.replace(strategy=Strategy("zero2d", degree=4)))
    two = predict(SEED.replace(strategy=Strategy("zero2d", degree=4), grad_accum=2))
    assert two.collectives["all_reduce"] == one.collectives["all_reduce"]
    assert two.collectives["all_gather"] == 2 * one.collectives["all_gather"]
    assert two.global_batch == 2 * one.global_batch


def test_big_model_does_not_fit_and_says_why() -> None:
    p = predict(SEED.replace(workload="gpt2-xl", strategy=Strategy("ddp")))
    assert not p.fits
    assert "GiB" in p.fit_reason


def test_cli_json_has_the_promised_keys(capsys) -> None:
    assert main(["predict", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in (
        "step_time_s",
        "samples_per_s",
        "tflops_per_device",
        "mfu",
        "memory_allocated_gib",
        "memory_reserved_gib",
        "memory_required_gib",
        "device_memory_gib",
        "fits",
    ):
        assert key in d
    assert set(d["breakdown"]) >= {"compute_s", "exposed_comm_s", "bubble_s", "optimizer_s"}


def test_cli_trace_is_a_chrome_trace(tmp_path) -> None:
    out = tmp_path / "t.json"
    assert main(["predict", "--strategy", "pipeline", "--pp", "4", "--microbatches", "4", "--trace", str(out)]) == 0
    doc = json.loads(out.read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1, 2, 3}
    assert any("send act" in e["name"] for e in spans)


def test_seed_config_files_load() -> None:
    a = load_config("experiments/seed/zero.yaml")
    b = load_config("experiments/seed/zero2d-4.yaml")
    assert predict(a).world == 32
    assert predict(b).label == "zero2d d=4"
