"""The defaults that follow from the scenario (`config.model_defaults`): a language model's precision
and batch, the seed scenario's library; and MFU against the peak of the tensor cores."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.cli.app import main
from shardsim.config import RunConfig, load_config
from shardsim.config.model_defaults import LM_TOKENS_PER_DEVICE, lm_batch_per_device
from shardsim.simulator.economics import mfu_peak
from shardsim.simulator.predict import predict
from shardsim.specs.hardware.topology import builtin_topologies, load_instance

LLAMA_70B = {"workload": "llama-3.1-70b", "topology": "p5.48xlarge", "nodes": 16}


def test_a_language_model_left_to_the_defaults_runs_bf16_one_8k_sequence_per_device():
    cfg = load_config(None, LLAMA_70B)
    assert (cfg.precision, cfg.batch_per_device, cfg.library) == ("bf16", 1, "pytorch")
    short = load_config(None, {**LLAMA_70B, "seq_len": 4096})
    assert short.batch_per_device == 2  # 8,192 tokens a device
    tiny = load_config(None, {"workload": "tiny-gpt", "topology": "p4d.24xlarge"})  # 32 tokens: at most the 4
    assert (tiny.precision, tiny.batch_per_device) == ("bf16", 4)


@pytest.mark.parametrize("topology", ["g4dn.12xlarge", "p3dn.24xlarge", "emu-2x2"])
def test_a_device_without_bf16_tensor_cores_keeps_fp32(topology):
    cfg = load_config(None, {"workload": "llama-3.1-8b", "topology": topology})
    assert cfg.precision == "fp32" and cfg.batch_per_device == 1


def test_what_a_file_or_a_flag_names_is_kept_and_other_models_keep_the_defaults(tmp_path):
    named = load_config(None, {**LLAMA_70B, "precision": "fp32", "batch_per_device": 4})
    assert (named.precision, named.batch_per_device) == ("fp32", 4)
    path = tmp_path / "llama.yaml"
    path.write_text("workload: llama-3.1-70b\ntopology: p5.48xlarge\nprecision: fp16\n")
    assert load_config(path).precision == "fp16" and load_config(path).batch_per_device == 1
    vit = load_config(None, {"workload": "vit-630m", "topology": "p5.48xlarge"})
    assert (vit.precision, vit.batch_per_device) == ("fp32", 4)


def test_the_seed_scenario_is_predicted_as_sagemakers_library_and_says_so(capsys):
    assert load_config().library == "smp"
    assert load_config(None, {"nodes": 4}).library == "smp"
    assert load_config(None, {"library": "pytorch"}).library == "pytorch"
    assert load_config(None, {"workload": "tiny-vit"}).library == "pytorch"
    assert load_config("experiments/seed/zero2d-4.yaml").library == "smp"
    assert main(["predict"]) == 0
    assert "SageMaker's library (smp)" in capsys.readouterr().out
    assert main(["predict", "--library", "pytorch"]) == 0
    assert "PyTorch FSDP2/DDP" in capsys.readouterr().out


@settings(max_examples=30, deadline=None, derandomize=True)
@given(seq=st.integers(1, 200_000), most=st.integers(1, 64))
def test_a_language_models_batch_holds_about_8k_tokens_a_device(seq, most):
    b = lm_batch_per_device(seq, most)
    assert 1 <= b <= most
    assert b == most or b == 1 or b * seq <= LM_TOKENS_PER_DEVICE < (b + 1) * seq


@pytest.mark.parametrize("topology", builtin_topologies())
def test_mfus_peak_is_the_tensor_cores_never_below_the_precisions_own(topology):
    peaks = load_instance(topology).device.peak_tflops
    for precision, own in peaks.items():
        name, peak = mfu_peak(peaks, precision)
        assert name in peaks and peak >= own
        assert (name == precision) == (precision != "fp32" or not {"bf16", "fp16"} & set(peaks))


@pytest.mark.parametrize("topology", ["p4d.24xlarge", "p5.48xlarge"])
def test_an_8b_model_shows_no_higher_mfu_in_fp32_than_in_bf16(topology):
    cfg = RunConfig(workload="llama-3.1-8b", topology=topology, nodes=1, batch_per_device=1)
    fp32, bf16 = predict(cfg), predict(cfg.replace(precision="bf16"))
    assert fp32.step_time_s > bf16.step_time_s and fp32.mfu < bf16.mfu
    assert fp32.mfu_peak_precision == bf16.mfu_peak_precision == "bf16" and fp32.peak_tflops == bf16.peak_tflops
    # the peak moved, not the compute model: MFU × peak is the model FLOP/s each predicts
    assert fp32.mfu * fp32.peak_tflops == pytest.approx(fp32.tflops_per_device, rel=1e-12)


def test_predict_names_the_peak_mfu_is_taken_against(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["predict", "--workload", "llama-3.1-8b", "--topology", "p5.48xlarge", "--nodes", "1"]) == 0
    peak = load_instance("p5.48xlarge").device.peak_tflops["bf16"]  # the topology's figure
    assert f"% of the bf16 dense peak ({peak:.1f} TFLOP/s)" in capsys.readouterr().out
    assert main(["predict", "--workload", "llama-3.1-8b", "--topology", "p5.48xlarge", "--precision", "fp32"]) == 0
    assert f"% of the bf16 tensor-core peak ({peak:.1f} TFLOP/s), which fp32 leaves idle" in capsys.readouterr().out
