"""Memory per rank as the caching allocator's peak sees it: model states, gathered units,
activations, pipeline in-flight microbatches, and the optimizer step's temporaries.

The peak is the larger of two moments (a named choice): the end of the forward / the
backward, where gathered units and saved activations are alive, and the optimizer step, where
they are freed and the step's own temporaries are alive. Model states (parameters, gradients,
Adam's moments) and the runtime overhead are alive at both."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from shardsim.config import Resolved, RunConfig
from shardsim.core.units import GIB
from shardsim.simulator import attention_impl, optimizers
from shardsim.simulator.checkpointing import Checkpointing
from shardsim.simulator.compute import DTYPE_BYTES
from shardsim.simulator.float8 import FP8_BYTES
from shardsim.simulator.plan import RankClass
from shardsim.simulator.strategies.deepspeed_zero import DEEPSPEED_STAGES, rank_states, stage_of
from shardsim.simulator.strategies.held import FSDP_GATHERED_LAYERS
from shardsim.simulator.strategies.planners import PLANNERS
from shardsim.simulator.strategies.steps import ROOT
from shardsim.specs.hardware.topology import DeviceSpec
from shardsim.specs.model.blocks import kv_heads_per_rank
from shardsim.specs.model.workload import Block, Workload

GPU_RUNTIME_OVERHEAD_GIB = 0.5  # CUDA context + NCCL buffers + allocator slack (assumption)
# the optimizer step's full-size temporaries, by implementation (`optimizers.OPTIMIZERS`): Adam's
# foreach path materializes sqrt(exp_avg_sq) for all of a rank's parameters at once
# PyTorch's caching allocator reserves more than it hands out (large blocks rounded up to 2 MiB,
# cached segments split and kept): a GPU needs the peak of allocated memory plus this share of it
# (assumption, named; not measured here: the committed runs record the allocated peak only).
ALLOCATOR_RESERVE = 0.05


@dataclass(frozen=True)
class MemoryBreakdown:
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    gathered_gib: float
    activations_gib: float
    overhead_gib: float
    step_temporaries_gib: float = 0.0  # alive only during the optimizer step
    reserve: float = 0.0  # the allocator's reserve over the peak (ALLOCATOR_RESERVE on GPUs)

    @property
    def allocated_gib(self) -> float:
        """The peak of memory in tensors (PyTorch's max_memory_allocated): every part but the runtime overhead."""
        states = self.params_gib + self.grads_gib + self.optimizer_gib + self.overhead_gib
        return states + max(self.gathered_gib + self.activations_gib, self.step_temporaries_gib) - self.overhead_gib

    @property
    def reserved_gib(self) -> float:
        """The caching allocator's peak (PyTorch's max_memory_reserved): the allocated peak with its reserve."""
        return self.allocated_gib * (1 + self.reserve)

    @property
    def required_gib(self) -> float:
        """What the device must hold: the allocator's reserved peak plus the runtime overhead."""
        return self.reserved_gib + self.overhead_gib

    def to_dict(self) -> dict[str, float]:
        """The parts, each in GiB (the totals are the prediction's `memory_*_gib`)."""
        return {name: getattr(self, name) for name in _PART_FIELDS}


_PART_FIELDS = tuple(f.name for f in fields(MemoryBreakdown) if f.name != "reserve")  # `to_dict`'s keys


def state_words(optimizer: str, w: Workload) -> float:
    """fp32 words of optimizer state per parameter (`optimizers`): adafactor's from the model's matrices."""
    if optimizer == "adafactor":
        return optimizers.adafactor_words(w.arch, w.params * w.tp)
    return optimizers.spec(optimizer).state_words


def attention_saves(w: Workload, attention: str, esize: int) -> Workload:
    """`w` with what its layers save for backward under the attention implementation, in
    elements of `esize` bytes: the unfused paths' score tensors and more
    (`attention_impl.saved_extra_bytes` for math, `eager_saved_extra_bytes` for eager) on each
    transformer layer of a described model; the fused kernels' (flash, efficient) as `families`
    counts them."""
    a = w.arch
    if attention not in ("math", "eager") or a is None or not a.spec.transformer:
        return w
    tp = w.tp
    if attention == "eager":
        extra = attention_impl.eager_saved_extra_bytes(a.heads // tp, a.tokens, esize) / esize
    else:
        kvd = kv_heads_per_rank(a, tp) * a.head_dim if tp > 1 else a.kv_dim
        extra = attention_impl.saved_extra_bytes(a.heads // tp, a.tokens, a.q_dim // tp + 2 * kvd, esize) / esize
    blocks = tuple(replace(b, act_elems=b.act_elems + extra) if b.kind == "layer" else b for b in w.blocks)
    return replace(w, blocks=blocks)


def float8_gathered_saving(cfg: RunConfig, rc: RankClass, layer_elems: int, param_bytes: int) -> float:
    """Bytes float8 all-gather saves of what FSDP2 holds unsharded: the held layers' converted
    weights (`layer_elems` each) in 1 byte an element rather than the param dtype's; the layers
    held are those `held` counts (all of a sharded pipeline stage's, or every one under ZeRO-2)."""
    layers = sum(1 for name, _ in rc.units if name != ROOT)
    every = cfg.strategy.spec.is_pipeline or not cfg.strategy.reshard_after_forward
    return (layers if every else min(FSDP_GATHERED_LAYERS, layers)) * layer_elems * (param_bytes - FP8_BYTES)


def rank_memory(
    cfg: RunConfig,
    res: Resolved,
    rc: RankClass,
    blocks: list[Block],
    stage: int,
    device: DeviceSpec,
    ckpt: Checkpointing,
    words: float = 2.0,
    float8_layer_elems: int = 0,
    held: float | None = None,
) -> MemoryBreakdown:
    """Memory of one rank of class `rc`, which runs `blocks` (of pipeline stage `stage`), its
    optimizer keeping `words` fp32 words of state per parameter (`state_words`; Adam's 2);
    `float8_layer_elems`: a layer's weights FSDP2 gathers in float8 (float8 all-gather); `held`:
    the activation elements per sample it holds at most, where its schedule says (a multi-stage
    pipeline's, `virtual_pipeline.held_activations`)."""
    pb = DTYPE_BYTES[cfg.precision]
    rb = DTYPE_BYTES[cfg.grad_dtype]
    local = rc.local_params
    fsdp = res.shard > 1
    # DistributedDataParallel wraps the model (even over one rank): its buckets hold a second copy
    ddp_like = not fsdp and (res.replicas > 1 or cfg.strategy.spec.replicates)
    params = local * 4  # fp32 master parameters (sharded under FSDP2)
    # DDP: gradients plus its bucket copies (gradient_as_bucket_view=False by default)
    grads = local * 4 * (2 if ddp_like else 1)
    kind = PLANNERS[cfg.strategy.kind]  # what the kind holds unsharded, and how many microbatches' activations
    stepped = kind.optimizer_params(res, local, blocks)  # what this rank's optimizer steps (zero1: a partition)
    optim = stepped * 4 * words  # e.g. Adam's exp_avg, exp_avg_sq (fp32)
    temporaries = stepped * 4 * optimizers.spec(cfg.optimizer).temporaries[cfg.optimizer_impl]
    gathered = kind.unsharded_bytes(cfg, res, rc, pb, rb)
    if fsdp and float8_layer_elems:
        gathered -= float8_gathered_saving(cfg, rc, float8_layer_elems, pb)
    if held is None:
        acts = ckpt.saved_elems(blocks) * res.microbatch_size * pb * kind.activations_in_flight(cfg, res, stage)
    else:
        acts = held * res.microbatch_size * pb
    if cfg.library == "deepspeed" and stage_of(cfg) in DEEPSPEED_STAGES:  # DeepSpeed's partitioning
        ds = rank_states(cfg, res, blocks, rc.params, words)
        params, grads, optim, gathered = ds.params, ds.grads, ds.optimizer, ds.gathered
        temporaries += ds.step
    gpu = device.kind == "gpu"
    overhead = GPU_RUNTIME_OVERHEAD_GIB if gpu else 0.0
    g = 1 / GIB
    reserve = ALLOCATOR_RESERVE if gpu else 0.0
    return MemoryBreakdown(params * g, grads * g, optim * g, gathered * g, acts * g, overhead, temporaries * g, reserve)


# -- the process as nvidia-smi shows it ---------------------------------------------------------
# `memory_process_gib` = the allocator's reserved peak + the CUDA context + NCCL's buffers. It is
# reported beside `memory_required_gib` (what `fits` compares, unchanged: the reserved peak plus
# GPU_RUNTIME_OVERHEAD_GIB); whether `fits` should compare the process total instead is left
# until the runtime's records (memory_process_gib) have measured it on a GPU.
#
# The reserved peak's share (ALLOCATOR_RESERVE) stands for what PyTorch's caching allocator adds to
# the tensors (c10/cuda/CUDACachingAllocator.cpp): requests rounded up to 512 B (kMinBlockSize);
# requests up to 1 MiB (kSmallSize) packed in 2 MiB segments (kSmallBuffer); 1–10 MiB
# (kMinLargeAlloc) in 20 MiB segments (kLargeBuffer); larger ones in segments rounded up to 2 MiB
# (kRoundLarge); freed blocks are cached, split and kept (fragmentation). With the tensor sizes
# of a training step (most above 10 MiB) the rounding is under 1 MiB a tensor; the share is an
# assumption to be measured (max_memory_reserved / max_memory_allocated of a GPU run).
#
# CUDA context per process (driver state, runtime, the kernels of the modules loaded): with lazy
# module loading, 287,047,680 B on the GPU of pytorch/pytorch#86509 (PyTorch >= 1.13 sets
# CUDA_MODULE_LOADING=LAZY; CUDA 12.2+ makes it the Linux default, CUDA programming guide 4.7);
# eagerly loaded, 666,632,192 B on the same test. A named choice by GPU generation: Volta stacks
# (V100 era: CUDA 10 / 11.0) load eagerly, Turing (T4) and later lazily (today's stacks: CUDA >= 11.7).
CUDA_CONTEXT_BYTES = {"lazy": 287_047_680, "eager": 666_632_192}
EAGER_BELOW_CC = 75  # compute capability ×10 below which the stack is taken to load modules eagerly (Volta)
# NCCL's buffers per connection (src/init.cc): NCCL_BUFFSIZE 4 MiB (DEFAULT_BUFFSIZE, the Simple
# protocol), LL128 120 × 640 × 8 × 8 B (DEFAULT_LL128_BUFFSIZE, 4.69 MiB), LL 8 × 512 × 8 × 16 B
# (DEFAULT_LL_BUFFSIZE, 512 KiB); a rank holds them for each channel (`nccl_runs.channels`) and each
# ring peer (the previous and the next rank: RING_PEERS) of every communicator of more than one rank.
NCCL_BUFFER_BYTES = (1 << 22) + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16
RING_PEERS = 2


@dataclass(frozen=True)
class ProcessMemory:
    """The process total per rank as nvidia-smi shows it, and its parts (GiB)."""

    reserved_gib: float
    cuda_context_gib: float
    nccl_buffers_gib: float

    @property
    def process_gib(self) -> float:
        return self.reserved_gib + self.cuda_context_gib + self.nccl_buffers_gib


def communicators(res: Resolved) -> int:
    """NCCL communicators of more than one rank a rank belongs to: the data-parallel group (FSDP's
    shard and replicate groups apart), the tensor-parallel group, the pipeline's neighbours; with
    expert parallelism the EP group and the experts' shard group (efsdp), each taken at a
    ring's buffers (an approximation for the EP group's all-to-all: NCCL's p2p connections)."""
    groups = [res.shard, res.replicas] if res.shard > 1 and res.replicas > 1 else [res.dp * res.dims.size("ep")]
    if res.ep > 1:
        groups += [res.ep, res.dims.efsdp]
    return sum(g > 1 for g in [*groups, res.tp]) + (1 if res.pp > 1 else 0)


def process_memory(reserved_gib: float, res: Resolved, device: DeviceSpec, channels: int, cc: int) -> ProcessMemory:
    """`reserved_gib` (the worst rank's reserved peak) with the CUDA context and NCCL's buffers of
    a rank of `res` on `device` (`channels` per communicator, compute capability ×10 `cc`); a CPU
    device has neither (its process total is the reserved figure: the resident set)."""
    if device.kind != "gpu":
        return ProcessMemory(reserved_gib, 0.0, 0.0)
    context = CUDA_CONTEXT_BYTES["eager" if 0 < cc < EAGER_BELOW_CC else "lazy"]
    nccl = communicators(res) * channels * RING_PEERS * NCCL_BUFFER_BYTES
    return ProcessMemory(reserved_gib, context / GIB, nccl / GIB)
