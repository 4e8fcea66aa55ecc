"""The profile document: blocks at each microbatch size, Adam, FSDP2's own work, and (on an
emulated cluster) its links and the cores its ranks get; and writing it."""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path

from shardsim.core.files import atomic_write
from shardsim.runtime.emulation.hostspeed import Probe, SpeedLog
from shardsim.runtime.profile.blocks import block_times, optimizer_step, setup_bench, whole_times
from shardsim.runtime.profile.cores import measure_core_sharing, yardstick
from shardsim.runtime.profile.fsdp import FSDP_WORLD, fsdp_overhead, sharded_optimizer_step
from shardsim.runtime.profile.links import measure_links
from shardsim.runtime.profile.tensor_parallel import tp_shares

# Rounds the whole model is timed in, each through every microbatch size in turn, so that a host
# whose speed changes within seconds does not set one size's figure alone (timed size by size,
# the ratio of two sizes' times varied by nearly half between profiles: experiments/validation/README.md).
WHOLE_ROUNDS = 3


def profile_workload(
    workload: str,
    batch: int | Sequence[int],
    *,
    device: str = "cpu",
    threads: int = 1,
    repeats: int = 9,
    warmup: int = 2,
    precision: str = "fp32",
    fsdp_world: int = FSDP_WORLD,
    tp_layouts: Sequence[tuple[int, bool]] = (),
) -> dict:
    """Forward/backward seconds of every block at each microbatch size in `batch` (per
    microbatch, and per sample at the first size), and Adam seconds per parameter; on CPU, for
    each (tp, sequence_parallel) of `tp_layouts`, a tensor-parallel rank's passes over the
    model's (`tensor_parallel.tp_shares`, at each size: DTensor's dispatch costs the same per op
    at every size, so a smaller microbatch's share is larger).

    Blocks timed one by one pay per-call costs (autograd start-up, a backward seed) that a
    training step pays once: the block times are scaled so that, per size, their forward
    and backward sums equal the whole model's forward (with the loss) and backward, timed
    as training runs them (a named correction; both raw figures are kept in the file)."""
    import torch

    batches = sorted({batch} if isinstance(batch, int) else set(batch))
    ctx = setup_bench(workload, device, threads, precision)
    # every timed pass divided by the host-speed probe read just before it (probe units)
    speed = SpeedLog(Probe() if ctx.device.type == "cpu" else None)
    blocks_of = {b: block_times(ctx, b, repeats, warmup, speed) for b in batches}
    # the whole model, which sets every size's level: the median of WHOLE_ROUNDS rounds' medians
    per_round = max(1, math.ceil(repeats / WHOLE_ROUNDS))
    rounds: dict[int, list[tuple[float, float]]] = {b: [] for b in batches}
    for r in range(WHOLE_ROUNDS):
        for b in batches:
            rounds[b].append(whole_times(ctx, b, per_round, warmup if r == 0 else 1, speed))
    model = ctx.model
    n_params = sum(p.numel() for p in model.parameters())
    t_opt = optimizer_step(ctx, repeats, warmup, speed)
    sharded = fsdp = None
    shares: dict[str, dict[str, list[float]]] = {}
    if ctx.device.type == "cpu":
        if tp_layouts:
            shares = {str(b): tp_shares(workload, b, tp_layouts, repeats, warmup, speed) for b in batches}
        fsdp = fsdp_overhead(ctx, batches[-1], fsdp_world, repeats, warmup, speed)
        t_sharded = sharded_optimizer_step(model, repeats, warmup, speed)
        sharded = None if t_sharded is None else max(0.0, t_sharded - t_opt)
    ref = speed.ref  # every figure at one speed: the probes' mean (1 probe unit = `ref` seconds)
    by_batch, whole = {}, {}
    for b in batches:
        blocks = blocks_of[b]
        fwd = ref * statistics.median(f for f, _ in rounds[b])
        bwd = ref * statistics.median(w for _, w in rounds[b])
        sf, sb = sum(v[0] for v in blocks.values()), sum(v[1] for v in blocks.values())
        whole[str(b)] = {"fwd_s": fwd, "bwd_s": bwd, "blocks_fwd_s": ref * sf, "blocks_bwd_s": ref * sb}
        by_batch[str(b)] = {k: [f * fwd / sf, w * bwd / sb] for k, (f, w) in blocks.items()}
    t_opt *= ref
    sharded = None if sharded is None else sharded * ref
    if fsdp is not None:
        fsdp = {"world": fsdp_world, "batch": batches[-1], "fwd_s": fsdp[0] * ref, "bwd_s": fsdp[1] * ref}
    first = batches[0]
    dev = ctx.device
    return {
        "workload": workload,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "threads": threads if dev.type == "cpu" else None,
        "batch": first,
        "precision": precision,
        "torch": torch.__version__,
        "blocks_by_batch_s": by_batch,
        "whole_model_s": whole,
        "blocks_per_sample_s": {k: [f / first, b / first] for k, (f, b) in by_batch[str(first)].items()},
        "optimizer_per_param_s": t_opt / n_params,
        "sharded_optimizer_overhead_s": sharded,
        "fsdp_overhead_s": fsdp,
        # a tensor-parallel rank's forward and backward over the model's, per layout (2, 2+sp, ...):
        # at the largest microbatch, and at each
        "tp_share": shares.get(str(batches[-1])) or None,
        "tp_share_by_batch": shares or None,
        # runtime.emulation.hostspeed: every figure above is stated at the host speed where its probe takes
        # `probe_s` (each timed pass divided by the probe read before it); the readings
        "probe_s": ref if speed.readings else None,
        "probe_readings_s": speed.readings,
    }


def build_profile(
    workload: str,
    batches: Sequence[int],
    *,
    device: str = "cpu",
    threads: int = 1,
    repeats: int = 9,
    precision: str = "fp32",
    topologies: Sequence[tuple[str, int | None]] = (),
    ranks: Sequence[int] = (),
    tp_layouts: Sequence[tuple[int, bool]] = (),
) -> dict:
    """A whole profile: blocks at each microbatch size; for each emulated topology its measured
    links; and the cores that each count of ranks in `ranks` really gets on this host."""
    host = ranks and device == "cpu"
    # the host's speed while the blocks were timed: yardsticks before and after them and at the
    # end, averaged (a shared host's speed can change within seconds)
    yards = [yardstick(workload, max(batches))] if host else []
    doc = profile_workload(
        workload,
        batches,
        device=device,
        threads=threads,
        repeats=repeats,
        precision=precision,
        fsdp_world=max(ranks, default=FSDP_WORLD),
        tp_layouts=tp_layouts,
    )
    if host:
        yards.append(yardstick(workload, max(batches)))
    if topologies:
        doc["links"] = {name: measure_links(name, nodes) for name, nodes in topologies}
    if host:
        sharing = measure_core_sharing(workload, max(batches), ranks)
        yards.append(yardstick(workload, max(batches)))
        doc["host"] = {
            "cores": os.cpu_count(),
            **sharing,
            "yardstick_all_cores_s": statistics.fmean(yards),
            "yardsticks_s": yards,
        }
    return doc


def write_json_atomic(path: Path, doc: dict) -> None:
    """Write `doc` as indented JSON to `path` (its folder made if missing), atomically."""
    atomic_write(path, json.dumps(doc, indent=2))
