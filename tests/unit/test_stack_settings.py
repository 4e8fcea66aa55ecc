"""The training stack's settings (attention kernel, tf32, optimizers, torch.compile, masked-LM
head): their configuration, the memory and compute deltas their formulas give, the checks
against torch where torch can count (saved tensors, optimizer state), and the runtime's refusals."""

from __future__ import annotations

import pytest
import torch

from shardsim.config import RunConfig
from shardsim.config.flags import fraction_list
from shardsim.core.errors import ConfigError
from shardsim.simulator import attention_impl as ai
from shardsim.simulator import fusion, optimizers
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.predict import predict
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import from_arch, masked_tokens
from shardsim.specs.model.load import resolve_arch
from shardsim.sweep.space import SweepSpace, enumerate_configs


def library_arch(name: str) -> Arch:
    arch = resolve_arch(name)[1]
    assert arch is not None
    return arch


GIB = 2**30
A100 = dict(topology="p4d.24xlarge", nodes=1)


def _p(**kw):
    return predict(RunConfig(**{**A100, "workload": "gpt2-xl", "precision": "bf16", **kw}))


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"attention": "fused"}, "attention"),
        ({"optimizer": "adagrad"}, "optimizer"),
        ({"mlm_fraction": 0.0}, "mlm_fraction"),
        ({"mlm_fraction": 1.5}, "mlm_fraction"),
        ({"reduce_dtype": "tf32"}, "reduce_dtype"),  # tf32 is no storage dtype
        ({"compile": "yes"}, "compile"),
    ],
)
def test_bad_stack_settings_name_their_field(changes, field):
    with pytest.raises(ConfigError) as exc:
        RunConfig(**changes)
    assert exc.value.field == field


def test_tf32_stores_fp32():
    cfg = RunConfig(precision="tf32")
    assert cfg.storage_precision == "fp32" and cfg.grad_dtype == "fp32"


def test_fraction_lists_parse_and_refuse():
    assert fraction_list("0.15,0.3,0.15") == (0.15, 0.3)
    with pytest.raises(Exception, match=r"\(0, 1\]"):
        fraction_list("0.15,2")


# -- tf32 ------------------------------------------------------------------------------------


def test_tf32_runs_matmuls_at_the_tf32_rate_and_stores_fp32():
    dev = make_cluster("p4d.24xlarge", 1).instance.device
    tf32, fp32 = ComputeModel(dev, "tf32"), ComputeModel(dev, "fp32")
    assert tf32.flops_per_s == pytest.approx(156e12 * 0.8686)  # the datasheet's dense TF32 x its efficiency
    assert tf32.flops_per_s / fp32.flops_per_s == pytest.approx(156 * 0.8686 / (19.5 * 0.85))
    t, f = _p(precision="tf32"), _p(precision="fp32")
    assert t.memory_required_gib == pytest.approx(f.memory_required_gib)  # the same fp32 tensors
    assert t.step_time_s < f.step_time_s / 2


@pytest.mark.parametrize("topology", ["p3dn.24xlarge", "g4dn.12xlarge"])
def test_tf32_is_refused_on_gpus_without_it(topology):
    with pytest.raises(ConfigError, match="has no tf32 support") as exc:
        predict(RunConfig(workload="tiny-gpt", topology=topology, nodes=1, precision="tf32"))
    assert exc.value.field == "precision"
    assert ("V100" if "p3dn" in topology else "T4") in exc.value.message


# -- optimizers ------------------------------------------------------------------------------


def test_optimizer_state_bytes_follow_their_words():
    adam = _p()
    for name, words in (("adamw", 2), ("sgd", 1), ("lamb", 2)):
        got = _p(optimizer=name).memory["optimizer_gib"]
        assert got == pytest.approx(adam.memory["optimizer_gib"] * words / 2, rel=1e-12), name
    a = library_arch("gpt2-xl")
    w = from_arch("gpt2-xl", a)
    ada = _p(optimizer="adafactor").memory["optimizer_gib"]
    assert ada == pytest.approx(adam.memory["optimizer_gib"] / 2 * optimizers.adafactor_words(a, w.params))
    assert ada < adam.memory["optimizer_gib"] / 500  # ~0 words per parameter


