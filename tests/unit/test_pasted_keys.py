"""Configurations as users paste them, read as they are: every key of a DeepSpeed block (nested
offload blocks included), of SageMaker's parameters and of a Hugging Face config.json is modelled,
noted on stderr as not modelled, or refused in one line; disagreeing keys are refused; a number
that is not finite is refused wherever it is; a file of 0 bytes is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from shardsim.config import load_config
from shardsim.config.deepspeed import OFFLOAD_KEYS
from shardsim.config.smp import LAUNCHER_NOTES, SMP_NOTES
from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import non_finite
from tests.unit.test_strict_input import cli, refused

DS = {"workload": "tiny-gpt", "topology": "p4d.24xlarge", "nodes": 1}
SMP = {"workload": "tiny-gpt", "instance_type": "ml.p4d.24xlarge", "instance_count": 1}
HF = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
}


def config(tmp_path: Path, data: dict, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if name.endswith(".yaml") else json.dumps(data))
    return path


def notes(capsys, tmp_path: Path, data: dict) -> list[str]:
    """The lines `predict` writes on stderr for the configuration `data` (it predicts)."""
    assert cli(["predict", str(config(tmp_path, data))]) == 0
    return capsys.readouterr().err.splitlines()


# --- DeepSpeed's offload blocks -----------------------------------------------------------------


@pytest.mark.parametrize(("block", "meant"), [("offload_optimizer", "device"), ("offload_param", "buffer_size")])
def test_a_misspelt_key_in_an_offload_block_is_refused_with_the_key_meant(tmp_path, capsys, block, meant):
    wrong = {"device": "devise", "buffer_size": "bufer_size"}[meant]
    path = config(tmp_path, {**DS, "zero_optimization": {"stage": 3, block: {wrong: "cpu"}}})
    err = refused(["predict", str(path)], capsys)
    assert f"field 'zero_optimization.{block}.{wrong}': unknown key; did you mean '{meant}'?" in err, err


def test_an_offload_device_deepspeed_does_not_know_is_refused(tmp_path, capsys):
    path = config(tmp_path, {**DS, "zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}})
    err = refused(["predict", str(path)], capsys)
    assert "field 'zero_optimization.offload_param.device': expected one of none, cpu, nvme, got 'gpu'" in err


@pytest.mark.parametrize("block", sorted(OFFLOAD_KEYS))
def test_offload_on_is_refused_and_its_keys_under_device_none_are_noted(tmp_path, capsys, block):
    on = {**DS, "zero_optimization": {"stage": 3, block: {"device": "cpu", "pin_memory": True}}}
    err = refused(["predict", str(config(tmp_path, on))], capsys)
    assert f"field 'zero_optimization.{block}': " in err and "offload" in err, err
    off = {**DS, "zero_optimization": {"stage": 3, block: {"device": "none", "pin_memory": True}}}
    said = notes(capsys, tmp_path, off)
    assert said == [
        f"shardsim: {tmp_path / 'c.yaml'}: zero_optimization.{block}.pin_memory accepted, not modelled: "
        "applies to offload, which is off (device none)"
    ]


# --- SageMaker's keys ---------------------------------------------------------------------------


@pytest.mark.parametrize("nested", [False, True])
def test_bf16_and_fp16_both_true_are_refused(tmp_path, capsys, nested):
    keys = {"bf16": True, "fp16": True}
    if nested:
        keys = {"distribution": {"smdistributed": {"modelparallel": {"parameters": keys}}}}
    err = refused(["predict", str(config(tmp_path, {**SMP, **keys}))], capsys)
    assert "field 'fp16': bf16 and fp16 are both true; set one of them" in err, err


@pytest.mark.parametrize(("keys", "precision"), [({"bf16": True, "fp16": False}, "bf16"), ({"fp16": True}, "fp16")])
def test_one_half_precision_is_the_precision(tmp_path, keys, precision):
    assert load_config(config(tmp_path, {**SMP, **keys})).precision == precision


def test_a_deepspeed_precision_block_is_read_by_its_enabled_not_as_true(tmp_path, capsys):
    assert load_config(config(tmp_path, {**SMP, "fp16": {"enabled": True}})).precision == "fp16"
    off = load_config(config(tmp_path, {**SMP, "fp16": {"enabled": False}, "bf16": {"enabled": True}}))
    assert off.precision == "bf16"
    err = refused(["predict", str(config(tmp_path, {**SMP, "fp16": {"enabled": "yes"}}))], capsys)
    assert "field 'fp16.enabled': expected true, false or auto, got 'yes'" in err, err


def test_every_accepted_sagemaker_key_not_modelled_is_noted_once(tmp_path, capsys):
    params = dict.fromkeys(SMP_NOTES, 1)
    launcher = dict.fromkeys(LAUNCHER_NOTES, 1)
    data = {**SMP, "distribution": {"smdistributed": {"modelparallel": {"parameters": params}}, "mpi": launcher}}
    where = f"shardsim: {tmp_path / 'c.yaml'}"
    said = notes(capsys, tmp_path, data)
    expected = [f"{where}: distribution.mpi.{k} accepted, not modelled: {why}" for k, why in LAUNCHER_NOTES.items()]
    expected += [f"{where}: {k} accepted, not modelled: {why}" for k, why in SMP_NOTES.items()]
    assert sorted(said) == sorted(expected)


# --- numbers that are not finite, anywhere ------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (
            {**DS, "zero_optimization": {"stage": 3, "reduce_bucket_size": float("nan")}},
            "zero_optimization.reduce_bucket_size",
        ),
        ({**DS, "zero_optimization": {"stage": 3, "overlap_comm": float("inf")}}, "zero_optimization.overlap_comm"),
        (
            {**DS, "zero_optimization": {"stage": 3, "offload_param": {"device": "none", "max_in_cpu": float("-inf")}}},
            "zero_optimization.offload_param.max_in_cpu",
        ),
        ({**SMP, "activation_loading_horizon": float("nan")}, "activation_loading_horizon"),
        (
            {**SMP, "distribution": {"mpi": {"custom_mpi_options": [1, float("inf")]}}},
            "distribution.mpi.custom_mpi_options[1]",
        ),
        ({**DS, "description": float("nan")}, "description"),
    ],
    ids=["ds-bucket", "ds-overlap", "ds-offload", "smp-horizon", "mpi-options", "description"],
)
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_number_that_is_not_finite_is_refused_in_a_key_read_or_not(tmp_path, capsys, data, field, suffix):
    path = config(tmp_path, data, f"c{suffix}")  # YAML's .nan and .inf; JSON's NaN and Infinity
    err = refused(["predict", str(path)], capsys)
    assert f"{path}: field '{field}': expected a finite number, got " in err, err


def test_a_hugging_face_key_that_is_not_modelled_is_still_a_finite_number(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF, "rms_norm_eps": float("nan")}))
    err = refused(["predict", "--workload", str(path), "--topology", "p4d.24xlarge", "--nodes", "1"], capsys)
    assert f"{path}: field 'rms_norm_eps': expected a finite number, got nan" in err, err


def test_non_finite_names_where_the_number_sits():
    assert non_finite({"a": [1.0, {"b": float("inf")}]}) == ("a[1].b", float("inf"))
    assert non_finite({"figure": {"value": float("nan"), "source": "x"}})[0] == "figure"
    assert non_finite({"a": [1, 2.5, "nan"], "b": {"c": True}}) is None


# --- empty files --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["c.yaml", "c.json"])
def test_a_configuration_of_0_bytes_is_refused(tmp_path, capsys, name):
    path = tmp_path / name
    path.write_bytes(b"")
    assert f"{path}: empty file (0 bytes)" in refused(["predict", str(path)], capsys)
    with pytest.raises(ConfigError, match="empty file"):
        load_config(path)


def test_a_hugging_face_config_of_0_bytes_is_refused(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_bytes(b"")
    err = refused(["predict", "--workload", str(path), "--topology", "p4d.24xlarge", "--nodes", "1"], capsys)
    assert f"{path}: empty file (0 bytes)" in err, err


# --- a model's name -----------------------------------------------------------------------------


def test_control_characters_of_a_models_name_are_escaped(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF, "_name_or_path": "evil\x1b[2J\x07\nname"}))
    assert cli(["predict", "--workload", str(path), "--topology", "p4d.24xlarge", "--nodes", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("evil\\x1b[2J\\x07\\nname seq_len=128 on 1 x p4d.24xlarge"), out[:100]
    assert "\x1b" not in out and "\x07" not in out


def test_the_keys_a_config_json_family_does_not_read_are_named_once(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF, "rope_theta": 10000.0, "architectures": ["LlamaForCausalLM"]}))
    argv = ["predict", "--workload", str(path), "--topology", "p4d.24xlarge", "--nodes", "1"]
    assert cli(argv) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"shardsim: {path}: rms_norm_eps, rope_theta, architectures accepted, not modelled: "
        "the llama family is modelled from its shape keys alone"
    ]


def test_a_refused_configuration_prints_its_one_line_without_the_notes(tmp_path, capsys):
    block = {"stage": 3, "overlap_comm": True, "mics_shard_size": 3}  # noted, then refused on the cluster
    err = refused(["predict", str(config(tmp_path, {**DS, "zero_optimization": block}))], capsys)
    assert "field 'degree': degree 3 does not divide the world size 8" in err, err


def test_a_key_given_flat_and_in_the_distribution_block_must_agree(tmp_path, capsys):
    inner = {"distribution": {"smdistributed": {"modelparallel": {"parameters": {"sharded_data_parallel_degree": 4}}}}}
    assert load_config(config(tmp_path, {**SMP, **inner, "sharded_data_parallel_degree": 4})).strategy.degree == 4
    err = refused(["predict", str(config(tmp_path, {**SMP, **inner, "sharded_data_parallel_degree": 8}))], capsys)
    assert "field 'sharded_data_parallel_degree': disagrees with 4 in distribution.smdistributed" in err, err


def test_fsdp_mixed_precision_keys_are_read_noted_or_refused(tmp_path, capsys):
    mp = {"param_dtype": "bf16", "buffer_dtype": "fp32", "cast_forward_inputs": True}
    said = notes(capsys, tmp_path, {**DS, "mixed_precision": mp})
    assert [line.split(" accepted")[0].rsplit(": ", 1)[-1] for line in said] == [
        "mixed_precision.buffer_dtype",
        "mixed_precision.cast_forward_inputs",
    ]
    err = refused(["predict", str(config(tmp_path, {**DS, "mixed_precision": mp, "param_dtype": "fp16"}))], capsys)
    assert "field 'param_dtype': disagrees with 'bf16' in mixed_precision; give it once" in err, err
    err = refused(["predict", str(config(tmp_path, {**DS, "mixed_precision": {"bufer_dtype": "fp32"}}))], capsys)
    assert "field 'mixed_precision.bufer_dtype': unknown key; did you mean 'buffer_dtype'?" in err, err
