"""Activation checkpointing, applied before FSDP or DDP: none, full (every block), or selective
as torchtitan does it: every k-th block in full, or op-level (each block keeps the outputs of its
matmul and attention ops and recomputes the rest)."""

from __future__ import annotations

import torch
from torch import nn

from shardsim.config import SAC_OP
from shardsim.runtime.strategies.blocks import blocks_of, set_block

aten = torch.ops.aten
# Ops whose outputs op-level selective checkpointing keeps: matmuls and the fused attention
# kernels (CUDA and CPU). Unlike torchtitan's policy, every mm is kept (torchtitan recomputes
# every second one).
SAVED_OPS = frozenset(
    op
    for op in (
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        getattr(aten, "_scaled_dot_product_cudnn_attention", None) and aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
    )
    if op is not None
)


def _keep_matmuls(ctx, func, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if func in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def op_level_context():
    """The context pair of torch.utils.checkpoint for op-level selective checkpointing."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_keep_matmuls)


def checkpointed(mode: str, option: str, index: int) -> str | None:
    """How block `index` (of the whole model, from 0) is checkpointed: "full", "op" or None.
    Every k-th block counts from 1, as torchtitan: blocks k-1, 2k-1, ..."""
    if mode == "full":
        return "full"
    if mode != "selective":
        return None
    if option == SAC_OP:
        return "op"
    return "full" if (index + 1) % int(option) == 0 else None


def apply_checkpointing(model: nn.Module, mode: str = "full", option: str = SAC_OP, first: int = 0) -> nn.Module:
    """PyTorch's `checkpoint_wrapper` (non-reentrant, preserve_rng_state=False) around the
    blocks `mode` checkpoints; op-level ones with a selective checkpointing context. `first`:
    the index in the whole model of the model's first block (a pipeline stage's)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(blocks_of(model)):
        how = checkpointed(mode, option, first + i)
        if how == "full":
            set_block(model, i, checkpoint_wrapper(block, preserve_rng_state=False))
        elif how == "op":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False, context_fn=op_level_context)
            set_block(model, i, wrapped)
    return model
