"""Synthetic data, the same on every run (the seed's FakeDataset, seeded).

The global batch of micro-step `micro` of optimizer step `step` is `world` chunks of
`batch_per_device` samples; chunk c is drawn from its own generator seeded by
(seed, step, micro, c). A data-parallel rank takes chunk `rank`; a pipeline replica j takes
chunks [j*pp, (j+1)*pp) (batch_per_device x pp samples). A single process that
concatenates all chunks sees exactly the global batch, so its math is the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Sampler = Callable[..., tuple[Any, Any]]  # sample_batch(n, generator) -> (inputs, targets)

_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 63) - 1


def chunk_seed(seed: int, step: int, micro: int, chunk: int) -> int:
    h = seed & _MASK
    for v in (step, micro, chunk):
        h = ((h ^ (v + 1)) * _MIX + 0x632BE59BD9B4E019) & _MASK
    return h


def chunk(sample: Sampler, n: int, seed: int, step: int, micro: int, index: int) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(chunk_seed(seed, step, micro, index))
    return sample(n, g)


def _cat(parts: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def local_batch(
    sample: Sampler, batch_per_device: int, chunks: int, seed: int, step: int, micro: int, replica: int
) -> tuple[Any, Any]:
    """The samples of one data-parallel replica: `chunks` consecutive chunks (1, or pp)."""
    first = replica * chunks
    return _cat([chunk(sample, batch_per_device, seed, step, micro, first + i) for i in range(chunks)])


def global_batch(sample: Sampler, batch_per_device: int, world: int, seed: int, step: int, micro: int):
    return _cat([chunk(sample, batch_per_device, seed, step, micro, i) for i in range(world)])


def data_step(step: int, data_batches: int) -> int:
    """Which global batch optimizer step `step` trains on: `data_batches` distinct ones in turn,
    or (0) a new one every step."""
    return step % data_batches if data_batches > 0 else step
