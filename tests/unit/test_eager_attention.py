"""Eager attention (Hugging Face's eager_attention_forward: two matmuls and the softmax in the
training precision): its bytes and FLOPs counted by hand, the memory torch saves for it, its
place between flash and math, the runtime's layer against SDPA, and the warnings of the choices
that run slower than their precision suggests."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from shardsim.cli import main
from shardsim.config import RunConfig
from shardsim.core.errors import ConfigError
from shardsim.simulator import attention_impl as ai
from shardsim.simulator import gpu_kernels as gk
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.predict import predict
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.load import resolve_arch
from tests.unit.test_stack_settings import saved_bytes

GIB = 2**30
A100 = dict(topology="p4d.24xlarge", nodes=1)


def _p(**kw):
    return predict(RunConfig(**{**A100, "workload": "gpt2-xl", "precision": "bf16", **kw}))


def test_eager_kernels_bytes_by_hand():
    """Per score element, the bytes each elementwise kernel reads + writes (e: 2 in fp16 / bf16)."""
    # bf16: scale 2+2, mask 2+2, cast to fp32 2+4, softmax 4+4, cast back 4+2 (PyTorch's fused
    # half-to-float softmax is fp16's only)
    assert ai.eager_fwd_kernels(True, "bf16") == (4, 4, 6, 8, 6)
    assert ai.eager_fwd_kernels(False, "bf16") == (4, 6, 8, 6)
    assert ai.eager_fwd_kernels(True, "fp16") == (4, 4, 6, 6)
    assert ai.eager_fwd_kernels(True, "fp32") == ai.eager_fwd_kernels(True, "tf32") == (8, 8, 8)
    # backward: the cast's 2+4, softmax's (dP, P fp32 read; dS written), bf16's cast of dS 4+2, the scale's 2+2
    assert ai.eager_bwd_kernels("bf16") == (6, 12, 6, 4)
    assert ai.eager_bwd_kernels("fp16") == (6, 10, 4)
    assert ai.eager_bwd_kernels("fp32") == (12, 8)


def test_eager_layer_on_the_roofline_by_hand():
    """A tiny layer on the roofline (the A100 without kernel figures): eager adds to the fused
    attention exactly the full S x S work beyond the causal kernel's and the score tensor's bytes."""
    dev = replace(make_cluster("p4d.24xlarge", 1).instance.device, kernels=None)
    a = Arch("gpt", hidden=64, layers=1, heads=4, seq_len=16, vocab=64)
    layer = from_arch("t", a).layers[0]
    batch = 3
    flash, eager = (ComputeModel(dev, "bf16", arch=a, attention=x).block(layer, batch) for x in ("flash", "eager"))
    bh, s, d = batch * 4, 16, 16
    elems = bh * s * s  # 3,072 score elements
    full = 4 * bh * s * s * d  # QK^T and PV over the whole S x S: 196,608 FLOPs
    fused = full / 2  # the causal kernel's
    cm = ComputeModel(dev, "bf16")
    fwd = (full - fused) / cm.flops_per_s + elems * 28 / cm.mem_bytes_per_s
    bwd = (2 * full - 2.5 * fused) / cm.flops_per_s + elems * 28 / cm.mem_bytes_per_s
    assert eager.fwd_s - flash.fwd_s == pytest.approx(fwd, rel=1e-9)
    assert eager.bwd_s - flash.bwd_s == pytest.approx(bwd, rel=1e-9)


@pytest.mark.parametrize("family", ["bert", "gpt"])
@pytest.mark.parametrize(("dtype", "esize"), [(torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2)])
def test_eager_attention_saves_what_torch_saves(family, dtype, esize):
    """The score tensors eager saves beyond the fused kernel (the fp32 softmax output, in half
    precision its cast too, less the log-sum-exp), counted by torch on a layer, exactly."""
    from shardsim.runtime.models.transformer import TransformerLayer

    a = Arch(family, hidden=64, layers=1, heads=4, seq_len=32, vocab=64)
    layer, x = TransformerLayer(a).to(dtype), torch.randn(3, 32, 64, dtype=dtype)
    fused = saved_bytes(layer, x)
    layer.attn.eager = True
    want = 3 * ai.eager_saved_extra_bytes(4, 32, esize)
    assert want == 3 * (4 * 4 * 32 * 32 + (esize * 4 * 32 * 32 if esize == 2 else 0) - 4 * 4 * 32)
    assert saved_bytes(layer, x) - fused == want


def test_eager_attention_memory_is_the_score_matrix():
    kw = dict(workload="bert-large", checkpointing="none", batch_per_device=8)
    flash, eager = _p(**kw), _p(attention="eager", **kw)
    a = resolve_arch("bert-large")[1]
    assert a is not None
    per_head = 4 * a.tokens * (a.tokens - 1) + 2 * a.tokens**2  # fp32 probabilities less the lse, their bf16 cast
    extra = a.layers * 8 * a.heads * per_head
    assert (eager.memory["activations_gib"] - flash.memory["activations_gib"]) * GIB == pytest.approx(extra)


def test_eager_sits_between_flash_and_math_on_a100_bf16_at_long_sequences():
    """Llama-2-7B at 8k tokens in bf16 on A100: flash < eager < math, by construction of the
    rates. Per score element (head dim 128, forward and backward): math's and eager's six GEMMs
    (12·d FLOPs) run at fp32's rate and at bf16's tensor-core rate, a gap (87 ps) that exceeds
    eager's extra elementwise bytes over math's (56 against 28, 21 ps at the achieved HBM
    bandwidth) whatever the GEMM fractions; flash reads no score tensor and computes the causal
    half at the fused rates (8.5 ps at the training fraction), less than eager's bytes alone (42 ps)."""
    kw = dict(workload="llama-2-7b", seq_len=8192, batch_per_device=1, checkpointing="none")
    t = {x: _p(attention=x, **kw).breakdown["compute_s"] for x in ("flash", "eager", "math")}
    assert t["flash"] < t["eager"] < t["math"]
    dev = make_cluster("p4d.24xlarge", 1).instance.device
    k = dev.kernels
    assert k is not None
    d, bw = 128, dev.memory_bandwidth_GBps * 1e9 * dev.memory_efficiency
    eager_bytes = sum(ai.eager_fwd_kernels(True, "bf16")) + sum(ai.eager_bwd_kernels("bf16"))
    math_bytes = (ai.SCORE_FWD_PASSES + ai.CAUSAL_MASK_PASSES + ai.SCORE_BWD_PASSES) * ai.SCORE_BYTES
    fp32, bf16 = (dev.peak_tflops[p] * 1e12 * dev.matmul_efficiency[p] for p in ("fp32", "bf16"))
    assert 12 * d * (1 / fp32 - 1 / bf16) > 2 * (eager_bytes - math_bytes) / bw
    rate = k.attn_training_fraction * 1e12
    fused = 4 * d / 2 * (1 / (k.attn_fwd_tflops * rate) + gk.BWD_ATTN_WORK / (k.attn_bwd_tflops * rate))
    assert eager_bytes / bw > 2 * fused


