"""What to change when a step does not fit: a one-line hint from the memory breakdown per rank.

The largest part names the remedy: activations → checkpointing, a smaller micro-batch, then
tensor parallelism with sequence parallelism; model states (parameters, gradients, optimizer
state) → shard them (ZeRO), over more ranks (a larger degree, more nodes) or a pipeline;
gathered layers (FSDP's unsharded blocks) → reshard after forward, or tensor parallelism.
Each remedy is a flag of `predict` and `sweep`; the hint does not check that it would fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardsim.core.units import GIB, format_bytes

STATES = ("params_gib", "grads_gib", "optimizer_gib")


def memory_hint(memory: Mapping[str, float], cfg: Any, world: int) -> str:
    """``hint: ...``: the largest part of `memory` (a `MemoryBreakdown.to_dict()`, GiB per rank)
    and the remedy for it under `cfg` (a `RunConfig`) on `world` ranks."""
    parts = {
        "model states": sum(memory.get(k, 0.0) for k in STATES),
        "activations": memory.get("activations_gib", 0.0),
        "gathered layers": memory.get("gathered_gib", 0.0),
    }
    largest = max(parts, key=lambda k: parts[k])
    remedy = {"activations": _activations, "model states": _states, "gathered layers": _gathered}[largest](cfg, world)
    return f"hint: {largest} take {format_bytes(parts[largest] * GIB)} per rank; {remedy}"


def _activations(cfg: Any, world: int) -> str:
    out = []
    if cfg.checkpointing != "full":
        out.append("--checkpointing full (recomputes each layer's forward)")
    if cfg.batch_per_device > 1:
        out.append(f"a smaller --batch-per-device (now {cfg.batch_per_device}; activations scale with it)")
    if cfg.strategy.tp == 1 and world > 1:
        out.append("--tp 2..8 --sequence-parallel (splits each layer's activations)")
    return " or ".join(out) if out else "a shorter --seq-len, or a larger --tp"


def _states(cfg: Any, world: int) -> str:
    spec = cfg.strategy.spec  # the kind's capabilities (kinds are not spelled out here)
    if spec.is_pipeline:
        return "more stages (--pp), or more --nodes"
    if spec.replicates:
        return "shard them: --strategy zero (each rank holds 1/world of them)"
    degree = spec.sharded_degree(cfg.strategy, world)
    if degree < world:
        return f"shard over more ranks: a larger --degree (now {degree}), or more --nodes"
    return f"more --nodes (each rank holds 1/{world} of them now), or a pipeline (--strategy pipeline --pp N)"


def _gathered(cfg: Any, world: int) -> str:
    if getattr(cfg.strategy, "reshard_after_forward", True) is False:
        return "--reshard-after-forward (frees each gathered layer after its forward)"
    return "--tp 2..8 (each rank gathers a tp-th of a layer)"
