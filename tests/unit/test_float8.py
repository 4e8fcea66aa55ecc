"""Float8 training (torchao's Float8Linear, torchtitan's filter): the refusals, the plan against
torchao's own conversion of the runtime's model, and what Float8 changes in a prediction."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shardsim.cli import main
from shardsim.config import RunConfig
from shardsim.core.errors import ConfigError
from shardsim.simulator import float8 as f8
from shardsim.simulator import gpu_kernels as gk
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.predict import predict
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.float8 import converted_linears
from shardsim.sweep.space import SweepSpace, enumerate_configs

LLAMA = "llama-3.1-8b"
P5 = RunConfig(workload=LLAMA, topology="p5.48xlarge", nodes=1, precision="bf16", batch_per_device=1)
# a llama whose MLP (ffn 200) is not divisible by 16: only its attention converts
ODD_MLP = {
    "family": "llama",
    "hidden": 64,
    "layers": 2,
    "heads": 4,
    "kv_heads": 2,
    "ffn": 200,
    "vocab": 256,
    "seq_len": 32,
}
SMALL_LLAMA = {**ODD_MLP, "ffn": 192}
MODELS = ["tiny-gpt", "tiny-vit", "tiny-mlp", SMALL_LLAMA, ODD_MLP]


def run_cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("topology", ["p4d.24xlarge", "p3dn.24xlarge", "g4dn.12xlarge", "a100-40gb-roce"])
def test_devices_without_fp8_tensor_cores_are_refused(topology):
    with pytest.raises(ConfigError, match="has no FP8 tensor cores") as exc:
        predict(RunConfig(workload="tiny-gpt", topology=topology, nodes=1, precision="fp16", float8="tensorwise"))
    assert exc.value.field == "float8"


@pytest.mark.parametrize("precision", ["fp32", "fp16", "tf32"])
def test_precisions_other_than_bf16_are_refused(precision):
    with pytest.raises(ConfigError, match=f"bf16 only .* got {precision}") as exc:
        predict(P5.replace(precision=precision, float8="rowwise"))
    assert exc.value.field == "precision"


def test_float8_all_gather_needs_tensorwise():
    for recipe in ("none", "rowwise"):
        with pytest.raises(ConfigError, match="needs float8: tensorwise") as exc:
            RunConfig(float8=recipe, float8_all_gather=True)
        assert exc.value.field == "float8_all_gather"


def test_command_line_refusals_are_one_line_exit_2(capsys):
    base = ["predict", "--workload", "tiny-gpt", "--nodes", "1"]
    for extra in (
        ["--topology", "p4d.24xlarge", "--float8", "tensorwise"],
        ["--topology", "p5.48xlarge", "--float8", "rowwise", "--float8-all-gather"],
        ["--topology", "p5.48xlarge", "--float8", "fp8"],
    ):
        assert run_cli(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err and "unexpected" not in err


def test_runtime_refuses_float8():
    from shardsim.runtime.stack import check_runtime_stack

    with pytest.raises(ConfigError) as exc:
        check_runtime_stack(RunConfig(float8="tensorwise"), True, True)
    assert exc.value.field == "float8"


# -- the plan against torchao's conversion ---------------------------------------------------------


def _torchtitan_filter(mod, fqn: str) -> bool:
    """torchtitan/components/quantization/utils.py module_filter_fn, filter_fqns as its Llama
    recipes set them (["output"], the head: ``head`` in the runtime's model)."""
    import torch.nn as nn

    if not isinstance(mod, nn.Linear):
        return False
    dims_multiples_of_16 = mod.weight.shape[0] % 16 == 0 and mod.weight.shape[1] % 16 == 0
    return dims_multiples_of_16 and "head" not in fqn


@pytest.fixture(scope="module")
def torchao_float8():
    torch = pytest.importorskip("torch")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        from torchao.float8.float8_linear import Float8Linear
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        pytest.skip(f"torchao cannot be imported here: {exc}")
    return torch, Float8LinearConfig, convert_to_float8_training, Float8Linear


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m if isinstance(m, str) else f"llama-ffn{m['ffn']}")
def test_plan_converts_exactly_what_torchao_converts(torchao_float8, model):
    torch, Float8LinearConfig, convert, Float8Linear = torchao_float8
    from shardsim.runtime.models.builders import build_model

    arch = load_workload(RunConfig(workload=model).workload).arch
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    m = convert(build_model(arch).to(torch.bfloat16), module_filter_fn=_torchtitan_filter, config=config)
    torchao = tuple(name for name, mod in m.named_modules() if isinstance(mod, Float8Linear))
    assert converted_linears(arch) == torchao
    assert (model == ODD_MLP) == all(".attn." in n for n in torchao)  # the odd MLP stays in bf16

    # FSDP2's float8 all-gather of one layer: its converted weights as e4m3 (1 byte an element, the
    # scale as metadata), every other parameter in the bf16 param dtype
    gathered = 0
    for p in m.blocks[0].parameters():
        if hasattr(p, "fsdp_pre_all_gather"):
            p._precomputed_scale = torch.tensor(1.0)  # precompute_float8_dynamic_scale_for_fsdp's
            (data,), (scale,) = p.fsdp_pre_all_gather(None)
            assert data.dtype == torch.float8_e4m3fn and scale.numel() == 1
            gathered += data.numel() * data.element_size()
        else:
            gathered += p.numel() * 2
    layer = from_arch("m", arch).layers[0]
    assert f8.gathered_bytes(arch, layer, 1, 2, float8_all_gather=True) == gathered
    assert f8.gathered_bytes(arch, layer, 1, 2, float8_all_gather=False) == layer.params * 2


