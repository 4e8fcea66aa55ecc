"""Memory per rank as the caching allocator's peak sees it: model states, gathered units,
activations, pipeline in-flight microbatches, and the optimizer step's temporaries.

The peak is the larger of two moments (a named choice): the end of the forward / the
backward, where gathered units and saved activations are alive, and the optimizer step, where
they are freed and the step's own temporaries are alive. Model states (parameters, gradients,
Adam's moments) and the runtime overhead are alive at both. On a GPU the allocated and reserved
peaks are the caching allocator's replay of the step those parts make (`step_trace`)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from shardsim.config import Resolved, RunConfig
from shardsim.core.units import GIB
from shardsim.simulator import attention_impl, optimizers
from shardsim.simulator.checkpointing import Checkpointing
from shardsim.simulator.compute import DTYPE_BYTES
from shardsim.simulator.float8 import FP8_BYTES
from shardsim.simulator.plan import RankClass
from shardsim.simulator.step_trace import StepBytes, replay_step, tensor_shares
from shardsim.simulator.strategies.deepspeed_zero import DEEPSPEED_STAGES, rank_states, stage_of
from shardsim.simulator.strategies.held import FSDP_GATHERED_LAYERS
from shardsim.simulator.strategies.planners import PLANNERS
from shardsim.simulator.strategies.steps import ROOT
from shardsim.specs.hardware.topology import DeviceSpec
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import kv_heads_per_rank
from shardsim.specs.model.workload import Block, Workload

# cuBLAS's workspace (aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize): one per
# device and stream that runs GEMMs, allocated from the caching allocator (getNewWorkspace) and kept
# for the process's life; cuBLASLt shares it (unified_cublas_and_lt_workspaces: the default). By
# default ":4096:2:16:8", 4096 KiB x 2 + 16 KiB x 8; 4096 KiB x 8 (32 MiB) on compute capability 9.x,
# 10.x and 12.x (Hopper, Blackwell). A step's GEMMs run on one stream (GEMM_STREAMS): the forward,
# the backward (autograd runs each backward op on its forward's stream) and the optimizer;
# FSDP's and DDP's communication streams run none.
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_BYTES_LARGE = 4096 * 1024 * 8
CUBLAS_LARGE_MAJORS = (9, 10, 12)
GEMM_STREAMS = 1


def cublas_workspace_bytes(cc: int) -> int:
    """cuBLAS's workspace per stream on a GPU of compute capability x10 `cc` (0: not known, the default)."""
    return CUBLAS_WORKSPACE_BYTES_LARGE if cc // 10 in CUBLAS_LARGE_MAJORS else CUBLAS_WORKSPACE_BYTES


@dataclass(frozen=True)
class MemoryBreakdown:
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    gathered_gib: float
    activations_gib: float
    overhead_gib: float
    step_temporaries_gib: float = 0.0  # alive only during the optimizer step
    workspaces_gib: float = 0.0  # cuBLAS's workspaces, from the caching allocator and kept (GPUs)
    # the caching allocator's replay of the step (`step_trace`; GPUs only): what it hands out beyond
    # the tensors' bytes at the peak (512 B rounding, unsplit rests of blocks), and what its
    # segments hold beyond that (cached free blocks)
    rounding_gib: float = 0.0
    cached_gib: float = 0.0

    @property
    def tensors_gib(self) -> float:
        """The peak of the tensors' own bytes: every part but the runtime overhead."""
        states = self.params_gib + self.grads_gib + self.optimizer_gib
        return states + max(self.gathered_gib + self.activations_gib, self.step_temporaries_gib)

    @property
    def allocated_gib(self) -> float:
        """The allocator's allocated peak (PyTorch's max_memory_allocated): the tensors and cuBLAS's
        workspaces, with the allocator's rounding."""
        return self.tensors_gib + self.workspaces_gib + self.rounding_gib

    @property
    def reserved_gib(self) -> float:
        """The caching allocator's reserved peak (PyTorch's max_memory_reserved): its segments."""
        return self.allocated_gib + self.cached_gib

    @property
    def required_gib(self) -> float:
        """What the device must hold, the process as nvidia-smi shows it: the allocator's reserved
        peak and the overhead, the CUDA context and NCCL's buffers (`memory_process_gib`)."""
        return self.reserved_gib + self.overhead_gib

    def to_dict(self) -> dict[str, float]:
        """The parts, each in GiB (the totals are the prediction's `memory_*_gib`)."""
        return {name: getattr(self, name) for name in _PART_FIELDS}


