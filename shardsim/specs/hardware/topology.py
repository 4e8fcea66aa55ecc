"""Instance types and clusters, read from YAML files under ``topologies/``.

A topology file describes one node (instance type): its devices, the intra-node fabric,
its NICs, its host and its price. A cluster is an instance type times a node count.
Each mapping of the file holds only the keys read from it: any other is refused (a misspelt key
would otherwise leave a figure at its default), with the nearest known key as a suggestion.

The training figures fitted to the calibration set, the same on every GPU, live once, in
``topologies/fitted/training.yaml`` (written by ``experiments/calibration/fit_defaults.py``): a
``kernels`` mapping reads them with ``training_figures: fitted``, and a figure it gives itself
replaces the fitted one. Without that key its missing training figures are `KernelSpec`'s defaults.
The network figures NCCL's cost model lacks live per NIC fabric in ``topologies/fitted/network.yaml``
(`network_figures.py`); a topology's ``nic.fabric`` selects them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import Fields, load_yaml, suggest
from shardsim.data import TOPOLOGIES
from shardsim.specs.bounds import MAX_WORLD
from shardsim.specs.hardware.float8 import Float8Spec, parse_float8
from shardsim.specs.hardware.network_figures import NetworkFigures, fitted_network_figures

PRECISIONS = ("fp32", "fp16", "bf16", "tf32")  # tf32: fp32 storage, TF32 tensor-core matmuls
FABRICS = ("pcie", "nvlink", "nvswitch", "loopback")
NETWORK_FABRICS = ("efa", "infiniband", "roce", "ethernet")  # the NIC's network (fitted figures per kind)
CPU_VENDORS = ("intel", "amd", "other")
MAX_NICS = 64  # NICs of one node (p5.48xlarge has 32): a cluster's links grow with nodes x NICs


@dataclass(frozen=True)
class KernelSpec:
    """Kernel-level figures of one GPU (the `kernels` mapping of a device in a topology file)."""

    sms: int  # streaming multiprocessors
    tile_m: int  # the large GEMM tile cuBLAS uses on this device (outputs per CTA, m × n)
    tile_n: int
    attn_fwd_tflops: float  # fused attention forward at long sequences, head dim 128
    attn_bwd_tflops: float  # fused attention backward at long sequences, head dim 128
    attn_fwd_half_seq: float  # key-loop length at which forward reaches half its rate
    attn_bwd_half_seq: float
    attn_small_hdim_factor: float  # rate at head dim <= 64 over that at 128
    kernel_floor_us: float  # eager PyTorch: launch + dispatch per kernel on the host
    # What a training step sustains of the kernel benchmarks above (clocks under sustained power,
    # SMs and HBM shared with overlapped NCCL kernels): a factor on the GEMM rate and one on the
    # fused-attention rates; 1 = the benchmarks as they are.
    gemm_training_fraction: float = 1.0
    attn_training_fraction: float = 1.0
    rank_time_cv: float = 0.0  # rank-to-rank variation of compute time (stragglers: the slowest sets the pace)


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or a CPU socket share standing in for one)."""

    model: str
    count: int
    memory_gib: float
    peak_tflops: dict[str, float]  # dense peak per precision; a missing key = unsupported
    matmul_efficiency: dict[str, float]  # achieved / peak on large GEMMs, per precision
    memory_bandwidth_GBps: float
    memory_efficiency: float  # achieved / peak on streaming (memory-bound) kernels
    kind: str = "gpu"
    kernels: KernelSpec | None = None  # kernel-level figures (GPUs): the compute model from kernels
    float8: Float8Spec | None = None  # FP8 tensor cores (None: none, Float8 training is refused)

    def supports(self, precision: str) -> bool:
        return precision in self.peak_tflops

    def backend_refusal(self, backend: str) -> str | None:
        """Why `backend` cannot run on this device (nccl on CPUs), or None."""
        if backend == "nccl" and self.kind == "cpu":
            return "nccl needs GPUs; this topology's devices are CPUs (use --backend gloo)"
        return None


