"""NCCL's rings over an NVLink mesh without a switch (V100 SXM2's hybrid cube-mesh: DGX-1, p3dn).

On such a board not every GPU pair is linked and some pairs are linked twice, so what a ring
moves depends on which GPUs its communicator holds. This module finds the rings NCCL finds
(NVIDIA/nccl v2.20.3-1, src/graph/search.cc `ncclTopoCompute`) for a set of GPUs, as pure functions:

- **The system is the communicator's GPUs.** An NVLink to a GPU outside the communicator has no
  node to connect to (topo.cc `ncclTopoAddNvLinks`: `ncclTopoGetNode` finds no remote, no link),
  so a ring never runs through a GPU of another group.
- **Links**: one bundle per linked pair, at NCCL's rate per NVLink times the links (topo.cc
  `ncclTopoConnectNodes(gpu, remote, LINK_NVL, count*nvlBw)`; topo.h SM70_NVLINK_BW 20 GB/s).
- **Paths**: NVLink (PATH_NVL) between linked GPUs; through one other GPU of the communicator over
  NVLink (PATH_NVB, paths.cc "Set 1 hop NVLink as NVB"), which loads both hops; otherwise PCIe
  through the host at topo.h PCI_BW (12 GB/s, "PCI Gen3 x16") per GPU. The search tries NVL
  first and relaxes the path type only while it has found no ring at all (search.cc: `typeIntra
  += 1` needs `graph->nChannels == 0`), so NVB and PCIe serve only a set with no NVLink ring.
- **Speeds**: rings of one speed each, from speedArrayIntra, starting at the highest not above
  the best path's bandwidth (`maxBw`); the speed keeps falling while the next one is above 0.49
  of the best solution's; the solution with the most channels × speed is kept, the first (the
  faster) on a tie (`ncclTopoCompareGraphs`); channels at 25 GB/s or more are doubled at half
  the speed (`ncclTopoDupChannels`), then pass 2 tries a faster speed with as many channels.
- **Named choice (SEARCH_BUDGET)**: at each speed the rings are packed by an exhaustive search
  over every directed ring of the set, cut after SEARCH_BUDGET steps as NCCL's depth-first
  search is cut by its timeouts (NCCL_SEARCH_TIMEOUT); on DGX-1's sets of 2, 4 and 8 GPUs it
  ends well within it.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from shardsim.simulator.network.members import local_sets, node_masks

# topo.h SMxx_NVLINK_BW: NCCL's GB/s of one NVLink, by compute capability (×10)
NVLINK_GBPS = ((90, 20.6), (86, 12.0), (80, 20.0), (70, 20.0), (60, 18.0))
PCI_GBPS = 12.0  # topo.h PCI_BW, "PCI Gen3 x16": what NCCL counts for a GPU's PCIe path
SPEEDS_INTRA = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)  # search.cc speedArrayIntra
MAX_CHANNELS = 16  # init.cc: ringGraph.maxChannels = MAXCHANNELS/2
DUP_MIN_GBPS = 25.0  # search.cc ncclTopoDupChannels: channels below this speed are not doubled
LOWER_WHILE = 0.49  # search.cc: lower the speed while the next is above this fraction of the best's
SEARCH_BUDGET = 200_000  # packing steps per speed (the named choice above)

Link = tuple[int, int]  # a directed link (from GPU, to GPU); (g, -1) and (-1, g): GPU g's PCIe out and in
Ring = tuple[tuple[int, ...], tuple[Link, ...]]  # a ring's GPU order and the links it loads


@dataclass(frozen=True)
class Rings:
    """The channels NCCL's search settles on for a set of GPUs: each channel's ring (GPU order), its
    speed in NCCL's GB/s, and the path type its edges take (NVL, NVB or PCI)."""

    rings: tuple[tuple[int, ...], ...]
    speed_GBps: float
    path: str

    @property
    def total_GBps(self) -> float:
        """What every GPU sends per second over all channels (NCCL's units)."""
        return len(self.rings) * self.speed_GBps


