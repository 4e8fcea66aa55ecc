"""NCCL's own tuner cost model (NCCL v2.20.3-1, `src/graph/tuning.cc`), as pure functions.

What this is: the formulas NCCL uses to pick an algorithm and a protocol for a collective,
followed line by line from NVIDIA/nccl tag v2.20.3-1 (the version the calibration file
`experiments/calibration/data/nccl-all-reduce-p5-2node.csv` probably ran):
- `ncclTopoTuneModel` (tuning.cc lines 120-411) fills, per collective × algorithm ×
  protocol, a latency (µs) and a bus bandwidth converted to algorithm bandwidth (GB/s),
  then switches off what the enable rules exclude (lines 269-339). `tune` below.
- `ncclTopoGetAlgoTime` (tuning.cc lines 413-448) gives the time of one call:
  `latency × latCount + nBytes / (1000 × bw)` with the tree correction factor by size and
  the ring "plateau" latency factor. `algo_time_us` below.
- `topoGetAlgoInfo` (src/enqueue.cc lines 1448-1503) takes the (algorithm, protocol)
  of least time, the first one in (algorithm, protocol) order on a tie. `choose` below.

The inputs are what NCCL learns at init from its topology search (`src/graph/search.cc`):
per algorithm's graph the channel count and the per-channel intra- and inter-node
bandwidth (`graph->nChannels`, `bwIntra`, `bwInter`), the link types, the CPU vendor.
They are explicit here (`Graph`, `NcclSystem`): this module does not run the search.

What NCCL does at run time that this model omits: the topology search itself (channel
count and per-channel bandwidth are given, not derived); the per-call reduction of
channels and threads for small sizes (enqueue.cc `getChannnelThreadInfo`, which changes
the real speed but not the choice); chunking, the FIFO depth (`NCCL_BUFFSIZE`) and the
proxy / network plugin's real behaviour (EFA's achieved rate by message size);
aggregation of grouped calls (`numPipeOps` > 1); tuner plugins; and every environment
override (`NCCL_ALGO`, `NCCL_PROTO`, `NCCL_NTHREADS`, ...). NCCL computes in float32;
this module in float64, so times can differ in the last digits. CollNet (SHARP) is
modelled only as "unsupported" (its bandwidth formulas need the collNet heads and plugin
capabilities): that is the case on EFA and on any fabric without SHARP. Send / receive
has no entry: NCCL's tuner covers broadcast, reduce, all-gather, reduce-scatter and
all-reduce only (src/include/nccl_common.h line 15).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from shardsim.core.errors import ConfigError

NCCL_VERSION = "2.20.3-1"
SOURCE = "NVIDIA/nccl v2.20.3-1 src/graph/tuning.cc"

# src/include/nccl_common.h lines 15-41 (v2.20.3-1): ids in NCCL's loop order.
COLLS = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")
ALGOS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree")
PROTOS = ("LL", "LL128", "Simple")

# tuning.cc lines 54-59: base latency (µs) per algorithm × protocol (LL, LL128, Simple).
BASE_LAT = {
    "tree": (6.8, 14.0, 0.0),
    "ring": (6.6, 14.0, 8.4),
    "collnet_direct": (0.0, 0.0, 0.0),
    "collnet_chain": (0.0, 0.0, 0.0),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
}

# tuning.cc lines 61-78: hardware latency (µs) per hop, by link type (NVLink, PCI, NET).
HW_LAT = {
    "nvlink": {
        "tree": (0.6, 1.25, 28.0),
        "ring": (0.6, 1.9, 3.4),
        "collnet_direct": (0.0, 0.0, 3.7),
        "collnet_chain": (0.0, 0.0, 2.8),
        "nvls": (0.0, 0.0, 23.0),
        "nvls_tree": (0.0, 0.0, 23.0),
    },
    "pci": {
        "tree": (1.0, 1.9, 28.0),
        "ring": (1.0, 2.5, 5.7),
        "collnet_direct": (0.0, 0.0, 3.7),
        "collnet_chain": (0.0, 0.0, 2.8),
        "nvls": (0.0, 0.0, 0.0),
        "nvls_tree": (0.0, 0.0, 0.0),
    },
    "net": {
        "tree": (5.0, 8.5, 28.0),
        "ring": (2.7, 4.0, 14.0),
        "collnet_direct": (0.0, 0.0, 31.0),
        "collnet_chain": (0.0, 0.0, 30.0),
        "nvls": (0.0, 0.0, 18.0),
        "nvls_tree": (0.0, 0.0, 14.0),
    },
}

# tuning.cc lines 80-106: per-channel caps (GB/s) by GPU generation (Volta, Ampere, Hopper)
# × node count (1, 2, more). LL's cap is indexed by GPU generation on one node and by
# CPU vendor (Intel row 0, AMD row 1) on several (line 145).
LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (87.7, 22.5, 19.0))
PER_CH_MAX_RING_LL128_BWS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7))
PER_CH_MAX_TREE_LL128_BWS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0))
PER_CH_MAX_TREE_BWS = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0))

# tuning.cc lines 181-186: protocol and algorithm bandwidth factors.
RING_LL_FACTOR_ALLREDUCE_OR_MULTINODE = 1.0 / 4.0  # line 181
RING_LL_FACTOR_OTHER = 1.0 / 3.0  # line 181
RING_LL128_FACTOR = 0.92  # line 182 (ppn >= 2; "120.0/128.0" in the comment)
RING_LL128_FACTOR_PPN1 = 0.7  # line 182 (fewer than 2 ranks per node)
TREE_FACTOR = 0.92  # line 183
TREE_LL_FACTOR = 1.0 / 3.8  # line 184
TREE_LL128_FACTOR_1NODE = 7.0 / 9.0  # line 185
TREE_LL128_FACTOR_NODES = 120.0 / 128.0  # line 185
TREE_PATTERN_FACTOR = 0.85  # line 186 (graph pattern NCCL_TOPO_PATTERN_TREE)
NVLS_ALGBW_RATIO = 5.0 / 6.0  # line 217
TREE_ALGBW_RATIO = 0.5  # line 218

# tuning.cc lines 111-118: network post overhead (µs) by CPU; ×3 for Simple (line 246).
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0, "other": 1.0}
NET_OVERHEAD_SIMPLE_FACTOR = 3.0

# tuning.cc lines 413-419: tree correction factor by protocol, for log2(nBytes/64) = 0..22.
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6,
           0.7, 0.8, 0.9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6,
              0.8, 0.9, 0.9, 0.9, 0.9, 1.0, 1.0),
    "Simple": (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6,
               0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9),
}  # fmt: skip

# tuning.cc lines 440-443: ring Simple all-reduce over several nodes, latency × this.
RING_PLATEAU_FACTOR = {"pre_ampere": 1.9, "ampere_plus": 1.4}
# Tree latency is paid once per NCCL_MAX_WORK_ELEMENTS (9, src/include/device.h line 240)
# pipelined ops (tuning.cc line 445); one call here = one op, so latency is paid once.
CUDART_11_8 = 11080  # tuning.cc line 317: LL128 off for 2-rank ring all-reduce on CUDA 11.8


@dataclass(frozen=True)
class Graph:
    """One algorithm's graph as NCCL's topology search leaves it (`struct ncclTopoGraph`).

    nchannels: `graph->nChannels`; bw_intra / bw_inter: `bwIntra` / `bwInter`, GB/s per
    channel; latency_inter_us: `latencyInter` (the network plugin's latency, 0 unless it
    reports one); intra_nvlink: `typeIntra == LINK_NVL` (else PCI latencies);
    ll128_paths_ok: the LL128 path rule of tuning.cc lines 311-312 (`typeInter <= PXB`, or
    `<= PXN` on Hopper, and `typeIntra <= NVB`); tree_pattern: `pattern ==
    NCCL_TOPO_PATTERN_TREE` (line 186); same_channels: `sameChannels` (line 235).
    """

    nchannels: int
    bw_intra: float
    bw_inter: float
    latency_inter_us: float = 0.0
    intra_nvlink: bool = True
    ll128_paths_ok: bool = True
    tree_pattern: bool = False
    same_channels: bool = True


@dataclass(frozen=True)
class NcclSystem:
    """What NCCL knows about a communicator when it tunes (inputs of `ncclTopoTuneModel`).

    compute_capability: the GPUs' (all the same) as major×10+minor, e.g. 90 for H100;
    ring / tree / nvls: the graphs (`tree` defaults to the ring's; `nvls` None = no NVLink
    SHARP, i.e. `nvlsSupport` 0); cpu_vendor: "intel", "amd" or "other"; cpu_power: an
    IBM Power host (line 151); cuda_runtime: CUDART_VERSION (line 317); mnnvl: a
    multi-node NVLink domain, treated as one node (line 136).
    """

    nranks: int
    nnodes: int
    compute_capability: int
    ring: Graph
    tree: Graph | None = None
    nvls: Graph | None = None
    cpu_vendor: str = "intel"
    cpu_power: bool = False
    cuda_runtime: int = 12020
    mnnvl: bool = False

    def __post_init__(self) -> None:
        if self.nranks < 1 or self.nnodes < 1 or self.nranks % self.nnodes:
            raise ConfigError(f"nccl model: {self.nranks} ranks on {self.nnodes} nodes")
        if self.cpu_vendor not in NET_OVERHEAD_US:
            raise ConfigError(f"nccl model: cpu_vendor {self.cpu_vendor!r}")
        if self.ring.nchannels < 1:
            raise ConfigError("nccl model: the ring graph needs at least one channel")

    @property
    def comm_nchannels(self) -> int:
        """`comm->nChannels`: src/init.cc line 1143 sets ring and tree to their minimum."""
        return min(self.ring.nchannels, (self.tree or self.ring).nchannels)

    def graph(self, algo: str) -> Graph | None:
        if algo in ("ring", "tree"):
            g = self.ring if algo == "ring" else self.tree or self.ring
            return replace(g, nchannels=self.comm_nchannels)
        if algo in ("nvls", "nvls_tree"):
            return self.nvls
        return None  # CollNet: unsupported (see the module docstring)


@dataclass(frozen=True)
class Entry:
    """One (collective, algorithm, protocol) cell of NCCL's tuning table."""

    latency_us: float
    bandwidth_GBps: float  # algorithm bandwidth; 0 = not available