@pytest.mark.parametrize(("family", "kw"), [("gpt", {}), ("bert", {}), ("llama", {"kv_heads": 2, "ffn": 96})])
def test_runtime_eager_layer_equals_sdpa(family, kw):
    """One process: a layer with eager attention computes SDPA's output and gradients (fp32)."""
    from shardsim.runtime.models.transformer import TransformerLayer

    torch.manual_seed(0)
    a = Arch(family, hidden=64, layers=1, heads=4, seq_len=16, vocab=64, **kw)
    layer = TransformerLayer(a)
    x = torch.randn(2, 16, 64)
    outs = []
    for eager in (False, True):
        layer.attn.eager = eager
        layer.zero_grad()
        y = layer(x)
        y.square().sum().backward()
        outs.append((y.detach(), [p.grad.clone() for p in layer.parameters()]))
    torch.testing.assert_close(outs[0][0], outs[1][0])
    for g0, g1 in zip(outs[0][1], outs[1][1], strict=True):
        torch.testing.assert_close(g0, g1)


def test_runtime_applies_eager():
    from shardsim.runtime.models.builders import build_model
    from shardsim.runtime.stack import apply_model_settings, check_runtime_stack

    check_runtime_stack(RunConfig(attention="eager"), False, False)  # CPU and CUDA alike
    model = apply_model_settings(build_model(Arch("gpt", hidden=32, layers=2, heads=4, seq_len=8, vocab=40)),
                                 RunConfig(attention="eager"))  # fmt: skip
    assert [b.attn.eager and b.attn.backends is None for b in model.blocks] == [True, True]


