"""Trace the collectives PyTorch really issues for one training step, in one process.

PyTorch's fake process group pretends to be rank 0 of any world size; under
FakeTensorMode no real memory is allocated, so FSDP2 over 1,024 ranks traces in about a
second. Both spellings of each collective are recorded (FSDP2 in torch 2.13 calls
`all_gather_single` / `reduce_scatter_single`). The simulator's plan is compared with
this trace by test.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from shardsim.core.files import atomic_write
from shardsim.runtime.trainer import Observer, Trainer

_KINDS = {
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
    "_all_gather_base": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "all_reduce": "all_reduce",
}


TRACE_ENV = "SHARDSIM_TRACE_COLLECTIVES"  # DIR: each rank of a real run writes DIR/rank<r>.json


@dataclass(frozen=True, order=True)
class TracedCollective:
    kind: str  # all_gather | reduce_scatter | all_reduce
    numel: int  # the whole array as nccl-tests counts it (gather output, scatter input)
    group_size: int
    itemsize: int = field(default=0, compare=False)  # bytes per element (not saved in rank traces)


@contextlib.contextmanager
def record_collectives() -> Iterator[list[TracedCollective]]:
    """Patch torch.distributed's collectives (every spelling) to record kind, size, group."""
    calls: list[TracedCollective] = []
    originals = {}

    def wrap(name: str, orig):
        def recorder(*args, **kwargs):
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            group = kwargs.get("group")
            if group is None:
                group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
            size = dist.get_world_size(group)
            big = max(tensors, key=lambda t: t.numel(), default=None)
            numel, itemsize = (big.numel(), big.element_size()) if big is not None else (0, 0)
            calls.append(TracedCollective(_KINDS[name], int(numel), int(size), int(itemsize)))
            return orig(*args, **kwargs)

        return recorder

    for name in _KINDS:
        if hasattr(dist, name):
            originals[name] = getattr(dist, name)
            setattr(dist, name, wrap(name, originals[name]))
    try:
        yield calls
    finally:
        for name, orig in originals.items():
            setattr(dist, name, orig)


def save_rank_trace(folder: str, rank: int, steps: list[list[TracedCollective]]) -> None:
    """Write one rank's collectives, one list per measured step, to ``folder/rank<r>.json``."""
    os.makedirs(folder, exist_ok=True)
    data = {"rank": rank, "steps": [[[c.kind, c.numel, c.group_size] for c in step] for step in steps]}
    atomic_write(Path(folder, f"rank{rank}.json"), json.dumps(data))


class TraceCollectives(Observer):
    """A real run's observer: the collectives of each measured step, saved to
    ``folder/rank<r>.json`` after the steps (installed by `runtime.testing` for ``SHARDSIM_TRACE_COLLECTIVES``)."""

    def __init__(self, folder: str, rank: int, warmup: int):
        self.folder, self.rank, self.warmup = folder, rank, warmup
        self.steps: list[list[TracedCollective]] = []
        self._recording: contextlib.ExitStack | None = None

    def step_started(self, i: int) -> None:
        if i >= self.warmup:
            self._recording = contextlib.ExitStack()
            self.steps.append(self._recording.enter_context(record_collectives()))

    def step_computed(self, i: int) -> None:
        if self._recording is not None:
            self._recording.close()
            self._recording = None

    def after_steps(self, trainer: Trainer) -> dict:
        save_rank_trace(self.folder, self.rank, self.steps)
        return {}


def load_rank_trace(folder: str | Path, rank: int) -> list[list[TracedCollective]]:
    """The collectives `save_rank_trace` wrote for `rank`, per measured step."""
    data = json.loads(Path(folder, f"rank{rank}.json").read_text())
    return [[TracedCollective(k, int(n), int(g)) for k, n, g in step] for step in data["steps"]]


def trace_fsdp_step(
    build: Callable[[], nn.Module],
    world: int,
    shard: int,
    apply_fsdp: Callable,
    *,
    batch: int = 2,
    grad_accum: int = 1,
) -> list[TracedCollective]:
    """Collectives of one optimizer step of `build()` under FSDP2 on a (world/shard, shard)
    mesh ((world,) when shard == world), traced with the fake process group."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        if shard == world:
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
        else:
            mesh = init_device_mesh("cpu", (world // shard, shard), mesh_dim_names=("replicate", "shard"))
        with FakeTensorMode(), record_collectives() as calls:
            model = build()
            apply_fsdp(model, mesh)
            for k in range(grad_accum):
                last = k == grad_accum - 1
                if hasattr(model, "set_requires_all_reduce"):
                    model.set_requires_all_reduce(last)
                x, y = model.sample_batch(batch)
                model.loss(model(x), y).backward()
        return list(calls)
    finally:
        dist.destroy_process_group()
