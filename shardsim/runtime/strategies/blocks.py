"""The model a strategy applies to: anything with ``blocks`` (an ``nn.ModuleList`` or
``nn.ModuleDict`` of the units FSDP wraps, checkpointing wraps and pipelines split),
optionally ``embed`` and ``head``."""

from __future__ import annotations

from torch import nn


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The model's units in order (``blocks`` may be a ModuleList or a ModuleDict)."""
    blocks = model.blocks
    return list(blocks.values()) if isinstance(blocks, nn.ModuleDict) else list(blocks)


def set_block(model: nn.Module, index: int, module: nn.Module) -> None:
    """Replace the model's unit number `index` by `module`."""
    blocks = model.blocks
    if isinstance(blocks, nn.ModuleDict):
        blocks[list(blocks.keys())[index]] = module
    else:
        blocks[index] = module
