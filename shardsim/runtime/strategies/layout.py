"""Where each rank sits: the device mesh of a strategy (the simulator mirrors it exactly).

- ddp: no mesh; DDP over the world group.
- zero: a 1-D mesh ("shard",) over the world.
- zero2d with degree d: a (world/d, d) mesh ("replicate", "shard"); shard groups are
  consecutive ranks (``arange(world).reshape(-1, d)``).
- pipeline: stage-major; stage s holds ranks [s*R, (s+1)*R) with R = world/pp; mesh
  ("pp", "dp") of shape (pp, R), or ("pp", "replicate", "shard") of shape (pp, R/d, d)
  when each stage is sharded over groups of d.

With tensor parallelism (tp > 1) every kind's mesh gains a "tp" dimension: innermost (mesh
order pp,dp,tp: a group's ranks consecutive) or right after "pp" (pp,tp,dp: the data-parallel
dimensions innermost). A pipeline's mesh always has "pp" then (size 1 without pipeline is left out),
ddp's is ("dp", "tp"). `Layout.replica` is the rank's index in the data-parallel dimensions: the
ranks of a tensor-parallel group share it, and so their samples.
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
    tp_mesh: object | None = None  # the 1-D "tp" submesh (tensor parallelism), else None

    @property
    def tp_rank(self) -> int:
        """This rank's index in its tensor-parallel group (0 without TP)."""
        return self.tp_mesh.get_local_rank() if self.tp_mesh is not None else 0  # type: ignore[attr-defined]


def _gloo_options(timeout: timedelta):
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    return opts


MeshOf = Callable[[tuple[int, ...], tuple[str, ...]], object]  # (shape, dim names) → DeviceMesh


def data_dims(kind: str, res: Resolved) -> tuple[tuple[str, int], ...]:
    """The data-parallel dimensions (name, size) of a kind's mesh, outermost first."""
    dp, d = res.dp, res.shard
    if kind == "ddp" or (kind == "pipeline" and d == 1):
        return (("dp", dp),)
    if kind == "zero":
        return (("shard", dp),)
    return (("replicate", dp // d), ("shard", d))


def mesh_dims(kind: str, res: Resolved) -> tuple[tuple[str, int], ...]:
    """A tensor-parallel mesh's dimensions (name, size), outermost first (`mesh_order`)."""
    pp = (("pp", res.pp),) if kind == "pipeline" else ()
    tp = (("tp", res.tp),)
    data = data_dims(kind, res)
    return pp + data + tp if res.tp_inner else pp + tp + data


def tp_layout(kind: str, mesh: MeshOf, res: Resolved, rank: int) -> Layout:
    """A kind's layout with tensor parallelism (see the module docstring)."""
    import numpy as np

    dims = mesh_dims(kind, res)
    names = tuple(n for n, _ in dims)
    shape = tuple(k for _, k in dims)
    m = mesh(shape, names)
    coord = dict(zip(names, (int(c) for c in np.unravel_index(rank, shape)), strict=True))
    data = data_dims(kind, res)
    replica = int(np.ravel_multi_index([coord[n] for n, _ in data], [k for _, k in data]))
    stage = coord.get("pp", 0)
    data_names = tuple(n for n, _ in data)
    sub = m[data_names] if len(data_names) > 1 else m[data_names[0]]  # type: ignore[index]
    fsdp_mesh = sub if kind in ("zero", "zero2d") or (kind == "pipeline" and res.shard > 1) else None
    if kind == "pipeline" and res.shard > 1 and res.shard == res.dp:
        fsdp_mesh = m["shard"]  # type: ignore[index]  # one replica per stage: a 1-D shard mesh, as without TP
    dp_group = m.get_group("dp") if "dp" in names else None  # type: ignore[attr-defined]
    pp_group = m.get_group("pp") if "pp" in names else None  # type: ignore[attr-defined]
    return Layout(m, fsdp_mesh, dp_group, pp_group, stage, replica, m["tp"])  # type: ignore[index]


def ddp_layout(mesh: MeshOf, res: Resolved, rank: int) -> Layout:
    if res.tp > 1:
        return tp_layout("ddp", mesh, res, rank)
    return Layout(None, None, None, None, 0, rank)


def zero_layout(mesh: MeshOf, res: Resolved, rank: int) -> Layout:
    if res.tp > 1:
        return tp_layout("zero", mesh, res, rank)
    m = mesh((res.world,), ("shard",))
    return Layout(m, m, None, None, 0, rank)


def zero2d_layout(mesh: MeshOf, res: Resolved, rank: int) -> Layout:
    if res.tp > 1:
        return tp_layout("zero2d", mesh, res, rank)
    m = mesh((res.world // res.shard, res.shard), ("replicate", "shard"))
    return Layout(m, m, None, None, 0, rank)


def pipeline_layout(mesh: MeshOf, res: Resolved, rank: int) -> Layout:
    """Stage-major: stage s holds ranks [s*R, (s+1)*R)."""
    if res.tp > 1:
        return tp_layout("pipeline", mesh, res, rank)
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
