"""Where each rank sits in the device mesh (pp, dp, tp), as the runtime builds it
(`runtime.strategies.layout`): the collectives' groups of a rank class.

A pipeline stage s holds ranks [s·R, (s+1)·R) (R = world / pp). Within a stage, with tensor
parallelism innermost (mesh "pp,dp,tp", the default) a tensor-parallel group is `tp` consecutive
ranks and a data-parallel group takes one rank of each, `tp` apart; with "pp,tp,dp" the
data-parallel ranks are consecutive and a tensor-parallel group's are `dp` apart. Data-parallel
groups are laid out over the stage's dp ranks as without tensor parallelism: FSDP's shard groups
consecutive, the replica groups across them strided.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsim.config import Resolved
from shardsim.simulator.network.collectives import GroupLayout


@dataclass(frozen=True)
class StageMesh:
    """The ranks [start, start + count) of one pipeline stage (the world without pipeline)."""

    start: int
    count: int
    tp: int = 1
    tp_inner: bool = True

    @property
    def dp(self) -> int:
        """Data-parallel ranks of the stage."""
        return self.count // self.tp

    def tp_groups(self) -> GroupLayout:
        """The stage's tensor-parallel groups."""
        return GroupLayout(self.start, self.count, self.tp, strided=not self.tp_inner)

    def dp_groups(self, size: int, strided: bool = False) -> GroupLayout:
        """Groups of `size` of the stage's data-parallel ranks, consecutive (FSDP's shard groups, DDP
        over all of them) or strided (the replica groups across the shard groups), for every
        tensor-parallel index."""
        if self.tp == 1:
            return GroupLayout(self.start, self.count, size, strided=strided)
        if self.tp_inner:
            return GroupLayout(self.start, self.count, size, strided=strided, inner=self.tp)
        return GroupLayout(self.start, self.count, size, strided=strided, outer=self.tp)


def stage_mesh(res: Resolved, stage: int = 0) -> StageMesh:
    """The mesh of pipeline stage `stage` (the world without pipeline)."""
    R = res.world // res.pp
    return StageMesh(stage * R, R, res.tp, res.tp_inner)
