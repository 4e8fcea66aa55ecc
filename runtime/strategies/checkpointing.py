"""Activation checkpointing, applied before FSDP or DDP."""

from __future__ import annotations

from torch import nn

from shardsim.runtime.strategies.blocks import blocks_of, set_block


def apply_checkpointing(model: nn.Module) -> nn.Module:
    """PyTorch's `checkpoint_wrapper` around each block (non-reentrant,
    preserve_rng_state=False): a block's activations are recomputed in backward."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(blocks_of(model)):
        set_block(model, i, checkpoint_wrapper(block, preserve_rng_state=False))
    return model
