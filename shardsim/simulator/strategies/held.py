"""Bytes a rank holds unsharded at its peak beyond its fp32 master copy, by the way its kind
holds them: FSDP2's gathered units, a sharded pipeline stage's units kept from its first
backward, autocast's low-precision copies of replicated parameters (each kind's planner picks
one: `planners.Planner.unsharded_bytes`)."""

from __future__ import annotations

from shardsim.config import RunConfig
from shardsim.simulator.plan import RankClass

FSDP_GATHERED_LAYERS = 2  # current + prefetched layer unsharded at once (FSDP2 limits in-flight all-gathers)


def pipelined_unsharded(rc: RankClass, param_bytes: int, grad_bytes: int) -> float:
    """Bytes a sharded pipeline stage holds unsharded from its first backward to the end
    of the step: pipelining's set_reshard_after_backward(False) keeps every unit unsharded,
    and with set_requires_gradient_sync(False) each accumulates its unsharded gradient
    until perform_reduce_grad. Parameters in the param dtype, gradients in the reduce dtype
    (FSDP2 upcasts an accumulated gradient to it)."""
    return sum(p for _, p in rc.units) * (param_bytes + grad_bytes)


def fsdp_gathered(cfg: RunConfig, rc: RankClass, param_bytes: int, grad_bytes: int) -> float:
    """Bytes FSDP2 holds unsharded at a rank's peak: the root and the gathered layers (every
    layer under ZeRO-2, reshard_after_forward False: each stays gathered from its forward to its
    backward), plus one layer's unsharded gradient before its reduce-scatter (and, when the reduce
    dtype differs, the reduce-scatter's input, the gradient cast to it)."""
    pb, rb = param_bytes, grad_bytes
    root = next((p for n, p in rc.units if n == "root"), 0.0)
    layer_sizes = sorted((p for n, p in rc.units if n != "root"), reverse=True)
    top = sum(layer_sizes[: None if not cfg.strategy.reshard_after_forward else FSDP_GATHERED_LAYERS])
    grad = (layer_sizes[0] if layer_sizes else 0.0) * (pb + (rb if rb != pb else 0))
    return (root + top) * pb + grad


def autocast_copies(rc: RankClass, param_bytes: int) -> float:
    """Bytes of the low-precision weight copies autocast keeps of replicated parameters."""
    return rc.params * param_bytes if param_bytes != 4 else 0.0
