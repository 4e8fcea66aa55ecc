"""Where each rank sits in the device mesh (`Resolved.dims`, as the runtime builds it:
`runtime.strategies.layout`): the collectives' groups of a rank class.

A pipeline stage s holds ranks [s·R, (s+1)·R) (R = world / pp). Within a stage the dimensions
follow the mesh order: with tensor parallelism innermost ("pp,dp,tp", the default) a
tensor-parallel group is `tp` consecutive ranks and a data-parallel group takes one rank of
each, `tp` apart; with "pp,tp,dp" the data-parallel ranks are consecutive and a tensor-parallel
group's are `dp` apart. The data-parallel dimensions are dp_replicate (outer) × dp_shard
(inner), then context parallelism's cp: FSDP's shard groups (dp_shard × cp) consecutive over
those ranks, the replica groups across them strided.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsim.config import Resolved
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.specs.parallel_dims import DATA, ParallelDims


@dataclass(frozen=True)
class StageMesh:
    """The mesh of one pipeline stage: its ranks [start, start + count) (the world without pipeline)."""

    dims: ParallelDims
    stage: int = 0

    @property
    def count(self) -> int:
        """Ranks of the stage."""
        return self.dims.world // self.dims.pp

    @property
    def start(self) -> int:
        return self.stage * self.count

    @property
    def dp(self) -> int:
        """Data-parallel ranks of the stage."""
        return self.dims.dp

    def groups(self, *names: str) -> GroupLayout:
        """The stage's groups of dimensions `names`: "tp", "cp", or data-parallel ones (`DATA`:
        FSDP's shard groups "dp_shard", the replica groups across them "dp_replicate", DDP over
        both), for every index of the other dimensions. A group that takes dp_shard takes cp with
        it: parameters are sharded and gradients reduced over dp_shard × cp (torchtitan's
        ``dp_shard_cp``), the context-parallel ranks of a group consecutive within it."""
        d = self.dims
        if names == ("tp",):
            return GroupLayout(self.start, self.count, d.tp, strided=d.stride("tp") > 1)
        assert names == ("cp",) or set(names) <= set(DATA), f"no network groups of {names}"
        size = 1
        for n in names:
            size *= d.size(n)
        if "dp_shard" in names:
            size *= d.cp
        inner = d.stride("cp")  # ranks beside each data- or context-parallel rank (tp, when innermost)
        outer = self.count // (d.dp * d.cp * inner)  # blocks of those ranks (tp, when outside them)
        strided = "dp_shard" not in names and names != ("cp",)
        return GroupLayout(self.start, self.count, size, strided=strided, inner=inner, outer=outer)

    def sends(self, backward: bool = False) -> GroupLayout:
        """Each rank of the stage paired with its peer of the next stage in the "pp" dimension (the
        activations' sends); `backward`: with its peer of the previous stage, reversed (the input
        gradients')."""
        first = self.stage - 1 if backward else self.stage
        return GroupLayout(first * self.count, 2 * self.count, 2, strided=True, reverse=backward)


def pipeline_ends(dims: ParallelDims) -> GroupLayout:
    """The "pp" groups' first and last ranks: rank i of the first stage with rank i of the last."""
    return GroupLayout(0, dims.world, dims.pp, strided=True, ends=True)


def stage_mesh(res: Resolved, stage: int = 0) -> StageMesh:
    """The mesh of pipeline stage `stage` (the world without pipeline)."""
    return StageMesh(res.dims, stage)
