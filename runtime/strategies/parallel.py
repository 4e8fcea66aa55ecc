"""One small function per parallelism, applied to a plain model (torchtitan style).

A model here is anything with ``blocks`` (an ``nn.ModuleList`` or ``nn.ModuleDict`` of the
units FSDP wraps and pipelines split), optionally ``embed`` and ``head``. Nothing in this
module touches a process group except through PyTorch's own engines, so `apply_fsdp` also
runs under the fake process group (the simulator's collective trace uses it).

Rank layout (the simulator mirrors it exactly):
- zero: a 1-D mesh ("shard",) over the world.
- zero2d with degree d: a (world/d, d) mesh ("replicate", "shard"); shard groups are
  consecutive ranks (``arange(world).reshape(-1, d)``).
- pipeline: stage-major; stage s holds ranks [s*R, (s+1)*R) with R = world/pp; mesh
  ("pp", "dp") of shape (pp, R), or ("pp", "replicate", "shard") of shape (pp, R/d, d)
  when each stage is sharded over groups of d.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from shardsim.simulator.config import Resolved
from shardsim.simulator.workload.model import stage_ranges
from torch import nn


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The model's units in order (``blocks`` may be a ModuleList or a ModuleDict)."""
    blocks = model.blocks
    return list(blocks.values()) if isinstance(blocks, nn.ModuleDict) else list(blocks)


def _set_block(model: nn.Module, index: int, module: nn.Module) -> None:
    blocks = model.blocks
    if isinstance(blocks, nn.ModuleDict):
        blocks[list(blocks.keys())[index]] = module
    else:
        blocks[index] = module


# ---------------------------------------------------------------------------- meshes


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