def nvlink_GBps(compute_capability: int) -> float:
    """NCCL's bandwidth of one NVLink on a GPU of this compute capability (×10)."""
    for cc, bw in NVLINK_GBPS:
        if compute_capability >= cc:
            return bw
    return NVLINK_GBPS[2][1]  # topo.h: SM80's figure for anything older


def _capacity(mesh: tuple[tuple[int, int, int], ...], gpus: tuple[int, ...], link: float) -> dict[Link, float]:
    """Every directed NVLink bundle between GPUs of `gpus`, at `link` GB/s per NVLink."""
    inside = set(gpus)
    cap: dict[Link, float] = {}
    for a, b, count in mesh:
        if a in inside and b in inside:
            cap[a, b] = cap[b, a] = count * link
    return cap


def _paths(gpus: tuple[int, ...], cap: dict[Link, float], path: str) -> dict[Link, tuple[Link, ...]] | None:
    """The links of each directed GPU pair's path of type `path` (None when a pair has none)."""
    out: dict[Link, tuple[Link, ...]] = {}
    for a, b in itertools.permutations(gpus, 2):
        if path == "PCI":
            out[a, b] = ((a, -1), (-1, b))
        elif (a, b) in cap:
            out[a, b] = ((a, b),)
        elif path == "NVB":
            via = [(min(cap[a, w], cap[w, b]), -w) for w in gpus if (a, w) in cap and (w, b) in cap]
            if via:  # paths.cc's breadth-first search keeps the widest of the shortest (the first on a tie)
                w = -max(via)[1]
                out[a, b] = ((a, w), (w, b))
    return out


def _candidates(gpus: tuple[int, ...], paths: dict[Link, tuple[Link, ...]]) -> list[Ring]:
    """Every directed ring over `gpus` (starting at the first) whose edges all have a path, with the links it loads."""
    first, rest = gpus[0], gpus[1:]
    out = []
    for order in itertools.permutations(rest):
        ring = (first, *order)
        edges = list(zip(ring, (*ring[1:], first), strict=True))
        if all(e in paths for e in edges):
            out.append((ring, tuple(link for e in edges for link in paths[e])))
    return out