# `to_dict`'s keys: the parts; the allocator's (workspaces, rounding, cached) are in `memory_allocated_gib`
# and `memory_reserved_gib`
_PART_FIELDS = tuple(
    f.name for f in fields(MemoryBreakdown) if f.name not in ("workspaces_gib", "rounding_gib", "cached_gib")
)


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
    overhead_gib: float = 0.0,
    workspace: int = 0,
    arch: Arch | None = None,
) -> MemoryBreakdown:
    """Memory of one rank of class `rc`, which runs `blocks` (of pipeline stage `stage`), its
    optimizer keeping `words` fp32 words of state per parameter (`state_words`; Adam's 2);
    `float8_layer_elems`: a layer's weights FSDP2 gathers in float8 (float8 all-gather); `held`:
    the activation elements per sample it holds at most, where its schedule says (a multi-stage
    pipeline's, `virtual_pipeline.held_activations`); on a GPU `overhead_gib`, the process's memory
    beyond the allocator (`ProcessMemory.runtime_gib`), and `workspace`, cuBLAS's bytes per GEMM stream; `arch`: the
    model's (DeepSpeed stage 3's fetch units)."""
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
        ds = rank_states(cfg, res, blocks, rc.params, words, arch)
        params, grads, optim, gathered = ds.params, ds.grads, ds.optimizer, ds.gathered
        temporaries += ds.step
    gpu = device.kind == "gpu"
    g = 1 / GIB
    parts = (params * g, grads * g, optim * g, gathered * g, acts * g)
    m = MemoryBreakdown(*parts, overhead_gib if gpu else 0.0, temporaries * g, workspace * GEMM_STREAMS * g)
    if not gpu:  # no caching allocator: the tensors are the process's
        return m
    window = (
        FSDP_GATHERED_LAYERS if fsdp and cfg.strategy.reshard_after_forward and not cfg.strategy.spec.is_pipeline else 0
    )
    b = StepBytes(
        *(round(x) for x in (params, grads, optim, gathered, acts, temporaries)),
        tensors=tensor_shares(
            [x.params for x in blocks], [x.param_tensors for x in blocks], [x.largest_tensor for x in blocks]
        ),
        saved=tuple(x.act_elems for x in blocks),
        words=max(1, round(words)),
        window=window,
        gather_stream=fsdp,
        workspace=workspace * GEMM_STREAMS,
    )
    r = replay_step(b)
    return replace(
        m, rounding_gib=(r.allocated_peak - r.requested_peak) * g, cached_gib=(r.reserved_peak - r.allocated_peak) * g
    )


# -- the process as nvidia-smi shows it ---------------------------------------------------------
# `memory_process_gib` = the allocator's reserved peak + the CUDA context + NCCL's buffers, and
# `memory_required_gib` (what `fits` compares) is the same total: a rank's overhead beyond the
# allocator is its context and buffers (`ProcessMemory.runtime_gib`).
#
# The reserved peak is the caching allocator's (`allocator`, c10/cuda/CUDACachingAllocator.cpp)
# replaying the rank's step (`step_trace`): requests rounded to 512 B, pooled in segments of 2 MiB,
# 20 MiB or their own size rounded to 2 MiB, freed blocks cached, split and kept.
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
    def runtime_gib(self) -> float:
        """The rank's memory beyond the caching allocator: its CUDA context and NCCL's buffers."""
        return self.cuda_context_gib + self.nccl_buffers_gib

    @property
    def process_gib(self) -> float:
        return self.reserved_gib + self.runtime_gib


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
