"""asyncTP as inductor's micro-pipeline pass runs it (`simulator.async_tp`): which pairs it fuses,
the chunks' GEMM shapes, and a fused layer's time between full overlap and none."""

from __future__ import annotations

import pytest

from shardsim.config import RunConfig, Strategy, resolve
from shardsim.core.errors import ConfigError
from shardsim.simulator.async_tp import fused_pairs, pair_s
from shardsim.simulator.checkpointing import checkpointing_of
from shardsim.simulator.gpu_kernels import Gemm
from shardsim.simulator.network.links import links_for
from shardsim.simulator.predict import prepare
from shardsim.simulator.strategies.build import plan_tensor_parallel
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.model.blocks import from_arch

SMALL_LLAMA = {
    "workload": "llama-3.1-8b",
    "shape": {"layers": 2, "seq_len": 2048},
    "topology": "p5.48xlarge",
    "nodes": 1,
    "precision": "bf16",
    "batch_per_device": 1,
    "compile": True,
}


def test_the_pairs_and_chunks_are_pytorchs():
    # llama-3.1-8b on 8 ranks, 8,192 tokens: hidden 4096, 32 heads (4 a rank, 512 wide), 8 kv heads
    # (1 a rank, 128 wide), SwiGLU of 14336 (1792 a rank); each chunk one rank's 1,024 tokens
    a = load_workload("llama-3.1-8b").arch
    layer, head = from_arch("l", a, 8, True).layers[0], from_arch("l", a, 8, True).blocks[-1]
    pairs = fused_pairs(a, layer, 8, 8192)
    # SwiGLU's input gradient is gate's + up's (an add wrote it): its reduce-scatter stays plain
    assert set(pairs) == {"attn in", "attn out", "mlp in", "mlp out", "mlp out grad", "attn out grad", "attn in grad"}
    assert pairs["attn in"].chunk(8) == (Gemm(1024, 512 + 2 * 128, 4096),)  # the fused q/k/v projection
    assert pairs["mlp in"].chunk(8) == (Gemm(1024, 1792, 4096), Gemm(1024, 1792, 4096))  # gate, up: two matmuls
    assert pairs["mlp in"].whole == (Gemm(8192, 2 * 1792, 4096),)  # as the GEMM model counts them
    assert pairs["mlp out"].chunk(8) == (Gemm(1024, 4096, 1792),)
    assert pairs["mlp out grad"].chunk(8) == (Gemm(1024, 1792, 4096),)  # down's input gradient
    assert pairs["attn in grad"].chunk(8) == (Gemm(1024, 4096, 768),)
    assert [p.coll for p in pairs.values()].count("all_gather") == 4
    assert set(fused_pairs(a, head, 8, 8192)) == {"head in", "head in grad"}
    # biased Linears trace to addmm, which the pass does not match: gpt keeps its forward pairs
    g = load_workload("tiny-gpt").arch
    assert set(fused_pairs(g, from_arch("g", g, 2, True).layers[0], 2, 64)) == {
        "attn out grad", "attn in grad", "mlp out grad", "mlp in grad"
    }  # fmt: skip


def test_a_pair_is_its_first_chunk_then_the_longer_of_gemm_and_transfer():
    assert pair_s(2.0, 3.0, 4, 1.0) == 1.0 + 2.0 + 3 * 3.0  # transfer-bound
    assert pair_s(3.0, 2.0, 4, 0.5) == 0.5 + 3.0 + 3 * 3.0  # GEMM-bound


@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_a_fused_layer_lies_between_full_overlap_and_none(phase):
    cfg = RunConfig(**SMALL_LLAMA, strategy=Strategy("zero", tp=8, sequence_parallel=True, async_tp=True))
    s = prepare(cfg)
    w, mb = s.ranks_workload, s.res.microbatch_size
    tp = plan_tensor_parallel(s.cfg, s.res, w, checkpointing_of(s.cfg, w.layers), s.compute, links_for(s.cluster))
    assert tp is not None and tp.fused is not None
    layer, lay = w.layers[0], tp.layout(0)
    cost = s.compute.block(layer, mb)
    compute = cost.fwd_s if phase == "fwd" else cost.bwd_s

    def alone(calls) -> float:
        return sum(tp.fused.alone_s(c.coll, lay, tp.nbytes(c, mb)) for c in calls)

    comm = alone(tp.pass_calls(layer, phase))
    fused = compute + tp.extra_s(0, layer, mb, phase) + alone(tp.plain_calls(layer, phase, mb))
    assert max(compute, comm) < fused < compute + comm


def test_async_tp_needs_compile():
    cfg = RunConfig(**(SMALL_LLAMA | {"compile": False}), strategy=Strategy("zero", tp=8, sequence_parallel=True,
                                                                            async_tp=True))  # fmt: skip
    w = load_workload(cfg.workload, cfg.shape)
    with pytest.raises(ConfigError, match="needs compile") as err:
        resolve(cfg, 8, len(w.layers), arch=w.arch, devices_per_node=8)
    assert err.value.field == "async_tp"
