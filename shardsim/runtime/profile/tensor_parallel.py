"""A tensor-parallel rank's compute on CPU, over the whole model's: its passes timed under a fake
process group (collectives that move nothing), so what is left is its shards' GEMMs and DTensor's
dispatch of every op, which a profile of the model's blocks does not see."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence

from shardsim.runtime.profile.blocks import unit_speed


def tp_key(tp: int, sequence_parallel: bool) -> str:
    """A layout's key in a profile's `tp_share`: ``2`` or ``2+sp``."""
    return f"{tp}+sp" if sequence_parallel else str(tp)


def tp_shares(
    workload: str,
    batch: int,
    layouts: Sequence[tuple[int, bool]],
    repeats: int = 9,
    warmup: int = 2,
    speed: Callable[[], float] = unit_speed,
) -> dict[str, list[float]]:
    """{tp_key: [forward, backward]}: a tensor-parallel rank's whole-model forward (with the
    loss) and backward over the unsharded model's, one microbatch of `batch`, each pair of
    passes timed back to back and the medians of the ratios taken. {} when this process already
    has a process group (it is left alone)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return {}
    return {tp_key(tp, sp): list(_share(workload, batch, tp, sp, repeats, warmup, speed)) for tp, sp in layouts}


def _share(workload: str, batch: int, tp: int, sp: bool, repeats: int, warmup: int, speed) -> tuple[float, float]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shardsim.runtime.models.build import build
    from shardsim.runtime.strategies.tensor_parallel import apply_tp, loss_context

    dist.init_process_group("fake", rank=0, world_size=tp, store=FakeStore())
    try:
        plain = build(workload, 0, tp=tp)
        sharded = apply_tp(build(workload, 0, tp=tp), init_device_mesh("cpu", (tp,)), sequence_parallel=sp)
        x, y = plain.sample_batch(batch, generator=torch.Generator().manual_seed(0))

        def passes(model, ctx) -> tuple[float, float]:
            s = speed()
            t0 = time.perf_counter()
            with ctx():
                loss = model.loss(model(x), y)
                t1 = time.perf_counter()
                loss.backward()
            t2 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            return (t1 - t0) / s, (t2 - t1) / s

        mine = lambda: loss_context(tp)  # noqa: E731  (vocabulary-parallel cross-entropy)
        for _ in range(warmup):
            passes(plain, contextlib.nullcontext)
            passes(sharded, mine)
        fwd, bwd = [], []
        for _ in range(repeats):
            pf, pb = passes(plain, contextlib.nullcontext)
            sf, sb = passes(sharded, mine)
            fwd.append(sf / pf)
            bwd.append(sb / pb)
        return statistics.median(fwd), statistics.median(bwd)
    finally:
        dist.destroy_process_group()
