"""Float8 training's cost on a GPU, as torchao's Float8Linear runs it (torchao 0.18,
`torchao/float8`), in the linears torchtitan's filter converts (`specs.model.float8`).

- GEMMs: the three GEMMs of a converted linear (output, input gradient, weight gradient) are
  ``torch._scaled_mm`` of e4m3 operands with a bf16 result, at the device's FP8 rate
  (`specs.hardware.float8`: its peak × matmul_efficiency × the training fraction every GEMM
  gets). Rowwise scaling: the output GEMM (fast accumulation) runs the CUTLASS rowwise kernel at
  ``rowwise_gemm_rate`` of the tensorwise rate; the gradient GEMMs (no fast accumulation) run
  the tensorwise cuBLAS kernel and rescale the result afterwards, one elementwise kernel reading
  and writing the bf16 result (torchao ``float8_ops.addmm_float8_unwrapped``).
- Dynamic scaling: per converted linear, the amax reductions and casts of input, weight and
  grad_output, each kernel memory-bound (its bytes at the achieved HBM bandwidth), with the
  bytes and kernel counts of torchao's own float8 roofline
  (``torchao/testing/training/roofline_utils.py``, ``get_tensor_memory_traffic_ovhd_s``, not
  fused with the previous op): the counts of the compiled kernels it models, a named
  simplification in eager mode, where the casts launch more, shorter kernels.
- FSDP2's float8 all-gather (``enable_fsdp_float8_all_gather``, tensorwise only) with
  ``precompute_float8_dynamic_scale_for_fsdp``: the converted weights are cast on each rank's
  shard before the all-gather and gathered in 1 byte an element; their scales travel as the
  all-gather's metadata, not in it (``fsdp_utils.WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``),
  so the weight's own amax and casts leave the layer's passes; once a step, after the
  optimizer, one all-reduce (max) of the converted weights' amaxes, one fp32 each, over the
  shard group (in zero and zero2d plans; a sharded pipeline stage's plan gathers in float8
  without it, and with tensor parallelism DTensor's second all-reduce of the amaxes, over the
  tensor-parallel group, is left out: named simplifications). The casts of the shard before each all-gather (1/N of a
  weight's) are left out.
- Memory: torchao saves the linear's high-precision input and weight for backward
  (``matmul_with_hp_or_float8_args.forward``: ``save_for_backward(input_hp, weight_hp_t)``),
  so saved activations are the bf16 run's; the FP8 copies are transient. With float8
  all-gather the gathered converted weights are held in 1 byte an element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from shardsim.config import RunConfig
from shardsim.core.errors import ConfigError
from shardsim.simulator import gpu_kernels as gk
from shardsim.specs.hardware.topology import DeviceSpec
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.float8 import converted_gemms, layer_linears
from shardsim.specs.model.workload import Block, Workload

if TYPE_CHECKING:
    from shardsim.simulator.compute import ComputeModel
    from shardsim.simulator.plan import Dep, Plan
    from shardsim.simulator.strategies.steps import Piece

FP8_BYTES = 1  # e4m3 (torchao's default target dtype for input, weight and grad_output)
HP_BYTES = 2  # bf16: the precision Float8 training is modelled in (`check_float8`)
AMAX_BYTES = 4  # one fp32 amax per converted weight (precompute_float8_dynamic_scale_for_fsdp)
RESCALE_BYTES = 2 * HP_BYTES  # rowwise gradient GEMMs: the bf16 result read and written once more

# Bytes per element of each scaling kernel (forward, backward), per tensor role and recipe:
# torchao roofline_utils.get_tensor_memory_traffic_ovhd_s with fuse_with_prev=False. A 0 is the
# second stage of an amax reduction (traffic not modelled there; it still costs a launch).
SCALING_BYTES: dict[str, dict[str, tuple[tuple[int, ...], tuple[int, ...]]]] = {
    "tensorwise": {
        # amax (read bf16), its second stage, cast to both layouts (read bf16, write fp8 twice)
        "input": ((HP_BYTES, 0, HP_BYTES + 2 * FP8_BYTES), ()),
        # amax, its second stage, cast for the output GEMM; cast again for the input gradient's
        "weight": ((HP_BYTES, 0, HP_BYTES + FP8_BYTES), (HP_BYTES + FP8_BYTES,)),
        "grad_output": ((), (HP_BYTES, 0, HP_BYTES + 2 * FP8_BYTES)),
    },
    "rowwise": {
        # dim0 cast and a bf16 transpose; the transpose's cast for the weight gradient
        "input": ((HP_BYTES + FP8_BYTES + HP_BYTES,), (HP_BYTES + FP8_BYTES,)),
        # dim0 cast; in backward a bf16 transpose and its cast
        "weight": ((HP_BYTES + FP8_BYTES,), (2 * HP_BYTES, HP_BYTES + FP8_BYTES)),
        "grad_output": ((), (HP_BYTES + FP8_BYTES + HP_BYTES, HP_BYTES + FP8_BYTES)),
    },
}


def check_float8(cfg: RunConfig, device: DeviceSpec, arch: Arch | None, profiled: bool) -> None:
    """Refuse, in one line, a Float8 configuration this model cannot predict: a device without
    FP8 tensor cores, a precision other than bf16, a model without an architecture (its linears
    unknown), or a measured profile (its block times have no FP8 GEMMs in them)."""
    if cfg.float8 == "none":
        return
    if device.float8 is None or device.kernels is None:
        raise ConfigError(
            f"{device.model} has no FP8 tensor cores (its topology file has no device.float8 figures); "
            "float8 needs an H100- or H200-class GPU",
            field="float8",
        )
    if cfg.precision != "bf16":
        raise ConfigError(
            f"float8 {cfg.float8} composes with precision bf16 only (torchtitan trains Float8 linears with bf16 "
            f"parameters; the scaling kernels read bf16), got {cfg.precision}",
            field="precision",
        )
    if arch is None:
        raise ConfigError(
            "float8 needs a model with an architecture (its linears); this one is given by import path", field="float8"
        )
    if profiled:
        raise ConfigError(
            "float8 is predicted from the GPU's kernel figures; a measured profile has no FP8 GEMMs", field="float8"
        )
    if arch.spec.moe:
        raise ConfigError(
            f"float8 of a {arch.family} model (grouped expert GEMMs, latent attention) is not modelled", field="float8"
        )


def float8_rate(device: DeviceSpec) -> float:
    """FLOP/s of a large tensorwise-scaled FP8 GEMM on `device` (before the training fraction)."""
    f8 = device.float8
    assert f8 is not None  # `check_float8` refuses a device without FP8 tensor cores
    return f8.peak_tflops * 1e12 * f8.matmul_efficiency


def bwd_converted(k: gk.BlockKernels, fwd: Sequence[bool]) -> tuple[bool, ...]:
    """`fwd`'s flags for the backward GEMMs, in `BlockKernels.bwd_gemms`' order."""
    out: list[bool] = []
    for i, c in enumerate(fwd):
        if k.input_grad or i > 0:
            out.append(c)
        out.append(c)
    return tuple(out)


def scaling_bytes(arch: Arch, k: gk.BlockKernels, recipe: str, all_gather: bool) -> tuple[list[float], list[float]]:
    """Bytes of each dynamic-scaling kernel a layer runs (forward, backward), per converted
    linear of its GEMMs on this rank (a GEMM's linears share it evenly: gate and up), plus the
    rowwise rescale of each gradient GEMM's result. With float8 all-gather the weight arrives
    cast and scaled: no kernel of its own in the passes."""
    fwd: list[float] = []
    bwd: list[float] = []
    linears = layer_linears(arch)
    table = SCALING_BYTES[recipe]
    for i, (g, conv) in enumerate(zip(k.fwd_gemms, converted_gemms(arch), strict=True)):
        if not conv:
            continue
        share = sum(1 for x in linears if x.gemm == i)
        n = g.n // share  # one linear's output features on this rank
        elems = {"input": g.m * g.k, "weight": n * g.k, "grad_output": g.m * n}
        for _ in range(share):
            for role, (f_bytes, b_bytes) in table.items():
                if role == "weight" and all_gather:
                    continue
                fwd += [b * elems[role] * g.count for b in f_bytes]
                bwd += [b * elems[role] * g.count for b in b_bytes]
        if recipe == "rowwise":  # the input gradient's (where computed) and the weight gradient's result
            if k.input_grad or i > 0:
                bwd.append(RESCALE_BYTES * g.m * g.k * g.count)
            bwd.append(RESCALE_BYTES * g.n * g.k * g.count)
    return fwd, bwd


def converted_weight_elems(arch: Arch, b: Block, tp: int) -> int:
    """Elements of block `b`'s converted weights on one of `tp` tensor-parallel ranks (its GEMMs'
    weight shards, as `gpu_kernels.block_kernels` shapes them); 0 for a block other than a layer."""
    k = gk.block_kernels(arch, b, 1, tp)
    if b.kind != "layer" or k is None:
        return 0
    return sum(g.n * g.k * g.count for g, c in zip(k.fwd_gemms, converted_gemms(arch), strict=True) if c)


def float8_layer_elems(cfg: RunConfig, w: Workload, tp: int) -> int:
    """Elements of a layer's weights FSDP2 gathers in float8 on one rank (0 without float8 all-gather)."""
    if not cfg.float8_all_gather or w.arch is None or not w.layers:
        return 0
    return converted_weight_elems(w.arch, w.layers[0], tp)