def test_adafactor_words_equal_torch_state():
    """The factored state's formula against torch.optim.Adafactor's own state after a step."""
    from shardsim.runtime.models.builders import build_model

    for a in (
        Arch("gpt", hidden=32, layers=2, heads=4, seq_len=16, vocab=50),
        Arch("llama", hidden=32, layers=2, heads=4, kv_heads=2, seq_len=16, vocab=50, ffn=48),
        Arch("bert", hidden=32, layers=1, heads=2, seq_len=8, vocab=40, tied_embeddings=True),
    ):
        model = build_model(a)
        params = [p for p in model.parameters()]
        opt = torch.optim.Adafactor(params, lr=1e-3)
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
        state = sum(v.numel() for s in opt.state.values() for k, v in s.items() if k != "step")
        n = sum(p.numel() for p in params)
        assert state == pytest.approx(optimizers.adafactor_words(a, n) * n), a.family


def test_optimizer_step_cost_is_its_traffic():
    dev = make_cluster("p4d.24xlarge", 1).instance.device
    n = 1e9
    t = {o: ComputeModel(dev, "bf16", optimizer_kind=o).optimizer(n) for o in optimizers.OPTIMIZERS}
    bw = dev.memory_bandwidth_GBps * 1e9 * dev.memory_efficiency
    assert t["adam"] == pytest.approx(n * 7 * 4 / bw)
    assert t["sgd"] / t["adam"] == pytest.approx(5 / 7)
    assert t["lamb"] / t["adam"] == pytest.approx(12 / 7)
    assert t["adafactor"] / t["adam"] == pytest.approx(4 / 7)


def test_sgd_foreach_has_no_step_temporaries():
    adam, sgd = _p(), _p(optimizer="sgd")
    assert adam.memory["step_temporaries_gib"] > 0 and sgd.memory["step_temporaries_gib"] == 0


def test_runtime_refuses_what_pytorch_lacks():
    from shardsim.runtime.stack import check_runtime_stack

    def refused(cfg, gpu=False, sharded=False):
        with pytest.raises(ConfigError) as exc:
            check_runtime_stack(cfg, gpu, sharded)
        return exc.value.field

    assert refused(RunConfig(optimizer="lamb"), gpu=True) == "optimizer"
    assert refused(RunConfig(optimizer="adafactor", optimizer_impl="fused"), gpu=True) == "optimizer_impl"
    assert refused(RunConfig(optimizer="adafactor"), sharded=True) == "optimizer"
    assert refused(RunConfig(attention="efficient")) == "attention"  # CPU: no memory-efficient kernel
    assert refused(RunConfig(workload="tiny-moe", moe_imbalance=2.0)) == "moe_imbalance"  # the run measures its own
    assert refused(RunConfig(workload="tiny-moe", moe_capacity=1.25)) == "moe_capacity"  # its MoE layers are dropless
    check_runtime_stack(RunConfig(attention="efficient"), True, False)
    check_runtime_stack(RunConfig(optimizer="adafactor", strategy="ddp"), False, False)


# -- attention -------------------------------------------------------------------------------


def saved_bytes(layer: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct storages a layer's forward saves for backward (saved_tensors_hooks)."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return sum(seen.values())


def test_math_attention_saves_what_torch_saves():
    """The unfused path's extra saved bytes, counted by saved_tensors_hooks on a layer
    (distinct storages), MATH against PyTorch's default kernel, in fp32 and bf16."""
    from shardsim.runtime.models.transformer import TransformerLayer
    from shardsim.runtime.stack import sdpa_backends

    for family in ("bert", "gpt"):
        for dtype, esize in ((torch.float32, 4), (torch.bfloat16, 2)):
            a = Arch(family, hidden=64, layers=1, heads=4, seq_len=32, vocab=64)
            layer, x = TransformerLayer(a).to(dtype), torch.randn(3, 32, 64, dtype=dtype)
            fused = saved_bytes(layer, x)
            layer.attn.backends = sdpa_backends("math")
            assert saved_bytes(layer, x) - fused == 3 * ai.saved_extra_bytes(4, 32, 3 * 64, esize), (family, dtype)


def test_math_attention_memory_is_the_score_tensor():
    kw = dict(workload="bert-large", checkpointing="none", batch_per_device=8)
    flash, math = _p(**kw), _p(attention="math", **kw)
    a = library_arch("bert-large")
    extra = a.layers * 8 * ai.saved_extra_bytes(a.heads, a.tokens, 3 * a.hidden, 2)  # bf16
    assert (math.memory["activations_gib"] - flash.memory["activations_gib"]) * GIB == pytest.approx(extra)
    assert math.step_time_s > flash.step_time_s


def test_attention_kernels_order_on_long_sequences():
    """At 4k tokens the fused kernels beat the unfused path, flash the memory-efficient one by
    the cited rate (forward and backward of the attention alone)."""
    kw = dict(workload="llama-2-7b", seq_len=4096, batch_per_device=1, checkpointing="none", nodes=1)
    t = {x: _p(attention=x, **kw).breakdown["compute_s"] for x in ("flash", "efficient", "math")}
    assert t["flash"] < t["efficient"] < t["math"]


def test_math_scores_traffic_formula():
    a = ai.Attention(batch_heads=6, seq=100, head_dim=64, causal=True)
    fwd, bwd = ai.math_mem_elems(a)
    assert fwd == 6 * 100 * 100 * (2 + 2) and bwd == 6 * 100 * 100 * 3
    f, b = ai.math_flops(a)
    assert f == 2 * a.fwd_flops and b == 2 * f  # causal: the full S x S, twice the fused kernel's


# -- compile ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2-xl", "llama-2-7b", "bert-large"])
@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, True)])
def test_eager_traffic_matches_the_families(name, tp, sp):
    a = library_arch(name)
    w = from_arch(name, a, tp, sp)
    assert fusion.layer_mem_elems(a, tp, sp) == pytest.approx(w.layers[0].fwd_mem_elems)


