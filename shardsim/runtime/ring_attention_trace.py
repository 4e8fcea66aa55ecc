"""Trace the collectives PyTorch's ring attention issues for one attention forward and backward,
in one process under the fake process group.

PyTorch's `context_parallel` dispatches the flash, memory-efficient and cuDNN SDPA kernels only
(CUDA: experiments/readings/context-parallel-on-cpu.md), so its ring is driven here directly:
`_templated_ring_attention` and `_templated_ring_attention_backward` (torch 2.13,
`torch.distributed.tensor.experimental._context_parallel._attention`), the functions those kernels'
handlers call, with the CPU flash kernel as the attention op, load balancing on (PyTorch's
default) and the given rotate method. The fake process group pretends to be rank 0 of the group:
the collectives' kinds, sizes and count are every rank's. The simulator's plan is compared with
this trace by test (`simulator.strategies.context_parallel`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

from shardsim.runtime.collective_trace import TracedCollective, phase, record_collectives


@contextlib.contextmanager
def _rotate_method(method: str) -> Iterator[None]:
    """PyTorch's `set_rotate_method(method)` inside, its option as it was after."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention

    before = cp_attention._cp_options.rotate_method
    cp_attention.set_rotate_method(method)
    try:
        yield
    finally:
        cp_attention._cp_options.rotate_method = before


def trace_ring_attention(
    *, cp: int, rotate: str, batch: int, heads: int, tokens: int, head_dim: int, dtype: torch.dtype = torch.float32
) -> list[TracedCollective]:
    """The collectives of one causal ring attention forward and backward over `cp` ranks, each
    rank holding `tokens` tokens (a cp-th of the sequence) of `heads` heads for q, k and v."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention
    from torch.testing._internal.distributed.fake_pg import FakeStore

    aten = torch.ops.aten
    shape = (batch, heads, tokens, head_dim)
    q, k, v = (torch.randn(shape, dtype=dtype) for _ in range(3))
    dist.init_process_group("fake", rank=0, world_size=cp, store=FakeStore())
    try:
        group = dist.group.WORLD
        assert group is not None
        with _rotate_method(rotate), record_collectives({group.group_name: "cp"}) as calls:
            with phase("forward"):
                out, lse, *_ = cp_attention._templated_ring_attention(
                    group, 2, aten._scaled_dot_product_flash_attention_for_cpu, q, k, v, is_causal=True, dropout_p=0.0
                )
            with phase("backward"):
                cp_attention._templated_ring_attention_backward(
                    group,
                    2,
                    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                    torch.ones_like(out),
                    "grad_out",
                    q,
                    k,
                    v,
                    out,
                    lse,
                    is_causal=True,
                    dropout_p=0.0,
                )
        return list(calls)
    finally:
        dist.destroy_process_group()
