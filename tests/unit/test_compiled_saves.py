"""Activation memory under torch.compile (`fusion.compiled_saves`): the rule read from what
inductor saves on CPU (experiments/readings/compile-saved.md), on hand-counted cases."""

from __future__ import annotations

from shardsim.config import RunConfig
from shardsim.simulator.fusion import compiled_saves, recomputed_elems
from shardsim.simulator.predict import prepare
from shardsim.specs.model.arch import Shape
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.load import resolve_arch


def test_the_measured_layer_saves_what_the_reading_counted():
    # the reading's llama layer (hidden 256, SwiGLU 704, 64 tokens): eager 5,894 elements a token as
    # the model counts them; compiled, each RMSNorm's normalized input (256) and SiLU's output (704)
    # fewer: 4,678, which is the measured 4,486 with the layer's input (256) and without the rotary
    # tables (64) the measurement counts
    name, a = resolve_arch("llama-3.1-8b", Shape(seq_len=64, hidden=256, heads=4, kv_heads=4, ffn=704, layers=1))
    w = from_arch(name, a)
    assert w.layers[0].act_elems == 5894 * 64
    assert compiled_saves(w, True).layers[0].act_elems == 4678 * 64 == 4486 * 64 + (256 - 64) * 64
    assert compiled_saves(w, False) is w
    g = resolve_arch("tiny-gpt")[1]  # LayerNorm and GELU: as in eager (measured: 3,848 a token either way)
    assert recomputed_elems(g) == 0


def test_compile_lowers_a_llama_steps_activations_by_the_rule():
    # llama-3.1-8b, 2 layers, 2,048 tokens, tp 8 with sequence parallelism: a layer saves
    # 2 x 256 x 4,096 normalized elements and 2,048 x 1,792 SiLU outputs a sample fewer, in bf16
    base = RunConfig(workload="llama-3.1-8b", shape={"layers": 2, "seq_len": 2048}, topology="p5.48xlarge", nodes=1,
                     precision="bf16", batch_per_device=1, checkpointing="none",
                     strategy={"kind": "zero", "tp": 8, "sequence_parallel": True})  # fmt: skip
    eager, compiled = (prepare(base.replace(compile=c)).memory for c in (False, True))
    fewer = 2 * (2 * 256 * 4096 + 2048 * 1792) * 2  # layers x elements x bytes
    assert (eager.activations_gib - compiled.activations_gib) * 2**30 == fewer
    # full checkpointing keeps each layer's input and rebuilds one layer at a time: one layer's fewer
    eager, compiled = (prepare(base.replace(compile=c, checkpointing="full")).memory for c in (False, True))
    assert (eager.activations_gib - compiled.activations_gib) * 2**30 == fewer / 2
