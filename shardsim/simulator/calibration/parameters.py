"""The model's parameters that `shardsim calibrate` fits: each named, with its bounds, read from
and written into a topology's figures (`InstanceType`).

- ``matmul_efficiency.<precision>``: the sustained fraction of dense peak a GEMM wave runs at
  (`device.matmul_efficiency`; the kernel model's and the roofline's GEMM rate).
- ``attention_efficiency``: a factor on the fused-attention rates (`device.kernels.attn_fwd_tflops`
  and `attn_bwd_tflops` together); 1 is the topology's figures.
- ``kernel_floor_us``: eager PyTorch's launch and dispatch per kernel (`device.kernels.kernel_floor_us`).
- ``rank_time_cv``: rank-to-rank variation of compute time; the slowest of N ranks sets the pace
  (`device.kernels.rank_time_cv`).
- ``nic_efficiency``: achieved / line rate of the inter-node NICs (`nic.efficiency`).
- ``memory_efficiency``: achieved / peak HBM bandwidth of memory-bound kernels (`device.memory_efficiency`).
- ``latency_inter_us``: the network hop's latency NCCL's cost model adds to its own
  (`nic.figures.latency_inter_us`, NCCL's `latencyInter`).
- ``nic_size_factor.<size>``: the NIC's achieved fraction of its rate for a call that moves
  <size> through it (``64KiB``, ``16MiB``: a point of `nic.figures.size_factor`, added if absent).

Bounds are what each figure can physically be (a named choice): a fit that ends on a bound says
the rows ask for more than the figure can give, i.e. structure the model lacks; one that does and
still misses the rows by more than `MAX_MAE_AT_BOUND_PCT` on average is refused (other units,
another device?).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, replace

from shardsim.core.errors import ConfigError
from shardsim.core.units import parse_size
from shardsim.specs.hardware.network_figures import NetworkFigures
from shardsim.specs.hardware.topology import InstanceType

MATMUL = "matmul_efficiency"
SIZE_FACTOR = "nic_size_factor"
MAX_MAE_AT_BOUND_PCT = 25.0  # mean |error| after a fit with a parameter at a bound beyond which it is refused
DEFAULT_FIT = (MATMUL, "attention_efficiency", "rank_time_cv", "kernel_floor_us", "nic_efficiency")
# fitted to measured collectives (nccl-tests files) by default: the hop's latency and three points
# of the NIC's achieved fraction by size, one a band (latency-, per-message- and rate-bound calls)
NETWORK_FIT = ("latency_inter_us", "nic_size_factor.4KiB", "nic_size_factor.256KiB", "nic_size_factor.16MiB")


@dataclass(frozen=True)
class Parameter:
    """One fitted figure: its name, bounds, how it is read from a topology and set in one."""

    name: str
    low: float
    high: float
    read: Callable[[InstanceType], float]
    write: Callable[[InstanceType, float], InstanceType]
    # "kernels": only with a GPU's kernel figures; "nodes": only with rows over several nodes;
    # "ranks": only with kernel figures and rows over several ranks
    needs: str = ""


def _device(inst: InstanceType, **kw) -> InstanceType:
    return replace(inst, device=replace(inst.device, **kw))


def _kernels(inst: InstanceType, **kw) -> InstanceType:
    assert inst.device.kernels is not None
    return _device(inst, kernels=replace(inst.device.kernels, **kw))


def _matmul(precision: str) -> Parameter:
    def write(inst: InstanceType, v: float) -> InstanceType:
        return _device(inst, matmul_efficiency={**inst.device.matmul_efficiency, precision: v})

    return Parameter(f"{MATMUL}.{precision}", 0.3, 1.0, lambda i: i.device.matmul_efficiency[precision], write)


def _attention_scale(inst: InstanceType, v: float, base: InstanceType) -> InstanceType:
    k = base.device.kernels
    assert k is not None
    return _kernels(inst, attn_fwd_tflops=k.attn_fwd_tflops * v, attn_bwd_tflops=k.attn_bwd_tflops * v)


def _kernel_figure(name: str, low: float, high: float, needs: str) -> Parameter:
    """A figure of `device.kernels` (`KernelSpec`) fitted as it is."""

    def read(inst: InstanceType) -> float:
        assert inst.device.kernels is not None
        return getattr(inst.device.kernels, name)

    return Parameter(name, low, high, read, lambda i, v: _kernels(i, **{name: v}), needs)


def _figures(inst: InstanceType) -> NetworkFigures:
    figs = inst.nic.figures
    return figs if figs is not None else NetworkFigures(inst.nic.fabric, 0.0, ((1.0, 1.0),))


def _with_figures(inst: InstanceType, **kw) -> InstanceType:
    return replace(inst, nic=replace(inst.nic, figures=replace(_figures(inst), **kw)))


def size_name(n: int) -> str:
    """A size as a parameter's name holds it: 64KiB, 16MiB, 3000B."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def _size_factor(name: str) -> Parameter:
    """The NIC's achieved fraction at one size of `nic.figures.size_factor` (interpolated when
    read where the file has no point; set as a point)."""
    text = name.split(".", 1)[1]
    size = float(parse_size(text))

    def write(inst: InstanceType, v: float) -> InstanceType:
        pts = {b: f for b, f in _figures(inst).size_factor if b != size} | {size: v}
        return _with_figures(inst, size_factor=tuple(sorted(pts.items())))

    return Parameter(
        f"{SIZE_FACTOR}.{size_name(int(size))}", 0.01, 1.0, lambda i: _figures(i).factor(size), write, "nodes"
    )


