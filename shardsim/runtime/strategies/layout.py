"""Where each rank sits: the device mesh of a strategy, built from the run's `ParallelDims`
(`Resolved.dims`; the simulator's network groups are the same dims' groups).

The mesh has the dimensions above size 1, in the mesh order (outermost first), plus those a kind
always names: ddp and zero1 ("dp_replicate"; plain DDP over the world, no mesh, where that is
all), zero ("dp_shard", a 1-D mesh over the world), zero2d ("dp_replicate", "dp_shard": shard
groups consecutive ranks, ``arange(world).reshape(-1, d)``), pipeline ("pp", "dp_replicate";
stage s holds ranks [s*R, (s+1)*R) with R = world/pp, and "dp_shard" when each stage is
sharded over groups of d). With tensor parallelism (tp > 1) "tp" is innermost (mesh order
pp,dp,tp: a group's ranks consecutive) or right after "pp" (pp,tp,dp). FSDP shards over the
mesh's data-parallel dimensions (1-D "dp_shard" where there is one replica); DDP runs over
"dp_replicate". `Layout.replica` is the rank's index in the data-parallel dimensions: the ranks
of a tensor-parallel group share it, and so their samples. With expert parallelism (ep > 1) the
mesh has "dp_shard" and "ep" (innermost of the data-parallel dimensions: an EP group's ranks
consecutive, torchtitan's dp_shard_in_ep); the experts shard over "dp_shard" (and replicate over
"dp_replicate"), the rest of the model over a mesh of its own whose "dp_shard_ep" is the two
together; each EP rank has a sample slice of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from shardsim.config import Resolved
from shardsim.specs.parallel_dims import DATA


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
    ep_mesh: object | None = None  # the 1-D "ep" submesh (expert parallelism), else None
    expert_fsdp_mesh: object | None = None  # the (sub)mesh FSDP shards the experts over under EP

    @property
    def tp_rank(self) -> int:
        """This rank's index in its tensor-parallel group (0 without TP)."""
        return self.tp_mesh.get_local_rank() if self.tp_mesh is not None else 0  # type: ignore[attr-defined]


def _gloo_options(timeout: timedelta):
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    return opts


EP_SHARD = "dp_shard_ep"  # "dp_shard" x "ep": the ranks FSDP2 shards the rest of the model over under EP
MeshOf = Callable[[tuple[int, ...], tuple[str, ...]], object]  # (shape, dim names) → DeviceMesh


LayoutOf = Callable[[MeshOf, Resolved, int], Layout]


def dims_layout(keep: tuple[str, ...]) -> LayoutOf:
    """The layout function of a kind whose mesh always names the dimensions `keep` (see the module docstring)."""

    def layout(mesh: MeshOf, res: Resolved, rank: int) -> Layout:
        dims = res.dims
        shape, names = dims.mesh(*keep, *(("dp_shard", "ep") if dims.ep > 1 else ()))
        coords = dims.coords(rank)
        replica = (coords["dp_replicate"] * dims.dp_shard + coords["dp_shard"]) * dims.ep + coords["ep"]
        if names == ("dp_replicate",):
            return Layout(None, None, None, None, 0, replica)  # plain DDP over the world group
        m = mesh(shape, names)
        fsdp_mesh = expert_mesh = ep_mesh = None
        if "dp_shard" in names:
            data = tuple(n for n in names if n in DATA and (dims.size(n) > 1 or n == "dp_shard"))
            fsdp_mesh = m if data == names else m[data if len(data) > 1 else data[0]]  # type: ignore[index]
        if dims.ep > 1:
            expert_mesh, ep_mesh = fsdp_mesh, m["ep"]  # type: ignore[index]
            dense = tuple(n for n in data if n != "dp_shard")
            fsdp_mesh = mesh((*(dims.size(n) for n in dense), dims.dp_shard * dims.ep), (*dense, EP_SHARD))
        replicated = "dp_replicate" in names and "dp_shard" not in names
        ddp = replicated and (dims.dp_replicate > 1 or "tp" in names)
        dp_group = m.get_group("dp_replicate") if ddp else None  # type: ignore[attr-defined]
        pp_group = m.get_group("pp") if "pp" in names else None  # type: ignore[attr-defined]
        tp_mesh = m["tp"] if "tp" in names else None  # type: ignore[index]
        return Layout(m, fsdp_mesh, dp_group, pp_group, coords["pp"], replica, tp_mesh, ep_mesh, expert_mesh)

    return layout


ddp_layout = dims_layout(("dp_replicate",))
zero_layout = dims_layout(("dp_shard",))
zero2d_layout = dims_layout(DATA)
pipeline_layout = dims_layout(("pp", "dp_replicate"))


def build_layout(layout: LayoutOf, res: Resolved, rank: int, device_type: str, timeout: timedelta) -> Layout:
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
