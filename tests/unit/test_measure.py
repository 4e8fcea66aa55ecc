"""The analytic preset workloads equal what torch measures on the runtime's own modules (meta device; the
moe family on the CPU, where its routing runs)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from functools import cache

import pytest
import torch

from shardsim.core.errors import ConfigError
from shardsim.runtime.models.builders import build_model
from shardsim.simulator.workload.measure import measure_import_path, measure_module
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import attention_flops, from_arch
from shardsim.specs.model.library import PRESETS
from shardsim.specs.model.workload import Workload
from tests import fixtures_models as fx

# Every family at small shapes (grouped-query attention, tied embeddings, rotary positions),
# and some library models at full size.
SMALL = {
    "llama-gqa": Arch("llama", hidden=64, layers=2, heads=4, kv_heads=2, ffn=96, seq_len=32, vocab=256),
    "llama-tied": Arch("llama", hidden=64, layers=2, heads=4, ffn=96, seq_len=32, vocab=256, tied_embeddings=True),
    "mpt": Arch("mpt", hidden=64, layers=2, heads=4, ffn=256, seq_len=32, vocab=256, tied_embeddings=True),
    "bert": Arch("bert", hidden=64, layers=2, heads=4, ffn=256, seq_len=32, vocab=256, tied_embeddings=True),
    "gpt-rope": Arch("gpt", hidden=64, layers=2, heads=4, ffn=256, seq_len=32, vocab=256, positions="rope"),
    # llama-shaped Hugging Face types: q/k/v biases (Qwen2); a head width other than hidden / heads
    # and q/k norms (Qwen3, Gemma 3), with rotary positions and without
    "llama-qkv-bias": Arch(
        "llama", hidden=64, layers=2, heads=4, kv_heads=2, ffn=96, seq_len=32, vocab=256, qkv_bias=True
    ),
    "llama-qk-norm": Arch(
        "llama", hidden=64, layers=2, heads=4, kv_heads=2, ffn=96, seq_len=32, vocab=256, head_size=32, qk_norm=True
    ),
    "llama-qk-norm-learned": Arch(
        "llama",
        hidden=64,
        layers=2,
        heads=4,
        ffn=96,
        seq_len=32,
        vocab=256,
        head_size=8,
        qk_norm=True,
        positions="learned",
        tied_embeddings=True,
    ),  # fmt: skip
}
# The moe family: tiny-moe (its first layer dense), with a shared expert and every other layer MoE,
# and with a gated shared expert (Qwen2-MoE's).
MOE = {
    "tiny-moe": PRESETS["tiny-moe"],
    "moe-shared-every2": replace(PRESETS["tiny-moe"], shared_ffn=32, dense_layers=0, moe_every=2),
    "moe-shared-gate": replace(PRESETS["tiny-moe"], shared_ffn=32, shared_gate=True),
}
ARCHS = {
    **SMALL,
    **{n: PRESETS[n] for n in ("tiny-gpt", "tiny-vit", "tiny-mlp", "small-gpt", "vit-630m", "gpt2-xl")},
    **MOE,
}
CHECKED = tuple(ARCHS)
FLOPS_TOL = 0.01
ACT_TOL = 0.15


def _measure(arch: Arch, name: str, seed: int = 0) -> Workload:
    """The runtime's model of `arch` measured on the meta device; an MoE model on the CPU (its
    routing, how many rows each expert gets, depends on the data, which the meta device does not
    hold), where the CPU's attention kernel is counted as the GPU's (`measure.CAUSAL_FORMULAS`)."""
    torch.manual_seed(seed)
    with torch.device("cpu" if arch.experts else "meta"):
        model = build_model(arch)
        inputs, targets = model.sample_batch(2)
    return measure_module(model, name, inputs, targets=targets)


@cache
def measured(name: str) -> Workload:
    return _measure(ARCHS[name], name)


def _close(measured_value: float, analytic: float, tol: float) -> bool:
    if analytic == 0:
        return measured_value == 0
    return abs(measured_value / analytic - 1) <= tol


@pytest.mark.parametrize("name", CHECKED)
def test_analytic_equals_measured_block_by_block(name: str) -> None:
    ana = from_arch(name, ARCHS[name])
    got = measured(name)
    assert [b.kind for b in got.blocks] == [b.kind for b in ana.blocks]
    assert got.tokens_per_sample == ana.tokens_per_sample
    assert got.arch == ana.arch
    for m, a in zip(got.blocks, ana.blocks, strict=True):
        where = f"{name} {a.name}"
        assert m.params == a.params, where
        assert m.param_tensors == a.param_tensors > 0, where
        assert _close(m.fwd_flops, a.fwd_flops, FLOPS_TOL), (where, m.fwd_flops, a.fwd_flops)
        assert _close(m.bwd_flops, a.bwd_flops, FLOPS_TOL), (where, m.bwd_flops, a.bwd_flops)
        assert _close(m.act_elems, a.act_elems, ACT_TOL), (where, m.act_elems, a.act_elems)
        assert _close(m.act_matmul_elems, a.act_matmul_elems, ACT_TOL), (where, m.act_matmul_elems, a.act_matmul_elems)
        assert m.in_elems == a.in_elems, where
        assert m.out_elems == a.out_elems, where
    assert got.params == ana.params


def test_an_moe_layers_figures_do_not_depend_on_its_routing() -> None:
    """Every token goes to top_k experts however the router spreads them: two initializations
    that load the experts differently measure the same (the analytic figures assume it)."""
    loads = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = build_model(PRESETS["tiny-moe"])
        x, _ = model.sample_batch(2)
        with torch.no_grad():
            model(x)  # what the measurement runs, block by block
        loads.append(model.blocks[1].mlp.tokens_per_expert.tolist())
    assert loads[0] != loads[1] and sum(loads[0]) == sum(loads[1])
    assert _measure(PRESETS["tiny-moe"], "tiny-moe", seed=1).blocks == measured("tiny-moe").blocks


def test_a_model_measured_on_the_cpu_counts_its_attention_as_on_the_meta_device() -> None:
    """The CPU runs SDPA through its own flash kernel: counted with the fused kernel's formulas,
    a dense model measures the same there as on the meta device (saved elements within a few
    scalars: the GPU kernel's random seed and offset)."""
    arch = ARCHS["llama-tied"]
    with torch.device("cpu"):
        model = build_model(arch)
        inputs, targets = model.sample_batch(2)
    cpu = measure_module(model, "llama-tied", inputs, targets=targets)
    for c, m in zip(cpu.blocks, measured("llama-tied").blocks, strict=True):
        assert (c.fwd_flops, c.bwd_flops) == (m.fwd_flops, m.bwd_flops), c.name
        assert c.act_elems == pytest.approx(m.act_elems, abs=2), c.name
        assert c.act_matmul_elems == pytest.approx(m.act_matmul_elems, abs=2), c.name


def test_first_block_without_embedding_computes_no_input_gradient() -> None:
    """tiny-mlp: the raw batch needs no gradient, so block 0's backward is 3/4 of the others'."""
    blocks = measured("tiny-mlp").layers
    assert blocks[0].bwd_flops == pytest.approx(0.75 * blocks[1].bwd_flops)
    assert blocks[1].bwd_flops == pytest.approx(2 * blocks[1].fwd_flops)


def test_attention_is_costed_as_a_fused_kernel() -> None:
    """No s*s score matrix is saved (flash attention), backward counts 5 bmm against 2, and a
    causal kernel does half the s*s products (a bidirectional one all of them)."""
    a = PRESETS["small-gpt"]
    s, h, f = a.tokens, a.hidden, a.ffn_size
    layer = measured("small-gpt").layers[0]
    assert layer.act_elems < s * (8 * h + 2 * f) + s * a.heads + 4 * s + 2  # well under one s*s*heads matrix
    matmul = 2.0 * s * (4 * h * h + 2 * h * f)
    attn = 4.0 * s * s * h / 2  # causal
    assert layer.fwd_flops == pytest.approx(matmul + attn)
    assert layer.bwd_flops == pytest.approx(2 * matmul + 2.5 * attn)
    vit = PRESETS["tiny-vit"]
    assert attention_flops(vit) == 4.0 * vit.tokens**2 * vit.hidden


def test_selective_checkpointing_keeps_matmul_and_attention_outputs() -> None:
    """act_matmul_elems: qkv, attention out and log-sum-exp, fc1 (SwiGLU: gate and up) per token."""
    for name in ("tiny-gpt", "llama-gqa"):
        a = ARCHS[name]
        s, h, f = a.tokens, a.hidden, a.ffn_size
        mlp = 2 * f if a.family == "llama" else f
        ana = from_arch(name, a).layers[0]
        assert ana.act_matmul_elems == s * (2 * h + 2 * a.kv_dim + a.heads + mlp)
        assert 0 < ana.act_matmul_elems < ana.act_elems


def test_import_path_hand_written_model() -> None:
    path = "tests.fixtures_models:build_two_block"
    w = load_workload(path)
    assert w.name == path and w.import_path == path and w.arch is None
    assert [b.kind for b in w.blocks] == ["layer", "layer", "head"]
    i, hid, o = fx.IN, fx.HID, fx.OUT
    assert [b.params for b in w.blocks] == [i * hid + hid, hid * hid + hid, hid * o + o]
    assert [b.fwd_flops for b in w.blocks] == [2 * i * hid, 2 * hid * hid, 2 * hid * o]
    # block 0 gets the raw batch: weight gradient only
    assert [b.bwd_flops for b in w.blocks] == [2 * i * hid, 4 * hid * hid, 4 * hid * o]
    assert [b.in_elems for b in w.blocks] == [i, hid, hid]
    assert [b.out_elems for b in w.blocks] == [hid, hid, o]
    assert w.tokens_per_sample == 1


def test_import_path_runtime_model_matches_preset() -> None:
    path = "tests.fixtures_models:build_tiny_gpt"
    w = measure_import_path(path)
    ana = from_arch("tiny-gpt", PRESETS["tiny-gpt"])
    assert w.arch == PRESETS["tiny-gpt"]
    assert w.params == ana.params
    assert w.train_flops == pytest.approx(ana.train_flops, rel=FLOPS_TOL)
    assert [b.act_elems for b in w.blocks] == [b.act_elems for b in measured("tiny-gpt").blocks]


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("no_such_pkg_zz.models:build", "no module named"),
        ("tests.fixtures_models:nope", "no attribute"),
        ("tests.fixtures_models:not_callable", "not callable"),
        ("tests.fixtures_models:build_broken", "checkpoint shard missing"),
        ("tests.fixtures_models:build_not_a_module", "not an nn.Module"),
        ("tests.fixtures_models:build_no_blocks", "blocks"),
        ("tests.fixtures_models:build_no_input", "sample_batch"),
        ("tests.fixtures_models:", "pkg.module:build_fn"),
    ],
)
def test_bad_import_path_is_a_one_line_config_error(path: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        measure_import_path(path)
    msg = str(err.value)
    assert "\n" not in msg
    assert path in msg
    assert needle in msg


def test_presets_do_not_import_torch() -> None:
    code = (
        "import sys; from shardsim.simulator.workload.resolve import load_workload; load_workload('llama-3.1-8b'); "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_reusing_identical_blocks_changes_nothing() -> None:
    with torch.device("meta"):
        model = build_model(PRESETS["tiny-vit"])
        inputs, targets = model.sample_batch(2)
    full = measure_module(model, "tiny-vit", inputs, targets=targets, reuse=False)
    assert full.blocks == measured("tiny-vit").blocks
    assert "3 identical blocks reused" in measured("tiny-vit").notes["measured"]
