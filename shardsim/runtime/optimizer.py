"""The optimizer every run and the single-process reference build: Adam in the configured
implementation (torch.optim.Adam foreach=True | fused=True | foreach=False)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

LR = 1e-3  # Adam's learning rate (defaults otherwise)
ADAM_IMPLS = {"foreach": {"foreach": True}, "fused": {"fused": True}, "per-parameter": {"foreach": False}}


def build_adam(params: Iterable[torch.nn.Parameter], impl: str) -> torch.optim.Adam:
    """Adam over `params` in implementation `impl` (a key of ADAM_IMPLS). Under tensor
    parallelism without FSDP2 some parameters are DTensors and some plain (norms without
    sequence parallelism): a foreach or fused kernel takes one kind per call, so each kind is
    its own parameter group (same hyperparameters, same math)."""
    params = list(params)
    dtensor = [p for p in params if hasattr(p, "placements")]
    if dtensor and len(dtensor) < len(params):
        plain = [p for p in params if not hasattr(p, "placements")]
        return torch.optim.Adam([{"params": dtensor}, {"params": plain}], lr=LR, **ADAM_IMPLS[impl])
    return torch.optim.Adam(params, lr=LR, **ADAM_IMPLS[impl])


def build_zero_redundancy(params: Iterable[torch.nn.Parameter], impl: str, group=None):
    """ZeRO-1: `ZeroRedundancyOptimizer` over `group` (None: the world) wrapping Adam in
    implementation `impl`, with PyTorch's defaults (parameters broadcast one by one after the
    step, no bucket view, no overlap with DDP)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(
        list(params), optimizer_class=torch.optim.Adam, process_group=group, lr=LR, **ADAM_IMPLS[impl]
    )