@pytest.mark.parametrize("model", ["llama-3.1-8b", "gpt2-xl", "bert-large", "mpt-7b", "mlp-4x16k"])
def test_plan_converts_what_torchao_converts_in_library_models_on_meta(torchao_float8, model):
    torch, _, convert, Float8Linear = torchao_float8
    from shardsim.runtime.models.builders import build_model

    arch = load_workload(model).arch
    with torch.device("meta"):
        m = convert(build_model(arch), module_filter_fn=_torchtitan_filter)
    assert converted_linears(arch) == tuple(n for n, mod in m.named_modules() if isinstance(mod, Float8Linear))


# -- what Float8 changes in a prediction -----------------------------------------------------------


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    recipe=st.sampled_from(["tensorwise", "rowwise"]),
    tp=st.sampled_from([1, 2, 8]),
    batch=st.sampled_from([1, 2]),
    all_gather=st.booleans(),
)
def test_float8_step_is_faster_and_its_gemms_no_faster_than_the_peak_ratio(recipe, tp, batch, all_gather):
    assume(not (all_gather and recipe == "rowwise"))
    cfg = P5.replace(batch_per_device=batch, strategy={"kind": "zero", "tp": tp})
    f8cfg = cfg.replace(float8=recipe, float8_all_gather=all_gather)
    bf16, fp8 = predict(cfg), predict(f8cfg)
    assert fp8.step_time_s < bf16.step_time_s
    dev = make_cluster("p5.48xlarge", 1).instance.device
    ratio = dev.float8.peak_tflops / dev.peak_tflops["bf16"]
    assert fp8.breakdown["compute_s"] >= bf16.breakdown["compute_s"] / ratio
    # a layer's GEMMs alone: faster in FP8, by no more than the FP8 / BF16 peak ratio
    arch = load_workload(LLAMA).arch
    cm = ComputeModel(dev, "bf16", arch=arch, tp=tp, float8=recipe)
    k = gk.block_kernels(arch, from_arch("m", arch, tp).layers[0], batch, tp)
    assert k is not None
    rate = cm.flops_per_s * dev.kernels.gemm_training_fraction
    fwd8, bwd8 = cm.float8_kernels(k, rate)
    gemms8 = sum(fwd8[: len(k.fwd_gemms)]) + sum(bwd8[: len(k.bwd_gemms)])
    gemms16 = sum(gk.gemm_time(g, dev.kernels, rate, cm.mem_bytes_per_s, 2) for g in (*k.fwd_gemms, *k.bwd_gemms))
    assert gemms16 / ratio <= gemms8 < gemms16


