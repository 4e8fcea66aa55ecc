"""Two things a rank's cores lose that a timed block does not show: FSDP2's own work (copies in
and out of its collectives' buffers, hooks), measured with collectives that move nothing and
charged where FSDP2 does it; and the hypervisor's share of the host (steal), read around each
step and taken off the cores the ranks share."""

from __future__ import annotations

import dataclasses
import json

import pytest

from shardsim.config import RunConfig, Strategy
from shardsim.core.errors import ConfigError
from shardsim.runtime import validation
from shardsim.runtime.emulation.hostspeed import StealClock
from shardsim.runtime.validation import measure
from shardsim.simulator.compute import ComputeModel, FsdpCpu
from shardsim.simulator.hardware.profile import load_profile, parse_profile
from shardsim.simulator.predict import predict
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import make_cluster
from tests.helpers import plan_ops, run_record
from tests.unit.test_validation import PROFILE, _profile, no_namespaces, write


def _cfg(**strategy) -> RunConfig:
    return RunConfig(workload="small-gpt", topology="emu-2x2", nodes=2, batch_per_device=4, precision="fp32",
                     checkpointing=False, backend="gloo", strategy=Strategy(**strategy))  # fmt: skip


def _compute_s(prof, **strategy) -> dict[int, float]:
    """Each rank class's compute ops summed (their work in seconds, before the cores are shared)."""
    out: dict[int, float] = {}
    for op in plan_ops(_cfg(**strategy), prof):
        if op.kind == "compute":
            out[op.rank_class] = out.get(op.rank_class, 0.0) + op.duration
    return out


def test_fsdp2s_own_work_is_charged_where_fsdp2_does_it(tmp_path):
    """A forward all-gathers every unit once and a backward all-gathers the blocks again and
    reduce-scatters every unit: a zero or zero2d rank's step of one microbatch pays the measured
    forward and backward overheads exactly. DDP and a replicated pipeline pay nothing; a sharded
    pipeline stage gathers its units again in every microbatch's forward, so it pays more."""
    base = load_profile(_profile(tmp_path), "small-gpt")
    fwd, bwd = 0.03, 0.05
    extra = dataclasses.replace(base, fsdp_overhead_s=(fwd, bwd))
    for kind in (dict(kind="zero"), dict(kind="zero2d", degree=2)):
        assert _compute_s(extra, **kind)[0] == pytest.approx(_compute_s(base, **kind)[0] + fwd + bwd, rel=1e-9)
    for kind in (dict(kind="ddp"), dict(kind="pipeline", pp=2, microbatches=4, schedule="1f1b")):
        assert _compute_s(extra, **kind) == pytest.approx(_compute_s(base, **kind))
    sharded = dict(kind="pipeline", pp=2, degree=2, microbatches=4, schedule="1f1b")
    with_extra, without = _compute_s(extra, **sharded), _compute_s(base, **sharded)
    added = [with_extra[s] - without[s] for s in without]
    assert all(x > 0 for x in added) and sum(added) > fwd + bwd
    # and the step takes longer by it
    assert predict(_cfg(kind="zero"), profile=extra).step_time_s > predict(_cfg(kind="zero"), profile=base).step_time_s


def test_the_overheads_split_into_a_cost_per_gathered_and_per_reduced_parameter(tmp_path):
    w = load_workload("small-gpt")
    layers = sum(b.params for b in w.layers)
    prof = dataclasses.replace(load_profile(_profile(tmp_path), "small-gpt"), fsdp_overhead_s=(0.03, 0.05))
    cm = ComputeModel(make_cluster("emu-2x2").instance.device, "fp32", prof)
    got = cm.fsdp_cpu(w.params, layers)
    assert got.gather_s_per_param == pytest.approx(0.03 / w.params)
    assert got.gather_s_per_param * layers + got.reduce_s_per_param * w.params == pytest.approx(0.05)
    # a backward cheaper than its gathers (noise): no negative cost
    low = dataclasses.replace(prof, fsdp_overhead_s=(0.03, 0.001))
    assert ComputeModel(cm.device, "fp32", low).fsdp_cpu(w.params, layers).reduce_s_per_param == 0.0
    assert ComputeModel(cm.device, "fp32", None).fsdp_cpu(w.params, layers) == FsdpCpu()  # not measured


