"""The compute model from kernels (simulator.gpu_kernels): wave quantization, efficiency that
saturates at the sustained fraction, the eager floor, and CPUs left on the roofline."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardsim.simulator import gpu_kernels as gk
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import load_instance
from shardsim.specs.model.library import PRESETS

A100 = load_instance("p4d.24xlarge").device
SPEC = A100.kernels
RATE = A100.peak_tflops["bf16"] * 1e12 * A100.matmul_efficiency["bf16"]
BW = A100.memory_bandwidth_GBps * 1e9 * A100.memory_efficiency


def t(g: gk.Gemm) -> float:
    return gk.gemm_time(g, SPEC, RATE, BW, 2)


def test_one_tile_over_a_full_wave_costs_two_waves():
    # 108 SMs: 12 x 9 tiles of 128x128 fill one wave; one more row of tiles starts a second
    spec = replace(SPEC, tile_m=128, tile_n=128)
    full = gk.Gemm(12 * 128, 9 * 128, 16384)
    over = gk.Gemm(12 * 128 + 1, 9 * 128, 16384)
    assert gk.gemm_time(over, spec, RATE, BW, 2) / gk.gemm_time(full, spec, RATE, BW, 2) == pytest.approx(2.0)


def test_efficiency_rises_with_size_and_saturates_at_the_sustained_fraction():
    effs = [gk.Gemm(n, n, n).flops / t(gk.Gemm(n, n, n)) / RATE for n in (256, 1024, 4096, 16384)]
    assert effs == sorted(effs)
    assert effs[0] < 0.5
    assert effs[-1] == pytest.approx(1.0, rel=0.02)


def test_the_floor_dominates_tiny_blocks():
    w = load_workload("tiny-gpt")
    cm = ComputeModel(A100, "bf16", arch=PRESETS["tiny-gpt"])
    layer = w.layers[0]
    c = cm.block(layer, 1)
    k = gk.block_kernels(cm.arch, layer, 1)
    n_fwd = len(k.fwd_gemms) + 1 + k.fwd_other_kernels
    assert c.fwd_s == pytest.approx(n_fwd * SPEC.kernel_floor_us * 1e-6, rel=0.05)
    # doubling a tiny microbatch costs (almost) nothing
    assert cm.block(layer, 2).fwd_s == pytest.approx(c.fwd_s, rel=0.05)


def test_compute_grows_less_than_linearly_in_the_microbatch_then_linearly():
    w = load_workload("gpt2-xl")
    cm = ComputeModel(A100, "bf16", arch=PRESETS["gpt2-xl"])
    t1, t8, t16 = (cm.block(w.layers[0], b).fwd_s for b in (1, 8, 16))
    assert t8 < 8 * t1
    assert t16 / t8 == pytest.approx(2.0, rel=0.1)


def test_causal_attention_counts_half_the_work():
    full = gk.Attention(32, 4096, 128, causal=False)
    causal = replace(full, causal=True)
    assert causal.fwd_flops == full.fwd_flops / 2
    assert gk.attention_time(SPEC, causal, bwd=False) < 0.6 * gk.attention_time(SPEC, full, bwd=False)


def test_cpu_devices_and_models_without_an_arch_keep_the_roofline():
    cpu = load_instance("emu-2x2").device
    w = load_workload("tiny-gpt")
    b = w.layers[0]
    assert cpu.kernels is None
    assert ComputeModel(cpu, "fp32", arch=PRESETS["tiny-gpt"]).block(b, 4) == ComputeModel(cpu, "fp32").block(b, 4)
    roof = ComputeModel(A100, "bf16").block(b, 4)  # no arch: roofline on a GPU too
    assert roof.fwd_s == pytest.approx(b.fwd_flops * 4 / RATE + b.fwd_mem_elems * 4 * 2 / BW)


def test_a_gated_mlp_and_grouped_kv_heads_shape_the_gemms():
    """Llama's SwiGLU runs gate and up as one GEMM of twice the width; its K and V projections
    are kv_heads wide; its attention is causal. A gpt layer of the same size has neither."""
    from shardsim.simulator.gpu_kernels import block_kernels
    from shardsim.simulator.workload.resolve import load_workload

    llama = load_workload("llama-3.1-8b")
    a = llama.arch
    k = block_kernels(a, llama.layers[0], 1)
    widths = [g.n for g in k.fwd_gemms]
    assert widths == [a.hidden + 2 * a.kv_dim, a.hidden, 2 * a.ffn_size, a.hidden]
    assert a.kv_dim < a.hidden and k.attention.causal


def test_fsdp_reduce_copy_is_written_in_the_reduce_dtype():
    """FSDP's copy-in before a reduce-scatter reads bf16 gradients and writes the reduce dtype:
    fp32 reduction copies 6 bytes a parameter against 4."""
    from shardsim.simulator.compute import ComputeModel
    from shardsim.specs.hardware.topology import load_instance

    dev = load_instance("p5.48xlarge").device
    bf16 = ComputeModel(dev, "bf16").fsdp_cpu(1e9, 1e8)
    fp32 = ComputeModel(dev, "bf16", reduce_dtype="fp32").fsdp_cpu(1e9, 1e8)
    assert fp32.gather_s_per_param == bf16.gather_s_per_param
    assert fp32.reduce_s_per_param == pytest.approx(1.5 * bf16.reduce_s_per_param)