def test_float8_all_gather_halves_the_converted_weights_bytes_and_adds_one_amax_all_reduce():
    cfg = P5.replace(float8="tensorwise")
    off, on = predict(cfg), predict(cfg.replace(float8_all_gather=True))
    assert on.collectives["all_reduce"] == off.collectives.get("all_reduce", 0) + 1
    assert on.memory["gathered_gib"] < off.memory["gathered_gib"]
    assert on.step_time_s < off.step_time_s


def test_json_states_float8_and_both_peaks_only_when_on():
    d = predict(P5.replace(float8="rowwise")).to_dict()
    assert d["float8"] == "rowwise" and d["config"]["float8"] == "rowwise"
    assert d["mfu_peak_precision"] == "bf16"  # MFU against the bf16 peak, as torchtitan reports it
    assert d["mfu_fp8_peak"] == pytest.approx(d["tflops_per_device"] / d["peak_tflops_fp8"])
    assert d["mfu_fp8_peak"] == pytest.approx(d["mfu"] * d["peak_tflops"] / d["peak_tflops_fp8"])
    plain = predict(P5).to_dict()
    assert not {"float8", "mfu_fp8_peak", "peak_tflops_fp8"} & plain.keys()
    assert "float8" not in plain["config"] and "float8_all_gather" not in plain["config"]


def test_text_output_names_the_fp8_peak(capsys):
    argv = ["predict", "--workload", LLAMA, "--topology", "p5.48xlarge", "--nodes", "1", "--float8", "tensorwise"]
    assert run_cli(argv) == 0
    out = capsys.readouterr().out
    assert "of the bf16 dense peak" in out and "of the fp8 dense peak (1.979 PFLOP/s)" in out


def test_sweep_axis_adds_float8_rows_and_drops_them_without_fp8():
    w = load_workload("tiny-gpt")
    base = RunConfig(workload="tiny-gpt", topology="p5.48xlarge", nodes=1, precision="bf16")
    plain = enumerate_configs(base, SweepSpace(strategies=("zero",), tp_degrees=(1,)), workload=w)
    both = enumerate_configs(
        base, SweepSpace(strategies=("zero",), tp_degrees=(1,), float8=("none", "tensorwise")), workload=w
    )
    assert [c.cfg.float8 for c in plain.candidates] == ["none"]
    assert sorted(c.cfg.float8 for c in both.candidates) == ["none", "tensorwise"]
    assert any(c.label.endswith("float8 tensorwise") for c in both.candidates)
    gather = SweepSpace(strategies=("zero",), tp_degrees=(1,), float8=("none", "tensorwise", "rowwise"))
    rows = enumerate_configs(base, replace(gather, float8_all_gather=True), workload=w).candidates
    assert {(c.cfg.float8, c.cfg.float8_all_gather) for c in rows} == {
        ("none", False),
        ("tensorwise", True),  # torchao gathers in float8 with tensorwise scaling only
        ("rowwise", False),
    }
    assert any(c.label.endswith("float8 tensorwise, float8 all-gather") for c in rows)
    a100 = enumerate_configs(
        base.replace(topology="p4d.24xlarge"),
        SweepSpace(strategies=("zero",), tp_degrees=(1,), float8=("none", "tensorwise")),
        workload=w,
    )
    assert [c.cfg.float8 for c in a100.candidates] == ["none"]
    assert any("no FP8 tensor cores" in why for why in a100.dropped)