def test_the_profile_reads_checks_and_scales_fsdp2s_own_work():
    doc = PROFILE | {"fsdp_overhead_s": {"world": 8, "batch": 4, "fwd_s": 0.03, "bwd_s": 0.05}}
    prof = parse_profile(doc, "p.json", "small-gpt")
    assert prof.fsdp_overhead_s == (0.03, 0.05)
    assert prof.slowed(2.0).fsdp_overhead_s == pytest.approx((0.06, 0.1))
    assert parse_profile(PROFILE, "p.json", "small-gpt").fsdp_overhead_s is None
    for bad in ({"fwd_s": -1, "bwd_s": 0.05}, {"fwd_s": 0.03}, [0.03, 0.05]):
        with pytest.raises(ConfigError, match="fsdp_overhead_s"):
            parse_profile(PROFILE | {"fsdp_overhead_s": bad}, "p.json", "small-gpt")


def test_fsdp2s_own_work_is_timed_with_collectives_that_move_nothing():
    """The real measurement on a tiny model: two figures >= 0, the model it compared with left
    unsharded, no process group left behind, denormals as they were; none inside a process group."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from shardsim.runtime.launch import free_port
    from shardsim.runtime.profile.blocks import setup_bench
    from shardsim.runtime.profile.fsdp import fsdp_overhead

    ctx = setup_bench("tiny-gpt", "cpu", 1, "fp32")
    got = fsdp_overhead(ctx, 2, 4, repeats=1, warmup=1)
    assert got is not None and len(got) == 2 and all(v >= 0 for v in got)
    assert not dist.is_initialized()
    assert not any(isinstance(p, DTensor) for p in ctx.model.parameters())
    assert (torch.tensor([1e-40]) * 1.0).item() != 0.0  # denormals are numbers again
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        assert fsdp_overhead(ctx, 2, 4, repeats=1, warmup=0) is None
    finally:
        dist.destroy_process_group()


def _stat(path, steal: int, busy: int, idle: int) -> None:
    # cpu user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
    path.write_text(f"cpu {busy} 0 0 {idle} 0 0 0 {steal} 7 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")


def test_the_steal_clock_reads_the_part_of_the_hosts_cores_the_hypervisor_took(tmp_path):
    stat = tmp_path / "stat"
    _stat(stat, steal=100, busy=1000, idle=5000)
    clock = StealClock(str(stat))
    clock.start()
    _stat(stat, steal=150, busy=1150, idle=5200)  # 50 ticks stolen, 150 busy, 200 idle
    got = clock.stop()
    assert got is not None and got.share == pytest.approx(50 / 400) and got.cores > 0
    clock.start()
    got = clock.stop()  # nothing ran: nothing taken
    assert got is not None and got.share == 0.0 and got.cores == 0.0
    missing = StealClock(str(tmp_path / "none"))
    missing.start()
    assert missing.stop() is None


def test_a_run_whose_cores_the_hypervisor_took_is_predicted_on_fewer_cores():
    host = {"cores": 2, "effective_cores": {"4": 1.8}, "cpu_capacity": {"4": 1.9}, "steal_share": {"4": 0.05}}
    prof = parse_profile(PROFILE | {"host": host}, "p.json", "small-gpt")
    assert prof.steal_share == {4: 0.05}
    assert prof.slowed(1.0, among_ranks=True, steal_share=0.24).cores_for(4, 2) == pytest.approx(1.9 * 0.76 / 0.95)
    assert prof.slowed(1.0, among_ranks=True, steal_share=None).cores_for(4, 2) == 1.9  # not read: as measured
    assert prof.slowed(1.0, steal_share=0.05).cores_for(4, 2) == pytest.approx(1.8)  # the profile's own share
    cfg = _cfg(kind="pipeline", pp=2, microbatches=4, schedule="1f1b")  # compute-bound: it shows
    calm, stolen = (predict(cfg, profile=prof.slowed(1.0, True, s)).step_time_s for s in (0.05, 0.3))
    assert stolen > calm * 1.1
    with pytest.raises(ConfigError, match="host.steal_share.4"):
        parse_profile(PROFILE | {"host": {"steal_share": {"4": -0.1}}}, "p.json", "small-gpt")


def test_validate_predicts_each_run_with_the_steal_it_saw(tmp_path, monkeypatch):
    no_namespaces(monkeypatch)
    doc = json.loads(_profile(tmp_path).read_text())
    doc["probe_s"] = 0.01
    doc["host"]["cpu_capacity"] = {"4": 1.9}
    prof = write(tmp_path, "p.json", json.dumps(doc))
    runs = {"ddp": 0.0, "zero": 0.3}

    def fake_measure(cfg, matrix, cluster, runs_dir, threads):
        label = cfg.strategy.label()
        return run_record(run_id=label, step_time_s=1.0, step_times_s=[1.0] * 4, host_probe_s=0.012,
                          host_steal_share=runs[label]), ""  # fmt: skip

    monkeypatch.setattr(measure, "run_config", fake_measure)
    text = "workload: small-gpt\ncheckpointing: false\nretries: 0\ntopologies: {emu-2x2: [ddp, zero]}\n"
    matrix = validation.load_matrix(write(tmp_path, "m.yaml", text))
    rows, _ = validation.validate(matrix, tmp_path / "o", profile=str(prof))
    profile = load_profile(prof, "small-gpt")
    for cfg, r in zip(matrix.configs, rows, strict=True):
        assert r.host_steal_share == runs[r.label] and r.host_quiet == (runs[r.label] <= 0.1)
        want = predict(cfg, profile=profile.slowed(1.2, among_ranks=True, steal_share=runs[r.label]))
        assert r.predicted_s == pytest.approx(want.step_time_s)
    zero = predict(matrix.configs[1], profile=profile.slowed(1.2, among_ranks=True, steal_share=0.0))
    assert rows[1].predicted_s > zero.step_time_s
    # resumed: the steal is kept with the row
    again, _ = validation.validate(matrix, tmp_path / "o", profile=str(prof))
    assert [r.host_steal_share for r in again] == [0.0, 0.3]


def test_a_runs_summary_says_how_fast_the_host_was_and_what_the_hypervisor_took():
    from shardsim.runtime.train import _summary_text

    r = run_record(workload="small-gpt", step_time_min_s=0.9, step_time_max_s=1.1, lab=None)
    assert "host" not in _summary_text(r, None)  # a GPU run: no lab readings
    text = _summary_text(run_record(host_probe_s=0.0172, host_steal_cores=0.31), None)
    assert "speed probe 17.20 ms" in text and "took 0.31 cores' worth" in text


def test_adam_is_timed_on_real_gradients(monkeypatch):
    """Adam on zero gradients took 2.6 times as long as on real ones here: the profile times
    both optimizer steps (plain and FSDP2's) after a real backward."""
    import torch

    import shardsim.runtime.profile.blocks as blocks
    import shardsim.runtime.profile.build as build
    import shardsim.runtime.profile.fsdp as fsdp

    seen: list[bool] = []

    def timed(fn, *args, **kwargs):
        opt = getattr(fn, "__self__", None)
        if isinstance(opt, torch.optim.Optimizer):
            grads = [p.grad for g in opt.param_groups for p in g["params"]]
            local = [g.to_local() if hasattr(g, "to_local") else g for g in grads if g is not None]
            seen.append(len(local) == len(grads) and all(bool(g.abs().sum() > 0) for g in local))
        return 1.0

    monkeypatch.setattr(blocks, "median_time", timed)
    monkeypatch.setattr(fsdp, "median_time", timed)
    monkeypatch.setattr(build, "block_times", lambda ctx, *a: {n: (1.0, 2.0) for n in ctx.names})
    monkeypatch.setattr(build, "whole_times", lambda *a: (10.0, 20.0))
    monkeypatch.setattr(build, "fsdp_overhead", lambda *a: (0.0, 0.0))
    doc = build.profile_workload("tiny-gpt", [2], repeats=1, warmup=0)
    assert seen == [True, True]  # Adam, then Adam on FSDP2's parameters
    assert doc["sharded_optimizer_overhead_s"] == 0.0
