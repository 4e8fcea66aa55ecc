"""Mixed precision as each engine does it: FSDP2 casts the parameters itself and reduces the
gradients in the reduce dtype (`MixedPrecisionPolicy(param_dtype, reduce_dtype)`); DDP and plain
pipeline stages run under `torch.autocast` and hold fp32 gradients, which DDP all-reduces in fp32
or, with reduce_dtype fp16 / bf16, through a compression hook (`ddp.apply_ddp`); fp16 scales the
loss (`ShardedGradScaler`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from shardsim.config import Resolved, RunConfig
from shardsim.simulator.strategies.planners import PLANNERS

LOW_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # fp32 computes in full precision
DTYPES = {"fp32": torch.float32, **LOW_DTYPES}


@dataclass(frozen=True)
class Precision:
    """How a rank computes in its configuration's precision."""

    low: torch.dtype | None  # bf16 / fp16, None for fp32
    mp_policy: Any  # MixedPrecisionPolicy(param_dtype, reduce_dtype) for FSDP2, None for fp32 throughout
    autocast: Callable[[], AbstractContextManager]  # entered around each forward (and the loss)
    scaler: Any  # ShardedGradScaler for fp16, else None


def sharded(cfg: RunConfig, res: Resolved) -> bool:
    """Whether the strategy shards its parameters with FSDP2."""
    return PLANNERS[cfg.strategy.kind].sharded(res)


def precision_for(cfg: RunConfig, res: Resolved, device: torch.device) -> Precision:
    """Autocast only where FSDP2 does not cast (DDP, plain stages); a scaler for fp16 whose
    found-inf is agreed over the world."""
    low = LOW_DTYPES.get(cfg.precision)
    reduce = DTYPES[cfg.grad_dtype]
    mp_policy = None
    if low is not None or reduce != torch.float32:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        mp_policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=reduce)
    autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext
    if low is not None and not sharded(cfg, res):
        autocast = functools.partial(torch.autocast, device.type, dtype=low)
    scaler = None
    if cfg.precision == "fp16":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        scaler = ShardedGradScaler(device=device.type)
        # ranks that never compute a loss (early pipeline stages) still unscale: set the scale up
        scaler.scale(torch.zeros((), device=device))
    return Precision(low, mp_policy, autocast, scaler)