@dataclass(frozen=True)
class FabricSpec:
    """Intra-node links: each device has a port (tx and rx) to the fabric."""

    kind: str
    port_GBps: float  # per device, per direction (spec sheet)
    efficiency: float  # achieved / spec for bulk collective traffic
    latency_us: float
    shared_GBps: float | None = None  # a node-wide shared resource (PCIe host bridge)
    generation: str = ""  # e.g. "NVLink 4 / NVSwitch 3" (what the figures describe)
    nvls: bool = False  # NVLink SHARP: the switch reduces (NCCL's NVLS / NVLS-tree algorithms)
    # kind nvlink without a switch: the linked GPU pairs as (GPU a, GPU b, NVLinks) by local index,
    # every GPU's links summing to its port; None: every GPU reaches every other at its port's rate
    nvlink_mesh: tuple[tuple[int, int, int], ...] | None = None


@dataclass(frozen=True)
class NicSpec:
    """Inter-node network interfaces of one node."""

    count: int
    rate_gbps: float  # per NIC, per direction
    efficiency: float
    latency_us: float
    fabric: str = "ethernet"  # efa | infiniband | roce | ethernet (selects the fitted network figures)
    generation: str = ""  # e.g. "EFA v2"
    gpudirect_rdma: bool = False  # the NIC reads and writes GPU memory directly
    figures: NetworkFigures | None = None  # the fabric's fitted figures (fitted/network.yaml), or a profile's
    # gloo's all-gather over 2-rank groups across the NICs: its achieved share of the ring's rate
    # (measured by a profile of an emulated topology; 1.0, no penalty, otherwise)
    pair_gather_efficiency: float = 1.0
    # the NICs next to each GPU (behind its PCIe switch), by local index: GPU l sends and receives
    # through gpu_nics[l]; None: GPU l of k takes NICs from l·count // k, count / k of them (at least 1)
    gpu_nics: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class HostSpec:
    cores: int
    memory_gib: float
    cpu_vendor: str = "other"  # intel | amd | other (NCCL's cost model reads it)


@dataclass(frozen=True)
class EmulationSpec:
    """How a topology is emulated on this machine (network namespaces + tc)."""

    nodes: int
    subnet: str


