"""Trace the collectives PyTorch really issues for one training step, in one process.

PyTorch's fake process group pretends to be rank 0 of any world size; under
FakeTensorMode no real memory is allocated, so FSDP2 over 1,024 ranks traces in about a
second. Both spellings of each collective are recorded (FSDP2 in torch 2.13 calls
`all_gather_single` / `reduce_scatter_single`), and the functional collectives DTensor issues
(tensor parallelism: ``torch.ops._c10d_functional.*``, seen by a dispatch mode below the DTensor
subclass). The simulator's plan is compared with this trace by test. `trace_step` traces one
optimizer step of a configuration as the runtime applies it (TP, TP + FSDP2; a pipeline stage).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from shardsim.config import RunConfig
from shardsim.core.files import atomic_write
from shardsim.runtime.trainer import Observer, Trainer
from shardsim.specs.parallel_dims import ParallelDims

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
    kind: str  # all_gather | reduce_scatter | all_reduce | all_to_all
    numel: int  # the whole array as nccl-tests counts it (gather output, scatter input; all-to-all: what is sent)
    group_size: int
    itemsize: int = field(default=0, compare=False)  # bytes per element
    group: str = field(default="", compare=False)  # the mesh dimension(s) of the group where known ("tp", ...)
    ranks: tuple[int, ...] = field(default=(), compare=False)  # the group's global ranks (not saved)
    phase: str = field(default="", compare=False)  # "forward" | "backward" (autograd's, or labelled by `phase`)

    def __str__(self) -> str:
        where = self.group or f"ranks {list(self.ranks)}"
        size = f"numel {self.numel:>10}  x{self.itemsize}B"
        return f"{self.phase:<8} {self.kind:<14} {size}  group {self.group_size} ({where})"


_PHASE = [""]  # set by `phase` (trace_step); "" outside it


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Label the collectives issued inside ("forward", "backward"); inside autograd's backward
    they are "backward" whatever the label."""
    _PHASE.append(name)
    try:
        yield
    finally:
        _PHASE.pop()


def _phase() -> str:
    return "backward" if torch._C._current_autograd_node() is not None else _PHASE[-1]


_FUNCTIONAL = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
}


def _group_info(group, names: dict[str, str]) -> tuple[int, str, tuple[int, ...]]:
    """(size, mesh dimension name or "", global ranks) of a process group or its name."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    pg = _resolve_process_group(group) if isinstance(group, str) else group
    if pg is None:
        pg = dist.group.WORLD
    ranks = tuple(dist.get_process_group_ranks(pg))
    return len(ranks), names.get(pg.group_name, ""), ranks


def _functional_recorder(calls: list[TracedCollective], names: dict[str, str]):
    """A dispatch mode recording ``_c10d_functional`` collectives; it steps aside for tensor
    subclasses (DTensor) so that it sees the collectives their dispatch issues on local tensors."""
    from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type

    class FunctionalCollectives(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if any(is_traceable_wrapper_subclass_type(t) for t in types):
                return NotImplemented
            out = func(*args, **kwargs)
            kind = _FUNCTIONAL.get(func._opname) if func.namespace == "_c10d_functional" else None
            if kind is not None:
                group = next(a for a in (*args, *kwargs.values()) if isinstance(a, str) and a not in _REDUCE_OPS)
                size, name, ranks = _group_info(group, names)
                # gather output, scatter input; an all-to-all's input: what this rank sends (uneven splits
                # make its output differ), the whole array nccl-tests counts where the splits are even
                big = args[0] if kind == "all_to_all" else max((args[0], out), key=lambda t: t.numel())
                calls.append(TracedCollective(kind, int(big.numel()), size, big.element_size(), name, ranks, _phase()))
            return out

    return FunctionalCollectives()


_REDUCE_OPS = {"sum", "avg", "max", "min", "product", "premul_sum"}


def mesh_group_names(mesh) -> dict[str, str]:
    """{process group name: mesh dimension name} of every dimension of a named DeviceMesh."""
    if mesh is None or not mesh.mesh_dim_names:
        return {}
    return {mesh.get_group(n).group_name: n for n in mesh.mesh_dim_names}


@contextlib.contextmanager
def record_collectives(group_names: dict[str, str] | None = None) -> Iterator[list[TracedCollective]]:
    """Record the collectives issued inside, in issue order: torch.distributed's (every spelling,
    patched) and the functional ones DTensor issues (a dispatch mode). `group_names` (from
    `mesh_group_names`) names each group's mesh dimension."""
    calls: list[TracedCollective] = []
    originals = {}
    names = group_names or {}

    def wrap(name: str, orig):
        def recorder(*args, **kwargs):
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            group = kwargs.get("group")
            if group is None:
                group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
            size, dim, ranks = _group_info(group, names)
            big = max(tensors, key=lambda t: t.numel(), default=None)
            numel, itemsize = (big.numel(), big.element_size()) if big is not None else (0, 0)
            calls.append(TracedCollective(_KINDS[name], int(numel), int(size), int(itemsize), dim, ranks, _phase()))
            return orig(*args, **kwargs)

        return recorder

    for name in _KINDS:
        if hasattr(dist, name):
            originals[name] = getattr(dist, name)
            setattr(dist, name, wrap(name, originals[name]))
    try:
        with _functional_recorder(calls, names):
            yield calls
    finally:
        for name, orig in originals.items():
            setattr(dist, name, orig)