@dataclass(frozen=True)
class Choice:
    algo: str
    proto: str
    time_us: float


def _log2i(n: int) -> int:
    """src/include/utils.h `log2i`: floor(log2 n), 0 for n <= 1."""
    return max(n, 1).bit_length() - 1


def _comp_cap_index(cc: int) -> int:
    return 2 if cc >= 90 else 1 if cc >= 80 else 0  # tuning.cc line 140


def tune(system: NcclSystem) -> dict[tuple[str, str, str], Entry]:
    """NCCL's latency / bandwidth table: `ncclTopoTuneModel` (tuning.cc lines 120-339)."""
    nnodes = 1 if system.mnnvl else system.nnodes  # line 136
    nranks = system.nranks
    cc = system.compute_capability
    cci = _comp_cap_index(cc)
    index2 = nnodes - 1 if nnodes <= 2 else 2  # line 143
    index1 = cci if nnodes == 1 else (1 if system.cpu_vendor == "amd" else 0)  # line 145
    ll_max_bw = LL_MAX_BWS[index1][index2]
    per_ch_max_tree_bw = PER_CH_MAX_TREE_BWS[cci][index2]
    per_ch_max_ring_ll128_bw = PER_CH_MAX_RING_LL128_BWS[cci][index2]
    per_ch_max_tree_ll128_bw = PER_CH_MAX_TREE_LL128_BWS[cci][index2]
    ppn = nranks / nnodes  # line 152

    def hw_lat(kind: str, algo: str, p: int) -> float:
        if kind == "pci" and algo == "tree" and p == 2 and system.cpu_power:
            return HW_LAT["pci"]["ring"][2]  # line 151
        return HW_LAT[kind][algo][p]

    table: dict[tuple[str, str, str], Entry] = {}
    if nranks <= 1:
        return table
    for coll in COLLS:
        nsteps = (
            2 * (nranks - 1)
            if coll == "all_reduce"
            else nranks - 1
            if coll in ("reduce_scatter", "all_gather")
            else nranks
        )  # line 159
        ninter = (
            (2 * nnodes if nnodes > 1 else 0)
            if coll == "all_reduce"
            else nnodes - 1
            if coll in ("reduce_scatter", "all_gather")
            else nnodes
        )  # line 162
        for algo in ALGOS:
            if coll in ("broadcast", "reduce") and algo != "ring":
                continue  # lines 167-168
            if coll in ("reduce_scatter", "all_gather") and algo not in (
                "ring",
                "nvls",
                "collnet_direct",
            ):
                continue  # lines 169-170
            g = system.graph(algo)
            for p, proto in enumerate(PROTOS):
                if algo in ("nvls", "nvls_tree") and proto != "Simple":
                    continue  # line 173
                if g is None:
                    table[coll, algo, proto] = Entry(BASE_LAT[algo][p], 0.0)
                    continue
                bw = g.bw_intra if nnodes <= 2 else g.bw_inter  # line 175
                if algo == "nvls":
                    bw = min(g.bw_intra, g.bw_inter)  # line 176
                if algo == "nvls_tree":
                    bw = min(g.bw_intra, g.bw_inter if nnodes <= 2 else g.bw_inter / 2)
                bus = g.nchannels * bw  # line 178
                if algo == "ring" and proto == "LL":  # line 181
                    f = (
                        RING_LL_FACTOR_ALLREDUCE_OR_MULTINODE
                        if nnodes > 1 or coll in ("all_reduce", "reduce")
                        else RING_LL_FACTOR_OTHER
                    )
                    bus = min(ll_max_bw, bus * f)
                if algo == "ring" and proto == "LL128":  # line 182
                    f = RING_LL128_FACTOR_PPN1 if ppn < 2 else RING_LL128_FACTOR
                    bus = min(bus * f, g.nchannels * per_ch_max_ring_ll128_bw)
                if algo == "tree":  # line 183
                    bus = min(bus * TREE_FACTOR, g.nchannels * per_ch_max_tree_bw)
                if algo == "tree" and proto == "LL":  # line 184
                    bus = min(bus * TREE_LL_FACTOR, ll_max_bw)
                if algo == "tree" and proto == "LL128":  # line 185
                    f = TREE_LL128_FACTOR_1NODE if nnodes == 1 else TREE_LL128_FACTOR_NODES
                    bus = min(bus * f, g.nchannels * per_ch_max_tree_ll128_bw)
                if algo == "tree" and g.tree_pattern:  # line 186
                    bus *= TREE_PATTERN_FACTOR
                # lines 213-220: bus bandwidth -> algorithm bandwidth
                if algo == "ring":
                    bus *= nranks / nsteps
                elif algo in ("nvls", "nvls_tree"):
                    bus *= NVLS_ALGBW_RATIO
                else:
                    bus *= TREE_ALGBW_RATIO

                # lines 226-264: latency
                lat = BASE_LAT[algo][p]
                intra_kind = "nvlink" if g.intra_nvlink else "pci"
                intra_lat = hw_lat(intra_kind, algo, p)
                inter_lat = hw_lat("net", algo, p) + g.latency_inter_us
                if proto == "Simple":
                    inter_lat += g.latency_inter_us  # line 230: the flush
                if algo == "ring":
                    hop = hw_lat(intra_kind if nnodes == 1 else "net", algo, p)  # 156, 233
                    if coll in ("reduce", "broadcast"):
                        if g.same_channels:
                            lat += hop
                        else:
                            if proto == "Simple":
                                hop = hw_lat(intra_kind if nnodes == 1 else "net", "tree", p)
                            lat += nsteps * hop
                    else:
                        overhead = 0.0
                        if nnodes > 1:  # lines 243-247
                            overhead = NET_OVERHEAD_US[system.cpu_vendor]
                            if proto == "Simple":
                                overhead *= NET_OVERHEAD_SIMPLE_FACTOR
                        intra_lat = max(intra_lat, overhead)
                        lat += (nsteps - ninter) * intra_lat + ninter * inter_lat
                elif algo == "tree":  # lines 251-253
                    lat += 2 * ((nranks // nnodes - 1) * intra_lat + _log2i(nnodes) * inter_lat)
                elif algo == "nvls":  # lines 259-261
                    lat = intra_lat + (inter_lat if nnodes > 1 else 0.0)
                elif algo == "nvls_tree":  # lines 262-263
                    lat += intra_lat + 2 * _log2i(nnodes) * inter_lat
                table[coll, algo, proto] = Entry(lat, bus)

    # lines 269-323: enable rules (no NCCL_PROTO / NCCL_ALGO overrides)
    algo_on = {a: True for a in ALGOS}
    if system.nnodes == 1 or system.mnnvl:
        algo_on["nvls_tree"] = False  # line 286
    algo_on["collnet_direct"] = algo_on["collnet_chain"] = False  # lines 289-291
    if system.nnodes > 1 or system.mnnvl:
        algo_on["nvls"] = False  # line 293 (no CollNet)
    for (coll, algo, proto), e in list(table.items()):
        on = algo_on[algo]
        if proto == "LL128":
            on = on and ll128_enabled(system, coll, algo)
        if not on:
            table[coll, algo, proto] = Entry(e.latency_us, 0.0)
    # lines 325-339: a collective with nothing left falls back to ring (its bandwidths
    # before the enable rules); with ring graphs always present this never triggers here.
    return table


def ll128_enabled(system: NcclSystem, coll: str, algo: str) -> bool:
    """LL128's default enable rule (tuning.cc lines 308-320): Volta / Ampere / Hopper
    on NVLink paths only, all GPUs the same generation; off for the 2-rank ring
    all-reduce on CUDA 11.8 (Hopper)."""
    g = system.graph(algo)
    if g is None or not g.ll128_paths_ok:
        return False
    cc = system.compute_capability
    if cc == 90:
        return not (
            system.cuda_runtime == CUDART_11_8 and coll == "all_reduce" and algo == "ring" and system.nranks == 2
        )
    return cc in (70, 80)


def latency_bandwidth(
    system: NcclSystem,
    table: dict[tuple[str, str, str], Entry],
    coll: str,
    algo: str,
    proto: str,
    nbytes: int,
) -> tuple[float, float] | None:
    """The latency (µs) and algorithm bandwidth (GB/s) `ncclTopoGetAlgoTime` (tuning.cc lines
    421-448) uses for one call (numPipeOps 1, nChannels left to NCCL), with the tree
    correction by size and the ring plateau latency applied: None where the pair is not
    available."""
    e = table.get((coll, algo, proto))
    if e is None or e.bandwidth_GBps == 0:
        return None
    bw, lat = e.bandwidth_GBps, e.latency_us
    log_size = _log2i(nbytes >> 6)  # line 437
    if algo == "tree" and log_size < 23:
        bw *= TREE_CORRECTION[proto][log_size]  # line 438
    nnodes = 1 if system.mnnvl else system.nnodes
    if (
        algo == "ring"
        and proto == "Simple"
        and nnodes > 1
        and coll == "all_reduce"
        and nbytes // (system.comm_nchannels * system.nranks) >= 64
    ):  # lines 440-443
        cc = system.compute_capability
        lat *= RING_PLATEAU_FACTOR["pre_ampere" if cc < 80 else "ampere_plus"]
    return lat, bw


def algo_time_us(
    system: NcclSystem,
    table: dict[tuple[str, str, str], Entry],
    coll: str,
    algo: str,
    proto: str,
    nbytes: int,
) -> float | None:
    """`ncclTopoGetAlgoTime` (tuning.cc lines 421-448) for one call: None where the pair is
    not available."""
    lb = latency_bandwidth(system, table, coll, algo, proto, nbytes)
    if lb is None:
        return None
    lat, bw = lb
    return lat + nbytes / (1000 * bw)  # line 446 (µs: bytes / (1000 × GB/s))


@functools.lru_cache(maxsize=256)
def tuned(system: NcclSystem) -> dict[tuple[str, str, str], Entry]:
    """`tune`, once per system (a sweep asks for the same few thousands of times)."""
    return tune(system)


def predict_time_us(
    coll: str,
    nbytes: int,
    system: NcclSystem,
    algos: tuple[str, ...] = ALGOS,
    protos: tuple[str, ...] = PROTOS,
) -> dict[tuple[str, str], float]:
    """Time (µs) of every (algorithm, protocol) NCCL considers for this call (only `algos` ×
    `protos`, as `NCCL_ALGO` / `NCCL_PROTO` restrict them)."""
    if coll not in COLLS:
        raise ConfigError(f"nccl model: collective {coll!r} (one of {', '.join(COLLS)})")
    if nbytes < 0:
        raise ConfigError(f"nccl model: size {nbytes} bytes")
    table = tuned(system)
    out = {}
    for algo in ALGOS:
        if algo not in algos:
            continue
        if algo == "nvls" and coll in ("all_gather", "reduce_scatter") and system.nnodes > 1:
            continue  # enqueue.cc line 1469
        for proto in PROTOS:
            if proto not in protos:
                continue
            t = algo_time_us(system, table, coll, algo, proto, nbytes)
            if t is not None:
                out[algo, proto] = t
    return out


def choose(
    coll: str,
    nbytes: int,
    system: NcclSystem,
    algos: tuple[str, ...] = ALGOS,
    protos: tuple[str, ...] = PROTOS,
) -> Choice | None:
    """The (algorithm, protocol) NCCL's default tuner picks among `algos` × `protos`: least
    time, the first in NCCL's (algorithm, protocol) order on a tie (enqueue.cc lines
    1463-1483); None when none of them is available."""
    if system.nranks == 1:
        return Choice("ring", "Simple", 0.0)  # enqueue.cc lines 1450-1452
    times = predict_time_us(coll, nbytes, system, algos, protos)
    best = None
    for (algo, proto), t in times.items():
        if best is None or t < best.time_us:
            best = Choice(algo, proto, t)
    return best


def bus_factor(coll: str, nranks: int) -> float:
    """nccl-tests' busbw / algbw factor (doc/PERFORMANCE.md)."""
    if coll == "all_reduce":
        return 2 * (nranks - 1) / nranks
    if coll in ("all_gather", "reduce_scatter"):
        return (nranks - 1) / nranks
    return 1.0


def busbw_GBps(coll: str, nbytes: int, nranks: int, time_us: float) -> float:
    """nccl-tests' bus bandwidth of a call of `nbytes` taking `time_us`."""
    return nbytes / (time_us * 1e3) * bus_factor(coll, nranks) if time_us > 0 else math.inf