def test_eager_is_refused_with_context_parallelism():
    with pytest.raises(ConfigError, match="not eager") as exc:
        predict(RunConfig(workload="llama-2-7b", topology="p4d.24xlarge", nodes=1, cp=2, attention="eager"))
    assert exc.value.field == "attention"


@pytest.mark.parametrize(
    ("attention", "precision", "said"),
    [
        ("flash", "tf32", "attention flash under tf32 runs at the fp32 rate"),
        ("efficient", "tf32", "attention efficient under tf32 runs at the fp32 rate"),
        ("math", "bf16", "attention math under bf16 runs in fp32"),
        ("math", "fp16", "attention math under fp16 runs in fp32"),
        ("flash", "bf16", None),
        ("eager", "tf32", None),
        ("eager", "bf16", None),
        ("math", "tf32", None),
        ("flash", "fp32", None),
    ],
)
def test_slower_rate_warning(attention, precision, said):
    line = ai.slower_rate_warning(attention, precision)
    assert (line is None) if said is None else (line is not None and line.startswith(said) and "\n" not in line)


def _attention_lines(err: str) -> list[str]:
    return sorted(line.removeprefix("shardsim: ") for line in err.splitlines() if "attention" in line)


def test_predict_warns_on_stderr(capsys):
    args = ["predict", "--workload", "tiny-gpt", "--topology", "p4d.24xlarge", "--nodes", "1", "--json"]
    assert main([*args, "--precision", "tf32"]) == 0
    assert _attention_lines(capsys.readouterr().err) == [ai.slower_rate_warning("flash", "tf32")]
    assert main([*args, "--precision", "bf16", "--attention", "eager"]) == 0
    assert capsys.readouterr().err == ""


def test_sweep_warns_each_slow_pair_once(capsys):
    args = ["sweep", "--workload", "tiny-gpt", "--topology", "p4d.24xlarge", "--nodes", "1", "--strategy", "ddp,zero",
            "--tp", "1", "--attentions", "flash,eager,math", "--precisions", "bf16,tf32", "--json"]  # fmt: skip
    assert main(args) == 0
    want = sorted(ai.slower_rate_warning(a, p) for a, p in (("flash", "tf32"), ("math", "bf16")))
    assert _attention_lines(capsys.readouterr().err) == want


def test_sweep_does_not_warn_for_rows_it_dropped(capsys):
    """tf32 on a V100 is dropped (no TF32 there): no row runs flash under tf32, no warning."""
    args = ["sweep", "--workload", "tiny-gpt", "--topology", "p3dn.24xlarge", "--nodes", "1", "--strategy", "ddp",
            "--tp", "1", "--precisions", "fp32,tf32", "--json"]  # fmt: skip
    assert main(args) == 0
    assert _attention_lines(capsys.readouterr().err) == []


def test_sweep_of_one_setting_warns_from_its_base(capsys):
    """No listed setting: the table has no attention column, the rows run the base's."""
    args = ["sweep", "--workload", "tiny-gpt", "--topology", "p4d.24xlarge", "--nodes", "1", "--strategy", "ddp,zero",
            "--tp", "1", "--precision", "tf32", "--json"]  # fmt: skip
    assert main(args) == 0
    assert _attention_lines(capsys.readouterr().err) == [ai.slower_rate_warning("flash", "tf32")]