def save_rank_trace(folder: str, rank: int, steps: list[list[TracedCollective]]) -> None:
    """Write one rank's collectives, one list per measured step, to ``folder/rank<r>.json``: [kind,
    numel, group size, bytes per element] each."""
    os.makedirs(folder, exist_ok=True)
    data = {"rank": rank, "steps": [[[c.kind, c.numel, c.group_size, c.itemsize] for c in step] for step in steps]}
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
    return [[TracedCollective(k, int(n), int(g), int(b)) for k, n, g, b in step] for step in data["steps"]]


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
        shape, names = ParallelDims(dp_replicate=world // shard, dp_shard=shard).mesh("dp_shard")
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
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


def trace_step(
    cfg: RunConfig, world: int, *, rank: int = 0, devices_per_node: int | None = None
) -> list[TracedCollective]:
    """Collectives of one optimizer step of `cfg` on `world` ranks, seen from `rank`, as the
    runtime applies it (`runtime.strategies`: its layout, tensor parallelism, checkpointing,
    FSDP2), under the fake process group and FakeTensorMode.

    - zero / zero2d: TP then FSDP2, `grad_accum` micro-steps of `batch_per_device` samples;
    - ddp: the TP collectives only (DDP's gradient all-reduce runs in its C++ reducer, unseen);
    - pipeline: the collectives of `rank`'s stage module (TP, then FSDP2 where sharded; DDP's not
      seen) for the forward and backward of one microbatch (the stage's output gradient is ones;
      point-to-point sends are not collectives), then, of a model with tied embeddings on its
      first or last stage, the embedding group's all-reduce of the gradient (`TiedEmbedding`);
      pick a rank of the last stage for the LM head."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shardsim.config import resolve
    from shardsim.runtime.models import build as workloads
    from shardsim.runtime.strategies import STRATEGIES, build_layout
    from shardsim.runtime.strategies.ddp import localize_tp
    from shardsim.runtime.strategies.fsdp import parallelize
    from shardsim.runtime.strategies.pipeline import TiedEmbedding, split_stage, tied_parameters
    from shardsim.runtime.strategies.tensor_parallel import loss_context, reduce_partial_grads
    from shardsim.specs.model.load import resolve_arch
    from shardsim.specs.stage_split import ranges

    _, arch = resolve_arch(cfg.workload, cfg.shape)
    n_layers = arch.layers if arch is not None else workloads.n_blocks(cfg.workload, cfg.shape)
    tied = bool(arch and arch.tied_embeddings)
    cfg, res = resolve(cfg, world, n_layers, tied_embeddings=tied, arch=arch, devices_per_node=devices_per_node)
    kind = cfg.strategy.kind
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        layout = build_layout(STRATEGIES[kind].layout, res, rank, "cpu", timedelta(minutes=5))
        names = mesh_group_names(layout.mesh)
        with FakeTensorMode(), _real_mesh_tensors(), record_collectives(names) as calls:
            model = workloads.build(cfg.workload, cfg.seed, cfg.shape, tp=res.tp)
            loss_of = model.loss
            sample = model.sample_batch
            spec = cfg.strategy.spec
            if spec.is_pipeline:
                spans = ranges(res.stage_counts(n_layers))
                first = spans[layout.stage][0]
                pairs = tied_parameters(model)
                stage = split_stage(model, layout.stage, res.pp, spans)
                module = parallelize(stage, cfg, res, layout, first=first, shard=res.shard > 1)
                if res.shard == 1 and res.tp > 1:
                    localize_tp(module)  # as the runtime: local shards (DDP's own all-reduce unseen)
                ends = (layout.stage == 0, layout.stage == res.pp - 1)
                tied = TiedEmbedding(pairs, module, res, *ends) if pairs and res.pp > 1 else None
                _stage_step(module, layout.stage, res, sample, loss_of, arch, cfg.strategy.sequence_parallel)
                if tied is not None:
                    with phase("backward"):
                        tied.all_reduce_grads()
            else:
                module = parallelize(model, cfg, res, layout, shard=spec.fsdp)
                if not spec.fsdp and res.tp > 1:
                    localize_tp(module)  # as the runtime: DDP's local shards (DDP's own all-reduce unseen)
                K = cfg.grad_accum
                for k in range(K):
                    if hasattr(module, "set_requires_all_reduce"):
                        module.set_requires_all_reduce(k == K - 1)
                    x, y = sample(cfg.batch_per_device)
                    with loss_context(res.tp):
                        with phase("forward"):
                            loss = loss_of(module(x), y)
                        with phase("backward"):
                            loss.backward()
                if res.tp > 1:
                    with phase("backward"):
                        reduce_partial_grads(module)  # as the step does (pending sums of SP norms' gradients)
        return list(calls)
    finally:
        dist.destroy_process_group()
        _forget_meshes()


def _forget_meshes() -> None:
    """Clear DTensor's caches of sharding decisions and redistribution plans: they hold the device
    meshes (and so the process-group names) of the fake world just destroyed, equal by layout to
    those of the next trace, whose rank may differ."""
    from torch.distributed.tensor._redistribute import clear_redistribute_planner_cache
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    clear_redistribute_planner_cache()


@contextlib.contextmanager
def _real_mesh_tensors() -> Iterator[None]:
    """FSDP2 over a 2-D (data-parallel, tp) parameter concatenates device meshes, whose rank
    tensors are real: compute `DeviceMesh.mesh` and `_concatenate` outside FakeTensorMode (a tracing-only patch)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    prop, concatenate = DeviceMesh.mesh, DeviceMesh._concatenate

    def mesh(self):
        with unset_fake_temporarily():
            return prop.fget(self)

    def real_concatenate(meshes):
        with unset_fake_temporarily():
            return concatenate(meshes)

    DeviceMesh.mesh, DeviceMesh._concatenate = property(mesh), staticmethod(real_concatenate)
    try:
        yield
    finally:
        DeviceMesh.mesh, DeviceMesh._concatenate = prop, staticmethod(concatenate)


def _stage_step(module: nn.Module, stage: int, res, sample, loss_of, arch, sp: bool) -> None:
    """Forward and backward of one microbatch through a pipeline stage's module."""
    from shardsim.runtime.strategies.tensor_parallel import loss_context, reduce_partial_grads

    x, y = sample(res.microbatch_size)
    if stage > 0:  # the previous stage's activations, local to this TP rank (a sequence shard under SP)
        seq = arch.tokens // (res.tp if sp else 1)
        x = torch.randn(res.microbatch_size, seq, arch.hidden, requires_grad=True)
    with loss_context(res.tp):
        with phase("forward"):
            out = module(x)
            if stage == res.pp - 1:
                out = loss_of(out, y)
        with phase("backward"):
            if stage == res.pp - 1:
                out.backward()
            else:
                out.backward(torch.ones_like(out))
            if res.tp > 1:
                reduce_partial_grads(module)
