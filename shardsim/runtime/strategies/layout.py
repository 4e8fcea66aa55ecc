"""Where each rank sits: the device mesh of a strategy (the simulator mirrors it exactly).

- ddp: no mesh; DDP over the world group.
- zero: a 1-D mesh ("shard",) over the world.
- zero2d with degree d: a (world/d, d) mesh ("replicate", "shard"); shard groups are
  consecutive ranks (``arange(world).reshape(-1, d)``).
- pipeline: stage-major; stage s holds ranks [s*R, (s+1)*R) with R = world/pp; mesh
  ("pp", "dp") of shape (pp, R), or ("pp", "replicate", "shard") of shape (pp, R/d, d)
  when each stage is sharded over groups of d.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from shardsim.config import Resolved


@dataclass(frozen=True)
class Layout:
    """Where this rank sits: its device mesh and the named groups the strategies use."""

    mesh: object | None  # DeviceMesh, or None for plain DDP over the world
    fsdp_mesh: object | None  # the (sub)mesh FSDP shards over (1-D shard or 2-D replicate x shard)
    dp_group: object | None  # DDP's process group (None = the world)
    pp_group: object | None  # this rank's pipeline (one rank per stage)
    stage: int  # pipeline stage of this rank (0 without pipeline)
    replica: int  # index of this rank's data-parallel slice (its chunk of the global batch)


def _gloo_options(timeout: timedelta):
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    return opts


MeshOf = Callable[[tuple[int, ...], tuple[str, ...]], object]  # (shape, dim names) → DeviceMesh


def ddp_layout(mesh: MeshOf, res: Resolved, rank: int) -> Layout:
    return Layout(None, None, None, None, 0, rank)


def zero_layout(mesh: MeshOf, res: Resolved, rank: int) -> Layout:
    m = mesh((res.world,), ("shard",))
    return Layout(m, m, None, None, 0, rank)


def zero2d_layout(mesh: MeshOf, res: Resolved, rank: int) -> Layout:
    m = mesh((res.world // res.shard, res.shard), ("replicate", "shard"))
    return Layout(m, m, None, None, 0, rank)


def pipeline_layout(mesh: MeshOf, res: Resolved, rank: int) -> Layout:
    """Stage-major: stage s holds ranks [s*R, (s+1)*R)."""
    d, pp = res.shard, res.pp
    R = res.world // pp
    stage, replica = divmod(rank, R)
    if d > 1:
        m = mesh((pp, R // d, d), ("pp", "replicate", "shard"))
        fsdp_mesh = m["shard"] if R == d else m["replicate", "shard"]  # type: ignore[index]
        return Layout(m, fsdp_mesh, None, m.get_group("pp"), stage, replica)  # type: ignore[attr-defined]
    m = mesh((pp, R), ("pp", "dp"))
    return Layout(m, None, m.get_group("dp") if R > 1 else None, m.get_group("pp"), stage, replica)  # type: ignore[attr-defined]


def build_layout(
    layout: Callable[[MeshOf, Resolved, int], Layout], res: Resolved, rank: int, device_type: str, timeout: timedelta
) -> Layout:
    """Create the device mesh of a strategy with its `layout` function (`init_device_mesh`;
    all ranks must call this together).

    Sub-groups of a mesh default to a 30-minute timeout; they get the job's timeout here so
    that a hung peer ends the job as quickly in a sub-group as in the world group."""
    from torch.distributed.device_mesh import init_device_mesh

    world = res.world
    backend = dist.get_backend()

    def mesh(shape: tuple[int, ...], names: tuple[str, ...]):
        override = None
        if shape == (world,):
            pass  # a 1-D mesh over the world reuses the world group (it has the job's timeout)
        elif backend == "gloo":
            override = {n: _gloo_options(timeout) for n in names}
        elif backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            override = {n: opts for n in names}
        return init_device_mesh(device_type, shape, mesh_dim_names=names, backend_override=override)

    return layout(mesh, res, rank)