def _pack(
    candidates: list[Ring],
    cap: dict[Link, float],
    speed: float,
    gpus: tuple[int, ...],
    most: int,
) -> list[tuple[int, ...]]:
    """The most rings (at most `most`) at `speed` that the links carry together, with repeats."""
    left = dict(cap)
    bound = min(most, min(int(sum(c for (a, _), c in cap.items() if a == g) // speed + 1e-9) for g in gpus))
    best: list[tuple[int, ...]] = []
    chosen: list[tuple[int, ...]] = []
    steps = 0

    def fits(links: tuple[Link, ...]) -> bool:
        need: dict[Link, float] = {}
        for link in links:
            need[link] = need.get(link, 0.0) + speed
        return all(left.get(link, 0.0) >= n - 1e-9 for link, n in need.items())

    def go(start: int) -> bool:
        nonlocal best, steps
        if len(chosen) > len(best):
            best = list(chosen)
            if len(best) >= bound:
                return True
        for i in range(start, len(candidates)):
            steps += 1
            if steps > SEARCH_BUDGET:
                return True
            ring, links = candidates[i]
            if fits(links):
                for link in links:
                    left[link] -= speed
                chosen.append(ring)
                done = go(i)
                chosen.pop()
                for link in links:
                    left[link] += speed
                if done:
                    return True
        return False

    if bound > 0:
        go(0)
    return best


@functools.lru_cache(maxsize=1024)
def nccl_rings(mesh: tuple[tuple[int, int, int], ...], gpus: tuple[int, ...], link_GBps: float) -> Rings:
    """The rings NCCL's search finds over `gpus` (local indices, ≥ 2) of a node whose NVLinks are
    `mesh` ((GPU a, GPU b, links) triples), each NVLink at `link_GBps` (`nvlink_GBps`)."""
    gpus = tuple(sorted(set(gpus)))
    if len(gpus) < 2:
        return Rings((gpus,), 0.0, "LOC")
    cap = _capacity(mesh, gpus, link_GBps)
    for path in ("NVL", "NVB", "PCI"):
        paths = _paths(gpus, cap, path)
        candidates = _candidates(gpus, paths)
        if candidates:
            break
    if path == "PCI":
        cap = {(g, -1): PCI_GBPS for g in gpus} | {(-1, g): PCI_GBPS for g in gpus}
    max_bw = max(min(cap[link] for link in p) for p in paths.values())  # search.cc getMaxBw
    total_bw = max(sum(c for (a, _), c in cap.items() if a == g) for g in gpus)  # search.cc getTotalBw
    speeds = [s for s in SPEEDS_INTRA if s <= max_bw + 1e-9] or [SPEEDS_INTRA[-1]]
    best: list[tuple[int, ...]] = []
    best_speed = 0.0
    for speed in speeds:
        if best and speed / best_speed <= LOWER_WHILE:
            break
        rings = _pack(candidates, cap, speed, gpus, MAX_CHANNELS)
        if len(rings) * speed > len(best) * best_speed + 1e-9:
            best, best_speed = rings, speed
        if best and len(best) * best_speed >= total_bw - 1e-9:
            break
    if best_speed >= DUP_MIN_GBPS:  # ncclTopoDupChannels
        n = min(2 * len(best), MAX_CHANNELS)
        best, best_speed = (best * 2)[:n], best_speed / -(-n // len(best))
    faster = [s for s in SPEEDS_INTRA if s > best_speed]
    for speed in reversed(faster):  # pass 2: as many channels, one speed up at a time
        rings = _pack(candidates, cap, speed, gpus, len(best))
        if len(rings) < len(best):
            break
        best, best_speed = rings, speed
    return Rings(tuple(best), best_speed, path)


@functools.lru_cache(maxsize=4096)
def ring_share(mesh: tuple[tuple[int, int, int], ...], gpus: tuple[int, ...], link_GBps: float) -> float:
    """What the rings over `gpus` move per GPU, as a fraction of what the rings over every GPU of
    the board move: the fraction of a GPU's NVLink port the set's collectives run at (a job on part
    of a node, GPUs 0 to g-1, gets the rings of those)."""
    board = tuple(sorted({a for a, _, _ in mesh} | {b for _, b, _ in mesh}))
    full = nccl_rings(mesh, board, link_GBps).total_GBps
    return min(nccl_rings(mesh, gpus, link_GBps).total_GBps / full, 1.0) if full > 0 else 1.0


def edge_shares(
    mesh: tuple[tuple[int, int, int], ...],
    node_gpus: int,
    link_GBps: float,
    groups: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
) -> np.ndarray:
    """The share of its GPUs' ports each edge src[i] → dst[i] runs at, the edges being those of the
    rows of `groups` in row order (as many per row): inside a node the `ring_share` of the row's GPUs
    on that node, 1 between nodes (the NICs bound those)."""
    groups = np.asarray(groups, dtype=np.int64)
    rows = groups.shape[0]
    shares = np.ones(src.size)
    node = src // node_gpus
    intra = node == dst // node_gpus
    if not rows or not intra.any():
        return shares
    masks, nodes = node_masks(groups, node_gpus)
    row = np.repeat(np.arange(rows), src.size // rows)
    local, inverse = local_sets(masks[row[intra] * nodes + node[intra]], node_gpus)
    shares[intra] = np.array([ring_share(mesh, gpus, link_GBps) for gpus in local])[inverse]
    return shares
    nodes = int(groups.max()) // node_gpus + 1
    masks = np.zeros(rows * nodes, dtype=np.int64)  # the local GPUs of each (row, node), as bits
    key = np.arange(rows)[:, None] * nodes + groups // node_gpus
    np.bitwise_or.at(masks, key.ravel(), np.left_shift(1, groups % node_gpus).ravel())
    row = np.repeat(np.arange(rows), src.size // rows)
    edge_mask = masks[row[intra] * nodes + node[intra]]
    sets, inverse = np.unique(edge_mask, return_inverse=True)
    local = [tuple(g for g in range(node_gpus) if int(m) >> g & 1) for m in sets]
    shares[intra] = np.array([ring_share(mesh, gpus, link_GBps) for gpus in local])[inverse.ravel()]
    return shares
