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
from shardsim.simulator.hardware.topology import InstanceType

MATMUL = "matmul_efficiency"
MAX_MAE_AT_BOUND_PCT = 25.0  # mean |error| after a fit with a parameter at a bound beyond which it is refused
DEFAULT_FIT = (MATMUL, "attention_efficiency", "rank_time_cv", "kernel_floor_us", "nic_efficiency")


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
    "memory_efficiency": Parameter(
        "memory_efficiency",
        0.3,
        1.0,
        lambda i: i.device.memory_efficiency,
        lambda i, v: _device(i, memory_efficiency=v),
    ),
}
NAMES = (MATMUL, *FIXED)


def parameter(name: str) -> Parameter:
    """The parameter called `name` (``matmul_efficiency.bf16`` names a precision)."""
    if name.startswith(MATMUL + "."):
        return _matmul(name.split(".", 1)[1])
    if name in FIXED:
        return FIXED[name]
    near = difflib.get_close_matches(name, NAMES, n=1)
    hint = f"did you mean {near[0]!r}?" if near else f"expected {MATMUL}.<precision> or one of {', '.join(FIXED)}"
    raise ConfigError(f"unknown parameter {name!r}; {hint}", field="params")


def applied(inst: InstanceType, values: dict[str, float]) -> InstanceType:
    """`inst` with each named parameter set to its value (the attention factor over `inst`'s own rates)."""
    out = inst
    for name, v in values.items():
        if name == "attention_efficiency":
            out = _attention_scale(out, v, inst) if out.device.kernels is not None else out
        else:
            out = parameter(name).write(out, v)
    return out
