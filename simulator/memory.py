"""Memory per rank: model states, gathered units, activations, pipeline in-flight microbatches."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from shardsim.simulator.compute import DTYPE_BYTES
from shardsim.simulator.config import Resolved, RunConfig
from shardsim.simulator.hardware.topology import DeviceSpec
from shardsim.simulator.plan import RankClass
from shardsim.simulator.units import GIB
from shardsim.simulator.workload.model import Block

GPU_RUNTIME_OVERHEAD_GIB = 0.5  # CUDA context + NCCL buffers + allocator slack (assumption)
# torch.optim.Adam(foreach=True), the default on CUDA, materializes sqrt(exp_avg_sq) for all of a
# rank's parameters at once during step(): one fp32 temporary the size of the local parameters.
ADAM_STEP_TEMPORARY = 1.0
FSDP_GATHERED_LAYERS = 2  # current + prefetched layer unsharded at once (FSDP2 limits in-flight all-gathers)


@dataclass(frozen=True)
class MemoryBreakdown:
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    gathered_gib: float
    activations_gib: float
    overhead_gib: float

    @property
    def total_gib(self) -> float:
        return sum(asdict(self).values())

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["total_gib"] = self.total_gib
        return d


def activation_elems(blocks: list[Block], checkpointing: bool) -> float:
    """Activation elements per sample held for backward by these blocks.

    With checkpointing on every layer only each layer's input is kept, plus one layer's
    full activations while it is recomputed; embedding and head are not checkpointed."""
    layers = [b for b in blocks if b.kind == "layer"]
    others = sum(b.act_elems for b in blocks if b.kind != "layer")
    if not checkpointing:
        return others + sum(b.act_elems for b in layers)
    return others + sum(b.in_elems for b in layers) + max((b.act_elems for b in layers), default=0.0)


def in_flight(cfg: RunConfig, res: Resolved, stage: int) -> int:
    """Microbatches whose activations a stage holds at its peak (GPipe all; 1F1B P - s)."""
    if cfg.strategy.kind != "pipeline":
        return 1
    if cfg.strategy.schedule == "gpipe":
        return res.microbatches
    return min(res.pp - stage, res.microbatches)


def pipelined_unsharded(rc: RankClass) -> float:
    """Unsharded elements a sharded pipeline stage holds from its first backward to the end
    of the step: pipelining's set_reshard_after_backward(False) keeps every unit unsharded,
    and with set_requires_gradient_sync(False) each accumulates its unsharded gradient
    until perform_reduce_grad. Parameters plus gradients, both in the param dtype."""
    return 2 * sum(p for _, p in rc.units)


def rank_memory(
    cfg: RunConfig, res: Resolved, rc: RankClass, blocks: list[Block], stage: int, device: DeviceSpec
) -> MemoryBreakdown:
    pb = DTYPE_BYTES[cfg.precision]
    local = rc.local_params
    fsdp = res.shard > 1
    ddp_like = not fsdp and res.replicas > 1
    params = local * 4  # fp32 master parameters (sharded under FSDP2)
    # DDP: gradients plus its bucket copies (gradient_as_bucket_view=False by default)
    grads = local * 4 * (2 if ddp_like else 1)
    optim = local * 4 * (2 + ADAM_STEP_TEMPORARY)  # Adam exp_avg, exp_avg_sq (fp32) + step temporary
    gathered = 0.0
    if fsdp and cfg.strategy.kind == "pipeline":
        gathered = pipelined_unsharded(rc) * pb
    elif fsdp:
        root = next((p for n, p in rc.units if n == "root"), 0.0)
        layer_sizes = sorted((p for n, p in rc.units if n != "root"), reverse=True)
        top = sum(layer_sizes[:FSDP_GATHERED_LAYERS])
        # unsharded params of the root and the gathered layers, plus one layer's unsharded
        # gradient before its reduce-scatter
        gathered = (root + top + (layer_sizes[0] if layer_sizes else 0.0)) * pb
    elif pb != 4:
        gathered = rc.params * pb  # autocast keeps low-precision weight copies
    acts = activation_elems(blocks, cfg.checkpointing) * res.microbatch_size * pb * in_flight(cfg, res, stage)
    overhead = GPU_RUNTIME_OVERHEAD_GIB if device.kind == "gpu" else 0.0
    g = 1 / GIB
    return MemoryBreakdown(params * g, grads * g, optim * g, gathered * g, acts * g, overhead)