def test_compile_fuses_memory_bound_work_only():
    a = library_arch("llama-2-7b")
    h, f, s = a.hidden, a.ffn_size, a.tokens
    eager = s * (10 * h + 5 * f + 10 * (h + a.kv_dim))
    fused = s * (8 * h + 3 * f + 2 * (h + a.kv_dim))
    assert fusion.compiled_share(a) == pytest.approx(fused / eager)
    kw = dict(workload="llama-2-7b", seq_len=2048, batch_per_device=1, nodes=1)
    e, c = _p(**kw), _p(compile=True, **kw)
    assert c.step_time_s < e.step_time_s
    assert c.memory["activations_gib"] < e.memory["activations_gib"]  # `fusion.compiled_saves`
    assert c.memory_required_gib < e.memory_required_gib


# -- masked-LM head --------------------------------------------------------------------------


def test_masked_lm_head_costs_its_fraction():
    a = library_arch("bert-large")
    k = masked_tokens(a, 0.15)
    assert k == round(0.15 * a.tokens)
    full, masked = from_arch("b", a).blocks[-1], from_arch("b", a, mlm_fraction=0.15).blocks[-1]
    assert masked.fwd_flops == pytest.approx(full.fwd_flops * k / a.tokens)
    kw = dict(workload="bert-large", batch_per_device=16, checkpointing="none")
    p, q = _p(**kw), _p(mlm_fraction=0.15, **kw)
    assert q.step_time_s < p.step_time_s and q.memory_required_gib < p.memory_required_gib


def test_masked_lm_head_is_refused_on_causal_models():
    with pytest.raises(ConfigError, match="bidirectional") as exc:
        _p(workload="tiny-gpt", mlm_fraction=0.15)
    assert exc.value.field == "mlm_fraction"


def test_runtime_masked_head_predicts_its_positions():
    from shardsim.runtime.models.builders import build_model
    from shardsim.runtime.models.transformer import masked_positions
    from shardsim.runtime.stack import apply_model_settings

    a = Arch("bert", hidden=32, layers=1, heads=2, seq_len=20, vocab=30)
    torch.manual_seed(0)
    model = build_model(a)
    apply_model_settings(model, RunConfig(workload=a, mlm_fraction=0.25))
    x, y = model.sample_batch(2)
    out = model(x)
    assert out.shape == (2, 5, 30)
    pos = masked_positions(20, 5)
    full = model.head.out(model.head.norm(model.blocks[0](model.embed(x))))
    torch.testing.assert_close(out, full[:, pos])
    want = torch.nn.functional.cross_entropy(out.reshape(-1, 30), y[:, pos].reshape(-1))
    torch.testing.assert_close(model.loss(out, y), want)


# -- sweep -----------------------------------------------------------------------------------


def test_sweep_lists_stack_settings():
    base = RunConfig(workload="tiny-gpt", topology="p4d.24xlarge", nodes=1, precision="bf16")
    space = SweepSpace(strategies=("ddp",), tp_degrees=(1,), optimizers=("adam", "sgd"), attentions=("flash", "math"))
    labels = [c.label for c in enumerate_configs(base, space).candidates]
    assert labels == ["ddp", "ddp, attn math", "ddp, sgd", "ddp, sgd, attn math"]


