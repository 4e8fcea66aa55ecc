"""What the committed schedules validation (experiments/validation/schedules) says about the
model's under-prediction, from its files only (nothing runs): per rank, the CPU seconds a step
measured against the core-seconds the model's plan gives it; the step the measured CPU bounds
(its sum over the host's cores); and how each row's error moves when the point-to-point figures
or a per-pass cost change (what-ifs on a copy of the profile, each row at its own host speed as
`validate` predicts it). Reading: experiments/readings/pipeline-schedules.md.

    python experiments/readings/pipeline_cpu_gap.py
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import shardsim.simulator.strategies.pipeline as single
import shardsim.simulator.strategies.virtual_pipeline as multi
from shardsim.config import RunConfig
from shardsim.runtime.validation.matrix import load_matrix
from shardsim.runtime.validation.resume import load_rows
from shardsim.runtime.validation.rows import Row, pooled_slowdown, row_for, row_slowdown
from shardsim.simulator.hardware.profile import Profile, load_profile
from shardsim.simulator.predict import predict, prepare
from shardsim.specs.hardware.topology import make_cluster

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "experiments" / "validation" / "schedules"
MATRIX = ROOT / "shardsim" / "data" / "matrices" / "schedules.yaml"


Measured = tuple[RunConfig, Row, Profile, float]  # a row's configuration, row, profile at its speed, slowdown


def measured_rows() -> list[Measured]:
    """Each measured row with its profile at its host speed, as `validate` rescores it."""
    prof = load_profile(str(OUT / "profile.json"), "small-gpt")
    rows = load_rows(OUT)
    pooled = pooled_slowdown(rows)
    by_label = {r.label: r for r in rows}
    out = []
    for cfg in load_matrix(MATRIX).configs:
        r = by_label.get(row_for(cfg, make_cluster(cfg.topology, cfg.nodes, cfg.gpus_per_node)).label)
        if r is not None:
            slow, src = row_slowdown(r, prof.probe_s, pooled)
            out.append((cfg, r, prof.slowed(slow, among_ranks=src == "probe"), slow))
    return out


def cpu_table(rows: list[Measured]) -> None:
    """Per rank: measured CPU seconds a step (the run's process time) against the plan's compute
    and optimizer core-seconds; the step the measured CPU bounds on the profile's cores."""
    print("| schedule | rank CPU measured (s) | model core-s | measured − model | CPU bound | predicted | measured |")
    print("|---|---|---|---|---|---|---|")
    for cfg, r, prof, _ in rows:
        plan = prepare(cfg, profile=prof).plan()
        model = [0.0] * len(plan.classes)
        for op in plan.ops:
            if op.kind in ("compute", "optimizer"):
                model[op.rank_class] += op.duration
        run = json.loads((OUT / "runs" / f"{r.run_id}.json").read_text())
        cpu = [statistics.fmean(x) for x in run["step_cpu_times_by_rank_s"]]
        bound = sum(cpu) / prof.cpu_capacity[len(cpu)]
        gap = [c - m for c, m in zip(cpu, model, strict=True)]
        print(
            f"| {cfg.strategy.schedule} | {_fmt(cpu)} | {_fmt(model)} | {_fmt(gap)} | {bound:.3f} s "
            f"| {r.predicted_s:.3f} s | {r.measured_s:.3f} s |"
        )


def _fmt(xs: list[float]) -> str:
    return " ".join(f"{x:.3f}" for x in xs)


def errors(rows: list[Measured], change: Callable[[Profile], Profile] = lambda p: p, pass_s: float = 0.0) -> str:
    """Each row's error with its profile changed by `change` and `pass_s` seconds of CPU (at
    profile speed) before every F, B, I and W."""
    out = []
    for cfg, r, prof, slow in rows:
        with per_pass(pass_s * slow):
            t = predict(cfg, profile=change(prof)).step_time_s
        out.append(f"{100 * (t - r.measured_s) / r.measured_s:+.1f} %")
    return " | ".join(out)


def links(**factors: float) -> Callable[[Profile], Profile]:
    """The profile with emu-2x2's measured link figures multiplied by `factors`."""

    def change(prof: Profile) -> Profile:
        lp = prof.links["emu-2x2"]
        lp = replace(lp, **{k: getattr(lp, k) * v for k, v in factors.items()})
        return replace(prof, links={**prof.links, "emu-2x2": lp})

    return change


def slower_nic_latency(add_s: float) -> Callable[[Profile], Profile]:
    def change(prof: Profile) -> Profile:
        lp = prof.links["emu-2x2"]
        return replace(prof, links={**prof.links, "emu-2x2": replace(lp, nic_latency_s=lp.nic_latency_s + add_s)})

    return change


@contextmanager
def per_pass(seconds: float) -> Iterator[None]:
    """Within: every pipeline pass (the plan's DDP forward or backward of a stage) preceded by
    an op of `seconds` on its rank's compute stream."""
    saved = [(mod, mod.ddp_forward, mod.ddp_backward) for mod in (single, multi)]

    def wrap(f):
        def g(p, rc, cm, cfg, mb, pc, start, *a, **k):
            start = p.add(rc, "compute", "compute", "pass overhead", [start], duration=seconds)
            return f(p, rc, cm, cfg, mb, pc, start, *a, **k)

        return g

    if seconds > 0:
        for mod, fwd, bwd in saved:
            mod.ddp_forward, mod.ddp_backward = wrap(fwd), wrap(bwd)
    try:
        yield
    finally:
        for mod, fwd, bwd in saved:
            mod.ddp_forward, mod.ddp_backward = fwd, bwd


@contextmanager
def split_costs(factor: float) -> Iterator[None]:
    """Within: a zero-bubble pass (I or W) costs `factor` times its share of the block's backward."""
    block = multi.BackwardPart.block

    def slower(self, b, batch):
        c = block(self, b, batch)
        return replace(c, bwd_s=c.bwd_s * factor)

    multi.BackwardPart.block = slower
    try:
        yield
    finally:
        multi.BackwardPart.block = block


def main() -> None:
    rows = measured_rows()
    cpu_table(rows)
    print()
    print("| what-if | " + " | ".join(cfg.strategy.schedule for cfg, *_ in rows) + " |")
    print("|---|" + "---|" * len(rows))
    print("| as profiled | " + errors(rows) + " |")
    print("| NIC rate x0.5 | " + errors(rows, links(nic_Bps=0.5, nic_pair_gather_Bps=0.5)) + " |")
    print("| NIC latency +5 ms | " + errors(rows, slower_nic_latency(0.005)) + " |")
    print("| call wait x5 | " + errors(rows, links(call_wait_s=5.0)) + " |")
    for ms in (1.0, 2.0):
        print(f"| +{ms:.0f} ms CPU a pass | " + errors(rows, pass_s=ms / 1e3) + " |")
    with split_costs(1.22):
        print("| I + W = 1.22 B | " + errors(rows) + " |")
        print("| I + W = 1.22 B, +1 ms CPU a pass | " + errors(rows, pass_s=1e-3) + " |")


if __name__ == "__main__":
    main()