FIXED: dict[str, Parameter] = {
    # the factor is read as 1 from any topology: it scales the figures the file gives
    "attention_efficiency": Parameter("attention_efficiency", 0.3, 1.3, lambda i: 1.0, lambda i, v: i, "kernels"),
    "kernel_floor_us": _kernel_figure("kernel_floor_us", 2.0, 100.0, "kernels"),
    "rank_time_cv": _kernel_figure("rank_time_cv", 0.0, 0.2, "ranks"),
    "nic_efficiency": Parameter(
        "nic_efficiency",
        0.3,
        1.0,
        lambda i: i.nic.efficiency,
        lambda i, v: replace(i, nic=replace(i.nic, efficiency=v)),
        "nodes",
    ),
    "latency_inter_us": Parameter(
        "latency_inter_us",
        0.0,
        200.0,
        lambda i: _figures(i).latency_inter_us,
        lambda i, v: _with_figures(i, latency_inter_us=v),
        "nodes",
    ),
    "memory_efficiency": Parameter(
        "memory_efficiency",
        0.3,
        1.0,
        lambda i: i.device.memory_efficiency,
        lambda i, v: _device(i, memory_efficiency=v),
    ),
}
NAMES = (MATMUL, SIZE_FACTOR, *FIXED)


def parameter(name: str) -> Parameter:
    """The parameter called `name` (``matmul_efficiency.bf16`` names a precision)."""
    if name.startswith(MATMUL + "."):
        return _matmul(name.split(".", 1)[1])
    if name.startswith(SIZE_FACTOR + "."):
        try:
            return _size_factor(name)
        except ConfigError as e:
            raise ConfigError(f"{name}: {e.message}", field="params") from None
    if name in FIXED:
        return FIXED[name]
    near = difflib.get_close_matches(name, NAMES, n=1)
    hint = (
        f"did you mean {near[0]!r}?"
        if near
        else f"expected {MATMUL}.<precision>, {SIZE_FACTOR}.<size> or one of {', '.join(FIXED)}"
    )
    raise ConfigError(f"unknown parameter {name!r}; {hint}", field="params")


def applied(inst: InstanceType, values: dict[str, float]) -> InstanceType:
    """`inst` with each named parameter set to its value (the attention factor over `inst`'s own
    rates; `nic_size_factor` points in place of the topology's whole table)."""
    out = inst
    if any(name.startswith(SIZE_FACTOR + ".") for name in values):
        out = _with_figures(out, size_factor=())  # the fitted points are the whole table
    for name, v in values.items():
        if name == "attention_efficiency":
            out = _attention_scale(out, v, inst) if out.device.kernels is not None else out
        else:
            out = parameter(name).write(out, v)
    return out
