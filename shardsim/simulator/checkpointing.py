"""Activation checkpointing of the layers: which recompute what, and what each keeps for backward.

none keeps every activation; full checkpoints every layer (its input kept, its forward run again
in backward); selective as torchtitan does it: every k-th layer checkpointed in full
(``selective_ac_option: k``, layers k, 2k, ... counting from 1), or op-level
(``selective_ac_option: op``): every layer keeps the outputs of its matmul and attention ops and
recomputes the rest, whose time is the layer's memory-bound forward time. Embedding and head are
never checkpointed.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsim.config import SAC_OP, RunConfig
from shardsim.simulator.compute import BlockCost
from shardsim.specs.model.workload import Block


@dataclass(frozen=True)
class Checkpointing:
    """The checkpointing of a model's layers: `full` names the layers checkpointed whole;
    `op_level` says every layer runs under op-level selective checkpointing."""

    full: frozenset[str]
    op_level: bool = False

    def recompute_s(self, b: Block, c: BlockCost) -> float:
        """What backward of block `b` recomputes of its forward (cost `c`), in seconds."""
        if b.name in self.full:
            return c.fwd_s
        if self.op_level and b.kind == "layer":
            return c.fwd_mem_s
        return 0.0

    def saved_elems(self, blocks: list[Block]) -> float:
        """Activation elements per sample held for backward by `blocks`: a checkpointed layer
        keeps its input, an op-level one its input and its matmul outputs, the others all they
        save; plus, while one layer is recomputed, what that recomputation rebuilds (the
        largest such layer)."""
        kept, rebuilt = self.saved_parts(blocks)
        return kept + rebuilt

    def saved_parts(self, blocks: list[Block]) -> tuple[float, float]:
        """`saved_elems` as (what the blocks keep per sample, what one recomputation rebuilds)."""
        kept = 0.0
        rebuilt = 0.0
        for b in blocks:
            if b.name in self.full:
                kept += b.in_elems
                rebuilt = max(rebuilt, b.act_elems)
            elif self.op_level and b.kind == "layer":
                kept += b.in_elems + b.act_matmul_elems
                rebuilt = max(rebuilt, b.act_elems - min(b.act_matmul_elems, b.act_elems))
            else:
                kept += b.act_elems
        return kept, rebuilt


def checkpointing_of(cfg: RunConfig, layers: list[Block] | tuple[Block, ...]) -> Checkpointing:
    """The checkpointing `cfg` applies to a model's `layers` (all of them, in order)."""
    mode, opt = cfg.checkpointing, cfg.selective_ac_option
    if mode == "full":
        return Checkpointing(frozenset(b.name for b in layers))
    if mode == "selective" and opt == SAC_OP:
        return Checkpointing(frozenset(), op_level=True)
    if mode == "selective":
        k = int(opt)
        return Checkpointing(frozenset(b.name for i, b in enumerate(layers) if (i + 1) % k == 0))
    return Checkpointing(frozenset())