def test_sweep_drops_a_listed_precision_the_device_lacks():
    base = RunConfig(workload="tiny-gpt", topology="p3dn.24xlarge", nodes=1)
    out = enumerate_configs(base, SweepSpace(strategies=("ddp",), tp_degrees=(1,), precisions=("fp32", "tf32")))
    assert [c.cfg.precision for c in out.candidates] == ["fp32"]
    assert any("no tf32 support" in why for why in out.dropped)


# -- cuDNN attention -------------------------------------------------------------------------


@pytest.mark.parametrize(("topology", "rate"), [("p5.48xlarge", 1.61), ("p4d.24xlarge", 0.82)])
def test_cudnn_attention_runs_at_its_cited_share_of_flash(topology, rate):
    """Forward and backward of a layer's attention kernels at cuDNN's cited share of flash's rate
    on the GPU (faster on H100, slower on A100); the rest of the layer as flash's."""
    dev = make_cluster(topology, 1).instance.device
    a = library_arch("llama-2-7b")
    layer = from_arch("llama-2-7b", a).layers[0]
    flash, cudnn = (ComputeModel(dev, "bf16", arch=a, attention=x) for x in ("flash", "cudnn"))
    (ff, fb), (cf, cb) = flash.attention_s(layer, 1), cudnn.attention_s(layer, 1)
    assert (cf, cb) == (pytest.approx(ff / rate), pytest.approx(fb / rate))
    gap = flash.block(layer, 1).fwd_s - cudnn.block(layer, 1).fwd_s
    assert gap == pytest.approx(ff - cf)


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"topology": "g4dn.12xlarge"}, "attention", "sm80 to sm121"),  # T4: sm75
        ({"topology": "p3dn.24xlarge"}, "attention", "sm80 to sm121"),  # V100: sm70
        ({"topology": "emu-2x2", "backend": "gloo"}, "attention", "sm80 to sm121"),  # CPUs
        ({"precision": "fp32"}, "precision", "fp16 or bf16"),
        ({"precision": "tf32"}, "precision", "fp16 or bf16"),
        (
            {"workload": {"family": "gpt", "hidden": 160, "layers": 2, "heads": 1, "seq_len": 64, "vocab": 64}},
            "attention",
            "160",
        ),
    ],
)
def test_cudnn_attention_is_refused_where_pytorch_cannot_run_it(changes, field, says):
    cfg = RunConfig(**{**A100, "workload": "tiny-gpt", "precision": "bf16", "attention": "cudnn", **changes})
    with pytest.raises(ConfigError) as exc:
        predict(cfg)
    assert exc.value.field == field and says in exc.value.message and "\n" not in exc.value.message


def test_cudnn_head_dims_follow_sdp_utils():
    """head dims cuDNN's SDPA trains with: multiples of 8 up to 128, and 256 on sm90."""
    assert ai.cudnn_refusal("NVIDIA A100 SXM4 40GB", "bf16", 128) is None
    assert ai.cudnn_refusal("NVIDIA H100 SXM 80GB", "fp16", 256) is None
    assert ai.cudnn_refusal("NVIDIA A100 SXM4 40GB", "bf16", 256) is not None
    assert ai.cudnn_refusal("NVIDIA H100 SXM 80GB", "bf16", 192) is not None  # backward: <= 128 or 256
    assert ai.cudnn_refusal("NVIDIA H100 SXM 80GB", "bf16", 100) is not None  # not a multiple of 8


def test_sweep_drops_cudnn_rows_a_device_cannot_run():
    base = RunConfig(workload="tiny-gpt", nodes=1)  # T4, fp32
    out = enumerate_configs(base, SweepSpace(strategies=("ddp",), tp_degrees=(1,), attentions=("flash", "cudnn")))
    assert [c.cfg.attention for c in out.candidates] == ["flash"]
    assert any("sm80 to sm121" in why for why in out.dropped)


def test_runtime_maps_cudnn_to_its_sdpa_backend():
    from torch.nn.attention import SDPBackend

    from shardsim.runtime.stack import check_runtime_stack, sdpa_backends

    assert sdpa_backends("cudnn") == [SDPBackend.CUDNN_ATTENTION]
    check_runtime_stack(RunConfig(attention="cudnn"), True, False)
    with pytest.raises(ConfigError, match="cuDNN SDPA kernel runs on CUDA only") as exc:
        check_runtime_stack(RunConfig(attention="cudnn"), False, False)
    assert exc.value.field == "attention"