def build_layout(kind: str, res: Resolved, rank: int, device_type: str, timeout: timedelta) -> Layout:
    """Create the device mesh of a strategy (all ranks must call this together).

    Sub-groups of a mesh default to a 30-minute timeout; they get the job's timeout here so
    that a hung peer ends the job as quickly in a sub-group as in the world group."""
    from torch.distributed.device_mesh import init_device_mesh

    world, d, pp = res.world, res.shard, res.pp
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

    if kind == "ddp":
        return Layout(None, None, None, None, 0, rank)
    if kind == "zero":
        m = mesh((world,), ("shard",))
        return Layout(m, m, None, None, 0, rank)
    if kind == "zero2d":
        m = mesh((world // d, d), ("replicate", "shard"))
        return Layout(m, m, None, None, 0, rank)
    # pipeline: stage-major
    R = world // pp
    stage, replica = divmod(rank, R)
    if d > 1:
        m = mesh((pp, R // d, d), ("pp", "replicate", "shard"))
        fsdp_mesh = m["shard"] if R == d else m["replicate", "shard"]
        return Layout(m, fsdp_mesh, None, m.get_group("pp"), stage, replica)
    m = mesh((pp, R), ("pp", "dp"))
    return Layout(m, None, m.get_group("dp") if R > 1 else None, m.get_group("pp"), stage, replica)


# ------------------------------------------------------------- per-parallelism applies


def apply_checkpointing(model: nn.Module) -> nn.Module:
    """Activation checkpointing per block (non-reentrant), applied before FSDP/DDP."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(blocks_of(model)):
        _set_block(model, i, checkpoint_wrapper(block, preserve_rng_state=False))
    return model


def apply_fsdp(model: nn.Module, mesh, *, mp_policy=None, reshard_after_forward: bool = True) -> nn.Module:
    """FSDP2: one unit per block, then the root (embedding + head and anything left).

    A 1-D mesh shards over all its ranks (ZeRO); a 2-D ("replicate", "shard") mesh shards
    within dim 1 and replicates across dim 0 (ZeRO-2D / MiCS / HSDP)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = mp_policy or MixedPrecisionPolicy()
    for block in blocks_of(model):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def apply_ddp(model: nn.Module, device: torch.device, process_group=None) -> nn.Module:
    """DistributedDataParallel with its default buckets (25 MiB, first bucket 1 MiB)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, process_group=process_group)


class StageModule(nn.Module):
    """The piece of a model one pipeline stage runs: embed (stage 0), a run of consecutive
    blocks, head (last stage). Blocks keep their global index as key, so parameter names
    equal the whole model's."""

    def __init__(self, embed: nn.Module | None, blocks: dict[str, nn.Module], head: nn.Module | None):
        super().__init__()
        self.embed = embed
        self.blocks = nn.ModuleDict(blocks)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


def split_stage(model: nn.Module, pp_rank: int, pp: int) -> StageModule:
    """Stage `pp_rank` of `pp`: blocks by `simulator.workload.stage_ranges` (as the
    simulator splits them), the embedding on the first stage, the head on the last."""
    if not hasattr(model, "head"):
        raise ValueError("a pipeline needs a model with embed (or None), blocks and head")
    blocks = blocks_of(model)
    start, end = stage_ranges(len(blocks), pp)[pp_rank]
    if isinstance(model.blocks, nn.ModuleDict):
        names = list(model.blocks.keys())
    else:
        names = [str(i) for i in range(len(blocks))]
    embed = getattr(model, "embed", None) if pp_rank == 0 else None
    head = model.head if pp_rank == pp - 1 else None
    return StageModule(embed, {names[i]: blocks[i] for i in range(start, end)}, head)


def _stage_class():
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.pipelining import PipelineStage
    from torch.nn.parallel import DistributedDataParallel

    class AccumulatingStage(PipelineStage):
        """A PipelineStage whose data-parallel sync across replicas can wait for the
        gradient-accumulation boundary. Pipelining syncs in every schedule step: DDP on the
        last microbatch, FSDP2 in its post-backward (which turns the replica all-reduce back
        on). With ``replica_sync = False`` DDP runs under no_sync and FSDP2 reduce-scatters
        but skips the replica all-reduce (``set_requires_all_reduce(False)``)."""

        replica_sync = True

        def _compute_outputs(self, *args, module, **kwargs):
            # Shape inference (first step) runs the stage outside the schedule; a DDP
            # stage must not arm its reducer there (its backward only asks input grads).
            if isinstance(module, DistributedDataParallel):
                with module.no_sync():
                    return module(*args, **kwargs)
            return module(*args, **kwargs)

        def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward and self.replica_sync)

        def perform_reduce_grad(self, grad_scale_factor):
            mod = self.submod
            if self.replica_sync or not isinstance(mod, FSDPModule):
                return super().perform_reduce_grad(grad_scale_factor)
            enable = mod.set_requires_gradient_sync

            def reduce_scatter_only(flag: bool, *, recurse: bool = True) -> None:
                enable(flag, recurse=recurse)
                mod.set_requires_all_reduce(False, recurse=recurse)

            mod.set_requires_gradient_sync = reduce_scatter_only
            try:
                return super().perform_reduce_grad(grad_scale_factor)
            finally:
                del mod.set_requires_gradient_sync

    return AccumulatingStage


def build_pipeline_stage(model: nn.Module, pp_rank: int, pp: int, device: torch.device, *, group=None, wrap=None):
    """A manual `PipelineStage` for this rank: split the model, apply `wrap(stage_module)`
    (checkpointing, FSDP or DDP over the stage's replicas), hand it to pipelining.
    Returns (stage, stage_module)."""
    module = split_stage(model, pp_rank, pp)
    if wrap is not None:
        module = wrap(module)
    else:
        module = module.to(device)
    stage = _stage_class()(module, pp_rank, pp, device, group=group)
    return stage, module


def build_schedule(stage, schedule: str, microbatches: int, loss_fn):
    """ScheduleGPipe or Schedule1F1B. Gradients are not rescaled by the schedule: the loss
    function already divides by microbatches x accumulation steps (a schedule's own
    rescaling would divide gradients accumulated over earlier steps again)."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    return cls(stage, microbatches, loss_fn=loss_fn, scale_grads=False)


@contextlib.contextmanager
def replica_sync(module: nn.Module, sync: bool):
    """Gradient sync across replicas on (the accumulation boundary) or off, for a
    DDP-wrapped or FSDP2 module: DDP's no_sync; FSDP2 keeps reduce-scattering within the
    shard group but defers the replica all-reduce (set_requires_all_reduce)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module, DistributedDataParallel) and not sync:
        with module.no_sync():
            yield
    elif isinstance(module, FSDPModule):
        module.set_requires_all_reduce(sync)
        yield
    else:
        yield