def gathered_bytes(arch: Arch | None, b: Block, tp: int, param_bytes: int, float8_all_gather: bool) -> float:
    """Bytes FSDP2 all-gathers of block `b`: its parameters in the param dtype, its converted
    weights in float8 where float8 all-gather is on."""
    whole = b.params * param_bytes
    if not float8_all_gather or arch is None:
        return whole
    return whole - converted_weight_elems(arch, b, tp) * (param_bytes - FP8_BYTES)


def converted_per_layer(arch: Arch) -> int:
    """Converted linears (weights, each with its amax) in one layer."""
    return sum(1 for x in layer_linears(arch) if x.converts)


def amax_all_reduce(arch: Arch | None, layers: int, optimizer_step: Callable[..., int]) -> Callable[..., int]:
    """`optimizer_step` of a rank holding `layers` layers, followed by
    precompute_float8_dynamic_scale_for_fsdp's one all-reduce of the converted weights' amaxes
    (a fp32 each) over the shard group, as torchtitan runs it after every optimizer step."""
    nbytes = converted_per_layer(arch) * layers * AMAX_BYTES if arch is not None else 0

    def step(p: Plan, rc: int, cm: ComputeModel, pc: Piece, model_params: float, deps: list[Dep]) -> int:
        opt = optimizer_step(p, rc, cm, pc, model_params, deps)
        if pc.shard is not None:
            p.comm(rc, "ar", "all_reduce", pc.shard, nbytes, "AR float8 amax", [opt], "opt")
        return opt

    return step
