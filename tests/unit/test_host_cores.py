"""One host's cores, shared by every rank of an emulated cluster: what moving bytes costs
them (the engine), the host-speed probe (profile and runtime), and how validate uses it."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from shardsim.runtime import validation
from shardsim.runtime.validation import Row
from shardsim.simulator.engine import chain_bound, simulate
from shardsim.simulator.hardware.profile import parse_profile
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.network.collectives import plan as plan_collective
from shardsim.simulator.network.fairshare import MIN_YIELD_SHARE, fill
from shardsim.simulator.network.links import links_for
from shardsim.simulator.plan import Plan, RankClass
from shardsim.specs.hardware.topology import make_cluster


def test_a_yielding_transfer_takes_what_the_others_leave():
    rows = [[(0, 1.0)], [(0, 3.0)], [(0, 1.0), (1, 2.0)]]
    cap = [2.0, 1.0]
    assert fill(rows, cap, [False, False, False]) == fill(rows, cap)
    x = fill(rows, cap, [False, True, False])
    first = fill([rows[0], rows[2]], cap)  # as if the yielding one were not there
    assert [x[0], x[2]] == first
    assert x[1] == pytest.approx((2.0 - first[0] * 1.0 - first[1] * 1.0) / 3.0)
    # the others fill the link: it still gets its floor
    x = fill([[(0, 4.0)], [(0, 1.0)]], [2.0], [False, True])
    assert x == [0.5, pytest.approx(MIN_YIELD_SHARE * 2.0)]


def _plan(nbytes: float) -> Plan:
    """4 ranks each computing 1 core-second, and at the same time an all-gather over them."""
    p = Plan()
    p.classes = [RankClass("all", 0, 4, 1.0, 1.0, ())]
    p.add(0, "compute", "compute", "work", [], duration=1.0)
    p.add(0, "comm", "comm", "gather", [], coll="all_gather", layout=GroupLayout.world(4), nbytes=nbytes)
    return p


def test_moving_bytes_takes_the_cores_that_compute_shares():
    """On 2 shared cores the compute alone takes 2 s. The all-gather's bytes sent cost kappa
    core-seconds each; it goes first, so it lasts as long as without the charge, and the
    compute ends late by exactly the core-seconds it used over the 2 cores."""
    g = links_for(make_cluster("emu-2x2"))
    nbytes, kappa = 1e7, 1e-8
    (phase,) = plan_collective(g, "all_gather", GroupLayout.world(4), "ring", "gloo")
    assert phase.sent == pytest.approx(3.0)  # 4 ring edges, 3/4 of the array each
    plain = simulate(_plan(nbytes), g, "ring", "gloo", shared_cores=2.0)
    busy = simulate(_plan(nbytes), g, "ring", "gloo", shared_cores=2.0, comm_cpu={"all_gather": kappa})
    assert plain[0].end == pytest.approx(2.0)
    assert busy[1].end == pytest.approx(plain[1].end) and busy[1].end < 2.0  # the gather is unchanged
    assert busy[0].end == pytest.approx(2.0 + kappa * phase.sent * nbytes / 2.0)
    # not one host's cores (a real cluster): no charge
    apart = simulate(_plan(nbytes), g, "ring", "gloo", comm_cpu={"all_gather": kappa})
    assert [s.end for s in apart] == pytest.approx([1.0, plain[1].end])


def _paced(calls: int) -> Plan:
    """4 ranks alternating 0.1 core-seconds of compute with a small all-reduce among them."""
    p = Plan()
    p.classes = [RankClass("all", 0, 4, 1.0, 1.0, ())]
    last: list[int] = []
    for i in range(calls):
        w = p.add(0, "compute", "compute", f"work{i}", last, duration=0.1)
        c = p.add(0, "comm", "comm", f"call{i}", [w], coll="all_reduce", layout=GroupLayout.world(4), nbytes=1e3)
        last = [c]
    return p


def test_on_a_shared_host_every_call_waits_for_unscheduled_ranks_once():
    """With a measured call wait each collective ends exactly that much later (once per call),
    the compute between is unchanged; off one host's cores (a real
    cluster) there is no wait; the chain bound includes it and stays a bound."""
    g = links_for(make_cluster("emu-2x2"))
    plain = simulate(_paced(3), g, "ring", "gloo", shared_cores=2.0)
    waits = simulate(_paced(3), g, "ring", "gloo", shared_cores=2.0, call_wait_s=0.004)
    calls = [(a, b) for a, b in zip(plain, waits, strict=True) if a.kind == "comm"]
    for i, (a, b) in enumerate(calls):
        assert b.end - b.start == pytest.approx(a.end - a.start + 0.004)
        assert b.end == pytest.approx(a.end + 0.004 * (i + 1))
    apart = simulate(_paced(3), g, "ring", "gloo", call_wait_s=0.004)
    assert apart[-1].end == pytest.approx(simulate(_paced(3), g, "ring", "gloo")[-1].end)
    bound = chain_bound(_paced(3), g, "ring", "gloo", shared_cores=2.0, call_wait_s=0.004)
    assert bound == pytest.approx(chain_bound(_paced(3), g, "ring", "gloo", shared_cores=2.0) + 3 * 0.004)
    assert bound <= waits[-1].end + 1e-12


PROFILE = {"workload": "small-gpt", "blocks_by_batch_s": {"4": {"embed": [0.001, 0.002]}}}


def test_the_profile_carries_what_a_call_waits_on_a_shared_host():
    """A topology's measured call wait, 0 where it was not measured; a host slower than when
    it was profiled keeps it (a scheduler's wait, not work); a negative one is bad input."""
    links = {"emu-4x2": {"nic_Bps": 3.4e7, "call_wait_s": 0.0035}}
    prof = parse_profile({**PROFILE, "links": links}, "p.json", "small-gpt")
    assert prof.call_wait_s(make_cluster("emu-4x2")) == 0.0035
    assert prof.call_wait_s(make_cluster("emu-2x2")) == 0.0
    assert prof.slowed(1.5).call_wait_s(make_cluster("emu-4x2")) == 0.0035
    with pytest.raises(Exception, match="links.emu-4x2.call_wait_s"):
        parse_profile({**PROFILE, "links": {"emu-4x2": {"call_wait_s": -1e-3}}}, "p.json", "small-gpt")


def test_the_profile_carries_what_moving_a_byte_costs_the_cores():
    links = {"emu-2x2": {"nic_Bps": 2.4e7, "gather_cpu_s_per_B": 2e-9, "reduce_cpu_s_per_B": 1.5e-9}}
    prof = parse_profile({**PROFILE, "links": links, "probe_s": 0.01}, "p.json", "small-gpt")
    cpu = prof.comm_cpu(make_cluster("emu-2x2"))
    assert cpu == {"all_gather": 2e-9, "broadcast": 2e-9, "send_recv": 2e-9, "all_reduce": 1.5e-9,
                   "reduce_scatter": 1.5e-9}  # fmt: skip
    assert prof.comm_cpu(make_cluster("emu-4x2")) is None  # not measured there
    assert prof.slowed(2.0).comm_cpu(make_cluster("emu-2x2"))["all_reduce"] == pytest.approx(3e-9)
    assert prof.probe_s == 0.01
    bad = {"emu-2x2": {"gather_cpu_s_per_B": -1}}
    with pytest.raises(Exception, match="links.emu-2x2.gather_cpu_s_per_B"):
        parse_profile({**PROFILE, "links": bad}, "p.json", "small-gpt")


def test_a_run_is_predicted_at_the_host_speed_its_probe_saw():
    row = Row("emu-2x2", "ddp", "ddp", 1, 1, 1, "1f1b", 4)
    assert validation.row_slowdown(row, 0.01, 1.3) == (1.3, "yardstick")  # the run has no probe
    row.host_probe_s = 0.012
    assert validation.row_slowdown(row, 0.01, 1.3) == (pytest.approx(1.2), "probe")
    assert validation.row_slowdown(row, None, 1.3) == (1.3, "yardstick")  # nor the profile


def test_each_timed_pass_is_divided_by_the_probe_read_before_it(monkeypatch):
    """A host whose speed changes from pass to pass (each pass costs `base` x the speed the
    probe reads just before it): the median in probe units is `base` exactly; in seconds it
    would be whatever speed the middle pass had."""
    import shardsim.runtime.profile.blocks as blocks

    clock, speeds, now = [0.0], itertools.cycle([1.0, 2.0, 1.5, 3.0, 1.2]), [1.0]

    def speed() -> float:
        now[0] = next(speeds)
        return now[0]

    def work() -> None:
        clock[0] += 0.01 * now[0]

    monkeypatch.setattr(blocks.time, "perf_counter", lambda: clock[0])
    assert blocks.median_time(work, 5, 0, lambda: None, speed) == pytest.approx(0.01)
    now[0] = 2.0
    assert blocks.median_time(work, 5, 0, lambda: None) == pytest.approx(0.02)  # no probe: seconds


def test_the_profile_states_every_figure_at_the_mean_probe(monkeypatch):
    """Every figure comes back in probe units; the profile multiplies all by the readings' mean."""
    import shardsim.runtime.profile.blocks as blocks
    import shardsim.runtime.profile.build as build
    from shardsim.runtime.emulation.hostspeed import SpeedLog

    readings = iter([0.01, 0.03, 0.02, 0.02] * 10)

    class FakeProbe:
        def __call__(self) -> float:
            return next(readings)

    def in_units(value):
        def timed(*args):
            args[-1]()  # one reading, as a timed pass takes
            return value(args[0]) if callable(value) else value

        return timed

    monkeypatch.setattr(build, "Probe", FakeProbe)
    monkeypatch.setattr(build, "block_times", in_units(lambda ctx: {n: (1.0, 2.0) for n in ctx.names}))
    monkeypatch.setattr(build, "whole_times", in_units((10.0, 20.0)))
    monkeypatch.setattr(blocks, "median_time", in_units(4.0))  # the Adam step
    monkeypatch.setattr(build, "sharded_optimizer_step", in_units(6.0))
    monkeypatch.setattr(build, "fsdp_overhead", in_units((3.0, 5.0)))
    doc = build.profile_workload("small-gpt", [4], fsdp_world=4)
    ref = doc["probe_s"]
    assert ref == pytest.approx(sum(doc["probe_readings_s"]) / len(doc["probe_readings_s"]))
    assert ref == SpeedLog(None, doc["probe_readings_s"]).ref and len(set(doc["probe_readings_s"])) > 1
    w = doc["whole_model_s"]["4"]
    assert (w["fwd_s"], w["bwd_s"]) == (pytest.approx(10 * ref), pytest.approx(20 * ref))
    blocks = doc["blocks_by_batch_s"]["4"]  # equal blocks: each a share of the whole
    n = len(blocks)
    assert all(v == [pytest.approx(10 * ref / n), pytest.approx(20 * ref / n)] for v in blocks.values())
    assert doc["sharded_optimizer_overhead_s"] == pytest.approx(2.0 * ref)  # (6 - 4) at one speed
    fsdp = doc["fsdp_overhead_s"]
    assert (fsdp["world"], fsdp["batch"]) == (4, 4)
    assert (fsdp["fwd_s"], fsdp["bwd_s"]) == (pytest.approx(3.0 * ref), pytest.approx(5.0 * ref))
    assert json.loads(json.dumps(doc))["probe_s"] == ref and not math.isnan(ref)


def test_a_speed_read_among_the_ranks_takes_the_cores_cpu_time_not_the_effective_cores():
    """The runtime's probe is read among the ranks, so it holds what sharing caches costs
    them: the cores are then the CPU time the host gives (the effective cores hold that
    slowdown already, and would count it twice)."""
    host = {"cores": 2, "effective_cores": {"4": 1.8}, "cpu_capacity": {"4": 1.9}}
    prof = parse_profile({**PROFILE, "host": host}, "p.json", "small-gpt")
    assert prof.slowed(1.1).cores_for(4, 2) == 1.8
    assert prof.slowed(1.1, among_ranks=True).cores_for(4, 2) == 1.9
    old = parse_profile({**PROFILE, "host": {"cores": 2, "effective_cores": {"4": 1.8}}}, "p.json", "small-gpt")
    assert old.slowed(1.1, among_ranks=True).cores_for(4, 2) == 1.8  # not measured: as before
    with pytest.raises(Exception, match="host.cpu_capacity.x"):
        parse_profile({**PROFILE, "host": {"cpu_capacity": {"x": 1.0}}}, "p.json", "small-gpt")


def test_a_measured_pair_gather_rate_slows_gloo_two_rank_all_gathers_across_the_nic_only():
    """gloo's all-gather over 2-rank groups across the NICs runs at the profile's measured share
    of the ring's rate; a 4-rank all-gather, a 2-rank all-reduce, a 2-rank all-gather inside a
    node, NCCL and a profile without the figure are as before."""
    from shardsim.simulator.network.collectives import phase_time

    base = {"nic_Bps": 2.4e7, "nic_latency_s": 4e-5}
    plain = parse_profile({**PROFILE, "links": {"emu-2x2": base}}, "p.json", "small-gpt")
    paired = parse_profile(
        {**PROFILE, "links": {"emu-2x2": {**base, "nic_pair_gather_Bps": 1.8e7}}}, "p.json", "small-gpt"
    )
    slow, fast = links_for(paired.apply(make_cluster("emu-2x2"))), links_for(plain.apply(make_cluster("emu-2x2")))
    assert slow.cluster.instance.nic.pair_gather_efficiency == pytest.approx(0.75)
    assert fast.cluster.instance.nic.pair_gather_efficiency == 1.0

    def t(g, op, layout, backend="gloo"):
        return sum(phase_time(g, ph, 1.6e7) for ph in plan_collective(g, op, layout, "ring", backend))

    cross = GroupLayout(0, 4, 2, inner=2)  # {0, 2} and {1, 3}: each across the NIC
    assert t(slow, "all_gather", cross) == pytest.approx(t(fast, "all_gather", cross) / 0.75, rel=1e-3)
    for op, layout, backend in [
        ("all_gather", GroupLayout(0, 4, 4), "gloo"),  # the ring over every rank: what nic_Bps is
        ("all_reduce", cross, "gloo"),
        ("all_gather", GroupLayout(0, 4, 2), "gloo"),  # each node's two ranks: loopback
        ("all_gather", cross, "nccl"),
    ]:
        assert t(slow, op, layout, backend) == pytest.approx(t(fast, op, layout, backend))
