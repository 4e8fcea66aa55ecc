"""Measured collectives (nccl-tests files) as rows of a calibration: each size one row whose
ratio is measured over predicted time (out of place), i.e. predicted over measured throughput,
as a training row's is. `fit.ratios` takes them beside run measurements."""

from __future__ import annotations

from dataclasses import dataclass

from shardsim.core.errors import ConfigError
from shardsim.simulator.collective import OPS, simulate_collective
from shardsim.simulator.network.nccl_tests import NO_NODES, NcclTestsResult
from shardsim.specs.hardware.topology import Cluster, InstanceType


@dataclass(frozen=True)
class CollectiveRow:
    """One measured size of one collective over `ranks` ranks on `nodes` nodes."""

    op: str
    size_bytes: int
    ranks: int
    nodes: int
    measured_time_us: float
    label: str  # file:size, as errors and tables name the row

    def ratio_on(self, inst: InstanceType) -> float:
        """Measured over predicted time on `inst` (NCCL, the algorithm and protocol predictions use)."""
        r = simulate_collective(Cluster(inst, self.nodes), self.op, self.size_bytes, "auto", "nccl", self.ranks)
        return self.measured_time_us / (r.time_s * 1e6)


def collective_rows(result: NcclTestsResult, inst: InstanceType, nodes: int | None = None) -> list[CollectiveRow]:
    """The sizes of an nccl-tests file (size 0 left out: nothing moves), on `inst`'s nodes: the
    file's ranks over the instance's devices per node (one GPU a rank, as nccl-tests' -g 1), or
    every device of `nodes` nodes where the file names no ranks (the repository's CSV form)."""
    if result.collective not in OPS:
        raise ConfigError(f"{result.path}: the simulator times {', '.join(OPS)}, not {result.collective}")
    k = inst.device.count
    ranks = result.ranks or (result.nodes * k if result.nodes else None) or (nodes * k if nodes else None)
    if ranks is None:
        raise ConfigError(f"{result.path}: {NO_NODES}", field="nodes")
    if ranks % k and ranks > k:
        raise ConfigError(f"{result.path}: {ranks} ranks do not fill nodes of {k} devices ({inst.name})")
    nodes = max(1, ranks // k)
    if result.nodes and result.nodes != nodes:
        raise ConfigError(
            f"{result.path}: {ranks} ranks on {result.nodes} nodes, but {inst.name} holds {k} devices a node"
        )
    return [
        CollectiveRow(result.collective, r.size_bytes, ranks, nodes, r.time_us, f"{result.path}:{r.size_bytes}")
        for r in result.rows
        if r.size_bytes > 0 and r.time_us > 0
    ]