@dataclass(frozen=True)
class InstanceType:
    name: str
    description: str
    device: DeviceSpec
    fabric: FabricSpec
    nic: NicSpec
    host: HostSpec
    price_per_hour_usd: float | None
    path: str
    emulated: EmulationSpec | None = None
    sources: dict[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Cluster:
    """An instance type times a node count; ranks are numbered node-major."""

    instance: InstanceType
    nodes: int

    @property
    def devices_per_node(self) -> int:
        return self.instance.device.count

    @property
    def world(self) -> int:
        return self.nodes * self.devices_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.devices_per_node

    @property
    def price_per_hour_usd(self) -> float | None:
        p = self.instance.price_per_hour_usd
        return None if p is None else p * self.nodes

    def describe(self) -> str:
        return f"{self.nodes} x {self.instance.name} ({self.world} x {self.instance.device.model})"


# The training figures of `KernelSpec` and their bounds: (> 0 rather than >= 0, maximum)
TRAINING_BOUNDS = {
    "gemm_training_fraction": (True, 1.0),
    "attn_training_fraction": (True, 1.0),
    "rank_time_cv": (False, 0.5),
}
TRAINING_FIGURES = tuple(TRAINING_BOUNDS)
FITTED = "fitted"  # `kernels.training_figures: fitted` reads the TRAINING_FIGURES of FITTED_FILE
FITTED_FILE = "fitted/training.yaml"  # under the shipped topologies' folder

# The keys each mapping of a topology file may hold (any other is refused, with the nearest named)
INSTANCE_KEYS = ("name", "description", "price_per_hour_usd", "device", "fabric", "nic", "host", "emulated")
DEVICE_KEYS = tuple(DeviceSpec.__dataclass_fields__)
KERNEL_KEYS = (*KernelSpec.__dataclass_fields__, "training_figures")
FABRIC_KEYS = tuple(FabricSpec.__dataclass_fields__)
NIC_KEYS = tuple(k for k in NicSpec.__dataclass_fields__ if k != "figures")
HOST_KEYS = tuple(HostSpec.__dataclass_fields__)
EMULATION_KEYS = tuple(EmulationSpec.__dataclass_fields__)


def _figures(f: Fields, keys: list[str], sources: dict[str, str]) -> None:
    for key in keys:
        src = f.source(key)
        if src:
            sources[f"{f.prefix}{key}"] = src


def _training(f: Fields, defaults: dict[str, float] | None) -> dict[str, float]:
    """The training figures of mapping `f`, each one it lacks from `defaults` (None: all required)."""
    return {
        name: f.number(
            name,
            default=None if defaults is None else defaults[name],
            required=defaults is None,
            strict=strict,
            maximum=maximum,
        )
        for name, (strict, maximum) in TRAINING_BOUNDS.items()
    }


@functools.cache
def _fitted_file() -> Fields:
    where = f"topologies/{FITTED_FILE}"
    return Fields(load_yaml(builtin_topology_dir() / FITTED_FILE), where).closed(TRAINING_FIGURES)


def fitted_training_figures() -> tuple[dict[str, float], dict[str, str]]:
    """The shipped fitted training figures (`FITTED_FILE`) and their sources."""
    f = _fitted_file()
    return _training(f, None), {n: src for n in TRAINING_FIGURES if (src := f.source(n))}


def _kernels(k: Fields | None, sources: dict[str, str]) -> KernelSpec | None:
    if k is None:
        return None
    k.closed(KERNEL_KEYS)
    if k.text("training_figures", default="", choices=(FITTED,)):
        defaults, fitted_sources = fitted_training_figures()
        sources |= {f"{k.prefix}{n}": src for n, src in fitted_sources.items() if k.raw(n) is None}
    else:
        defaults = {n: KernelSpec.__dataclass_fields__[n].default for n in TRAINING_FIGURES}
    spec = KernelSpec(
        sms=k.integer("sms"),
        tile_m=k.integer("tile_m"),
        tile_n=k.integer("tile_n"),
        attn_fwd_tflops=k.number("attn_fwd_tflops"),
        attn_bwd_tflops=k.number("attn_bwd_tflops"),
        attn_fwd_half_seq=k.number("attn_fwd_half_seq", minimum=0.0, strict=False),
        attn_bwd_half_seq=k.number("attn_bwd_half_seq", minimum=0.0, strict=False),
        attn_small_hdim_factor=k.number("attn_small_hdim_factor", maximum=1.0),
        kernel_floor_us=k.number("kernel_floor_us", minimum=0.0, strict=False),
        **_training(k, defaults),
    )
    _figures(k, [n for n in KernelSpec.__dataclass_fields__ if k.raw(n) is not None], sources)
    return spec


def _nvlink_mesh(fab: Fields, gpus: int) -> tuple[tuple[int, int, int], ...] | None:
    """`fabric.nvlink_mesh`: [GPU a, GPU b, NVLinks] triples, each pair once, GPUs below `gpus`,
    on an `nvlink` fabric only, every GPU with the same number of links."""
    value = fab.raw("nvlink_mesh")
    if value is None:
        return None
    name = f"{fab.prefix}nvlink_mesh"
    if fab.raw("kind") != "nvlink":
        raise ConfigError("a mesh of NVLinks is an nvlink fabric's (kind: nvlink)", where=fab.where, field=name)
    shape = "expected a list of [GPU a, GPU b, NVLinks] triples"
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{shape}, got {value!r}", where=fab.where, field=name)
    mesh: dict[tuple[int, int], int] = {}
    for item in value:
        ok = isinstance(item, list) and len(item) == 3 and all(type(x) is int for x in item)
        if not ok or not (0 <= item[0] < gpus and 0 <= item[1] < gpus and item[0] != item[1] and item[2] >= 1):
            why = f"GPUs are 0 to {gpus - 1}, two different ones, and NVLinks at least 1"
            raise ConfigError(f"{shape} ({why}), got {item!r}", where=fab.where, field=name)
        pair = (min(item[:2]), max(item[:2]))
        if pair in mesh:
            raise ConfigError(f"GPUs {pair[0]} and {pair[1]} are listed twice", where=fab.where, field=name)
        mesh[pair] = item[2]
    links = [sum(n for pair, n in mesh.items() if g in pair) for g in range(gpus)]
    if len(set(links)) > 1:
        raise ConfigError(
            f"every GPU needs the same number of NVLinks (its port), got {links} for GPUs 0 to {gpus - 1}",
            where=fab.where,
            field=name,
        )
    return tuple((a, b, n) for (a, b), n in sorted(mesh.items()))


def _gpu_nics(nic: Fields, gpus: int) -> tuple[tuple[int, ...], ...] | None:
    """`nic.gpu_nics`: for each of the node's GPUs the NICs next to it, consecutive NICs, as many
    for every GPU (the rails the network model spreads a GPU's bytes over), every NIC listed."""
    value = nic.raw("gpu_nics")
    if value is None:
        return None
    name, count = f"{nic.prefix}gpu_nics", nic.raw("count")
    shape = f"expected one list of NIC indices per GPU ({gpus}), consecutive, as many for each GPU"
    ok = isinstance(value, list) and len(value) == gpus and isinstance(count, int)
    ok = ok and all(isinstance(r, list) and r and all(type(x) is int and 0 <= x < count for x in r) for r in value)
    ok = ok and len({len(r) for r in value}) == 1 and all(r == list(range(r[0], r[0] + len(r))) for r in value)
    if not ok or {x for r in value for x in r} != set(range(count)):
        raise ConfigError(f"{shape}, covering NICs 0 to {count - 1}; got {value!r}", where=nic.where, field=name)
    return tuple(tuple(r) for r in value)


def parse_instance(data: dict, where: str) -> InstanceType:
    """Build an InstanceType from a parsed YAML mapping; errors name `where` and the field."""
    top = Fields(data, where).closed(INSTANCE_KEYS)
    sources: dict[str, str] = {}
    name = top.text("name")

    dev = top.sub("device").closed(DEVICE_KEYS)
    peak = dev.sub("peak_tflops").closed(PRECISIONS)
    peaks: dict[str, float] = {}
    for prec in PRECISIONS:
        if peak.has(prec):
            peaks[prec] = peak.number(prec)
    _figures(peak, list(PRECISIONS), sources)
    if not peaks:
        raise ConfigError("expected at least one of fp32, fp16, bf16", where=where, field="device.peak_tflops")
    eff = dev.sub("matmul_efficiency").closed(PRECISIONS)
    effs = {p: eff.number(p, maximum=1.0) for p in peaks}
    _figures(eff, list(PRECISIONS), sources)
    device = DeviceSpec(
        model=dev.text("model"),
        count=dev.integer("count", maximum=MAX_WORLD),
        memory_gib=dev.number("memory_gib"),
        peak_tflops=peaks,
        matmul_efficiency=effs,
        memory_bandwidth_GBps=dev.number("memory_bandwidth_GBps"),
        memory_efficiency=dev.number("memory_efficiency", maximum=1.0),
        kind=dev.text("kind", default="gpu", choices=("gpu", "cpu")),
        kernels=_kernels(dev.sub("kernels", required=False), sources),
        float8=parse_float8(dev.sub("float8", required=False), sources),
    )
    _figures(dev, ["count", "memory_gib", "memory_bandwidth_GBps", "memory_efficiency"], sources)

    fab = top.sub("fabric").closed(FABRIC_KEYS)
    fabric = FabricSpec(
        kind=fab.text("kind", choices=FABRICS),
        port_GBps=fab.number("port_GBps"),
        efficiency=fab.number("efficiency", maximum=1.0),
        latency_us=fab.number("latency_us", minimum=0.0, strict=False),
        shared_GBps=fab.number("shared_GBps", required=False),
        generation=fab.text("generation", default=""),
        nvls=fab.boolean("nvls", default=False),
        nvlink_mesh=_nvlink_mesh(fab, device.count),
    )
    _figures(fab, [*FABRIC_KEYS[1:]], sources)

    nic_f = top.sub("nic").closed(NIC_KEYS)
    nic = NicSpec(
        count=nic_f.integer("count", maximum=MAX_NICS),
        rate_gbps=nic_f.number("rate_gbps"),
        efficiency=nic_f.number("efficiency", maximum=1.0),
        latency_us=nic_f.number("latency_us", minimum=0.0, strict=False),
        fabric=nic_f.text("fabric", default="ethernet", choices=NETWORK_FABRICS),
        generation=nic_f.text("generation", default=""),
        gpudirect_rdma=nic_f.boolean("gpudirect_rdma", default=False),
        gpu_nics=_gpu_nics(nic_f, device.count),
    )
    figures, figure_sources = fitted_network_figures(nic.fabric)
    nic = replace(nic, figures=figures)
    sources |= {f"network.{nic.fabric}.{n}": src for n, src in figure_sources.items()}
    _figures(
        nic_f,
        ["count", "rate_gbps", "efficiency", "latency_us", "fabric", "generation", "gpudirect_rdma", "gpu_nics"],
        sources,
    )

    host_f = top.sub("host").closed(HOST_KEYS)
    host = HostSpec(
        cores=host_f.integer("cores"),
        memory_gib=host_f.number("memory_gib"),
        cpu_vendor=host_f.text("cpu_vendor", default="other", choices=CPU_VENDORS),
    )
    _figures(host_f, ["cores", "memory_gib", "cpu_vendor"], sources)

    price = top.number("price_per_hour_usd", required=False)
    _figures(top, ["price_per_hour_usd"], sources)

    emulated = None
    emu = top.sub("emulated", required=False)
    if emu is not None:
        emu.closed(EMULATION_KEYS)
        emulated = EmulationSpec(
            nodes=emu.integer("nodes", maximum=MAX_WORLD), subnet=emu.text("subnet", default="10.213.0.0/24")
        )

    return InstanceType(
        name=name,
        description=top.text("description", default=""),
        device=device,
        fabric=fabric,
        nic=nic,
        host=host,
        price_per_hour_usd=price,
        path=where,
        emulated=emulated,
        sources=sources,
    )


def builtin_topology_dir() -> Path:
    """The folder of shipped topology files (works from a checkout and from a wheel)."""
    return TOPOLOGIES


def builtin_topologies() -> list[str]:
    return sorted(p.stem for p in builtin_topology_dir().glob("*.yaml"))


def topology_path(name_or_path: str) -> tuple[Path, bool]:
    """The file of a shipped name (``p4d.24xlarge``) or a path, and whether it was given as a path;
    ConfigError naming the nearest shipped names."""
    path = Path(name_or_path)
    looks_like_path = path.suffix in (".yaml", ".yml") or "/" in name_or_path
    if looks_like_path:
        if not path.exists():  # a device or a pipe is read as any file is: bounded
            raise ConfigError(f"topology file not found: {name_or_path}")
    else:
        path = builtin_topology_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            known = suggest(name_or_path, builtin_topologies())
            raise ConfigError(f"unknown topology {name_or_path!r}; {known} (or give a path to a YAML file)")
    return path, looks_like_path


def topology_document(name_or_path: str) -> dict:
    """A topology file's document as written (each figure's value and source), for export."""
    return load_yaml(topology_path(name_or_path)[0])


def load_instance(name_or_path: str) -> InstanceType:
    """Find a topology by shipped name (``p4d.24xlarge``) or by a path to a YAML file."""
    path, looks_like_path = topology_path(name_or_path)
    return parse_instance(load_yaml(path), str(path) if looks_like_path else f"topologies/{path.name}")


def make_cluster(topology: str | InstanceType, nodes: int | None = None, gpus_per_node: int | None = None) -> Cluster:
    """A cluster of `nodes` instances; emulated topologies default to their own node count.
    `gpus_per_node`: that many of each node's GPUs (`part_of_node`; None: all)."""
    inst = load_instance(topology) if isinstance(topology, str) else topology
    if gpus_per_node is not None:
        inst = part_of_node(inst, gpus_per_node)
    if nodes is None:
        nodes = inst.emulated.nodes if inst.emulated else 1
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ConfigError(f"expected a node count >= 1, got {nodes!r}", field="nodes")
    return Cluster(inst, nodes)


PART_FIELD = "gpus_per_node"


def part_of_node(inst: InstanceType, gpus: int) -> InstanceType:
    """`inst` with `gpus` of its devices per node (1, 2 or 4 of an 8-GPU instance) and their share of
    its NICs, as `make_cluster` builds it; ConfigError (field gpus_per_node) when `gpus` is not
    between 1 and the node's GPUs, or the topology is not an instance type's GPUs. Assumptions, named:

    - intra-node links: each GPU keeps its own NVLink / NVSwitch port and its figures (a GPU's
      ports do not depend on how many of the node's GPUs a job uses); a PCIe host bridge shared
      node-wide keeps its bandwidth (shared by fewer GPUs).
    - NICs: the GPUs used get the NICs that serve them (AWS's GPU instances attach NICs per PCIe
      switch, a fixed number per GPU: p4d one EFA per two GPUs, p5 four per GPU), so the node's NIC
      count scales with the share of its GPUs, rounded up, at least one, at the same rate per NIC
      (g4dn.12xlarge's one NIC stays whole with 2 of its 4 GPUs).
    - host: its cores and memory unchanged (used by emulation only, which part of a node is not).
    - price: unchanged, the whole instance's: AWS bills the instance, whatever share of its GPUs
      a job uses.
    """
    dev = inst.device
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"expected an integer >= 1, got {gpus!r}", field=PART_FIELD)
    if inst.emulated is not None or dev.kind != "gpu":
        why = f"{inst.name} is an emulated cluster of CPU ranks; part of a node applies to an instance's GPUs"
        raise ConfigError(why, field=PART_FIELD)
    if gpus > dev.count:
        raise ConfigError(f"{gpus} exceeds the {dev.count} GPUs of a {inst.name} node", field=PART_FIELD)
    if gpus == dev.count:
        return inst
    nics = max(1, math.ceil(inst.nic.count * gpus / dev.count))
    note = f"{PART_FIELD} {gpus} of the instance's {dev.count} (configuration; shardsim/specs/hardware/topology.py)"
    sources = {
        **inst.sources,
        "device.count": note,
        "nic.count": f"{nics} of {inst.nic.count}: the GPUs' share, {note}",
    }
    return replace(
        inst,
        description=f"{inst.description} ({gpus} of its {dev.count} GPUs)",
        device=replace(dev, count=gpus),
        nic=replace(inst.nic, count=nics, gpu_nics=_first_gpus_nics(inst.nic.gpu_nics, gpus, nics)),
        sources=sources,
    )


def _first_gpus_nics(
    table: tuple[tuple[int, ...], ...] | None, gpus: int, nics: int
) -> tuple[tuple[int, ...], ...] | None:
    """The NICs of the first `gpus` GPUs, which a part of a node keeps, where they are the first `nics`
    (None otherwise: the even rails of `nics` NICs)."""
    if table is None or any(x >= nics for row in table[:gpus] for x in row):
        return None
    return table[:gpus]
