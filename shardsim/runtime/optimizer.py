"""The optimizer every run and the single-process reference build: the configured one
(`optimizer`: torch.optim.Adam, AdamW, SGD with momentum 0.9, Adafactor) in the configured
implementation (foreach=True | fused=True | foreach=False). LAMB is not in torch.optim: the
runtime refuses it (`runtime.stack.check_runtime_stack`), the simulator models it."""

from __future__ import annotations

from collections.abc import Iterable

import torch

LR = 1e-3  # the learning rate of every optimizer (defaults otherwise)
SGD_MOMENTUM = 0.9  # SGD's momentum: one buffer per parameter (the simulator's 1 word of state)
ADAM_IMPLS = {"foreach": {"foreach": True}, "fused": {"fused": True}, "per-parameter": {"foreach": False}}
OPTIMIZERS = {
    "adam": (torch.optim.Adam, {}),
    "adamw": (torch.optim.AdamW, {}),
    "sgd": (torch.optim.SGD, {"momentum": SGD_MOMENTUM}),
    "adafactor": (torch.optim.Adafactor, {}),
}


def build_optimizer(params: Iterable[torch.nn.Parameter], name: str, impl: str) -> torch.optim.Optimizer:
    """Optimizer `name` (a key of OPTIMIZERS) over `params` in implementation `impl` (a key of
    ADAM_IMPLS; Adafactor has no fused one: refused before). Under tensor parallelism without
    FSDP2 some parameters are DTensors and some plain (norms without sequence parallelism): a
    foreach or fused kernel takes one kind per call, so each kind is its own parameter group
    (same hyperparameters, same math)."""
    cls, extra = OPTIMIZERS[name]
    params = list(params)
    kwargs = {"lr": LR, **extra, **ADAM_IMPLS[impl]}
    dtensor = [p for p in params if hasattr(p, "placements")]
    if dtensor and len(dtensor) < len(params):
        plain = [p for p in params if not hasattr(p, "placements")]
        return cls([{"params": dtensor}, {"params": plain}], **kwargs)
    return cls(params, **kwargs)


def build_adam(params: Iterable[torch.nn.Parameter], impl: str) -> torch.optim.Optimizer:
    """Adam over `params` in implementation `impl` (`build_optimizer`)."""
    return build_optimizer(params, "adam", impl)


def build_zero_redundancy(params: Iterable[torch.nn.Parameter], name: str, impl: str, group=None):
    """ZeRO-1: `ZeroRedundancyOptimizer` over `group` (None: the world) wrapping optimizer `name`
    in implementation `impl`, with PyTorch's defaults (parameters broadcast one by one after the
    step, no bucket view, no overlap with DDP)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    cls, extra = OPTIMIZERS[name]
    return ZeroRedundancyOptimizer(
        list(params), optimizer_class=cls, process_group=group, lr=LR, **extra, **ADAM_IMPLS[impl]
    )
