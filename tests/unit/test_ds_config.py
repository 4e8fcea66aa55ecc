"""A whole DeepSpeed config (``ds_config.json``) as a configuration file: its batch keys,
precision blocks, optimizer block and zero_optimization read; every other key it may hold noted
once on stderr or refused in one line; DeepSpeed's batch check once the world is known."""

from __future__ import annotations

import json

import pytest

from shardsim.config import load_config
from shardsim.config.deepspeed_settings import DeepSpeedSettings
from shardsim.config.ds_config import NOTES, REFUSED
from tests.unit.test_pasted_keys import config, notes
from tests.unit.test_strict_input import cli, refused

CLUSTER = {"workload": "tiny-gpt", "topology": "p4d.24xlarge", "nodes": 1}  # 8 data-parallel ranks
DS_CONFIG = {
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "steps_per_print": 100,
    "wall_clock_breakdown": False,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100}},
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 2e8, "allgather_bucket_size": 2e8},
}


def test_a_whole_ds_config_is_read(tmp_path):
    cfg = load_config(config(tmp_path, {**CLUSTER, **DS_CONFIG}, "ds_config.json"))
    assert (cfg.library, cfg.strategy.label(), cfg.precision) == ("deepspeed", "zero (ZeRO-2)", "bf16")
    assert (cfg.batch_per_device, cfg.grad_accum, cfg.optimizer, cfg.optimizer_impl) == (2, 4, "adamw", "fused")
    settings = dict(train_batch_size=64, overlap_comm=True, reduce_bucket_size=200_000_000)
    assert cfg.deepspeed == DeepSpeedSettings(**settings, allgather_bucket_size=200_000_000)


def test_each_key_that_changes_nothing_is_noted_once(tmp_path, capsys):
    said = notes(capsys, tmp_path, {**CLUSTER, **DS_CONFIG})
    where = f"shardsim: {tmp_path / 'c.yaml'}"
    for key in ("steps_per_print", "wall_clock_breakdown", "gradient_clipping", "scheduler"):
        assert said.count(f"{where}: {key} accepted, not modelled: {NOTES[key]}") == 1, said
    assert sum("optimizer.params accepted, not modelled" in line for line in said) == 1, said


def test_the_batch_keys_must_agree_with_the_data_parallel_ranks(tmp_path, capsys):
    err = refused(["predict", str(config(tmp_path, {**CLUSTER, **DS_CONFIG, "train_batch_size": 32}))], capsys)
    expected = (
        "field 'train_batch_size': train_batch_size 32 is not train_micro_batch_size_per_gpu 2 x "
        "gradient_accumulation_steps 4 x 8 data-parallel ranks (64)"
    )
    assert expected in err, err
    assert cli(["predict", str(config(tmp_path, {**CLUSTER, **DS_CONFIG, "train_batch_size": 64}))]) == 0


@pytest.mark.parametrize(
    ("keys", "field", "match"),
    [
        ({"optimizer": {"type": "OneBitAdam"}}, "optimizer.type", "expected Adam, AdamW, Lamb, SGD or Adafactor"),
        ({"amp": {"enabled": True}}, "amp", "apex's AMP is not modelled"),
        ({"progressive_layer_drop": {"enabled": True}}, "progressive_layer_drop", "not modelled"),
        ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu", "expected an integer >= 1"),
        ({"communication_data_type": "int8"}, "communication_data_type", "expected fp32, fp16 or bf16"),
        ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "fp16", "both true"),
        ({"train_batch_sise": 8}, "train_batch_sise", "did you mean 'train_batch_size'"),
    ],
)
def test_refused_in_one_line_naming_the_key(tmp_path, capsys, keys, field, match):
    err = refused(["predict", str(config(tmp_path, {**CLUSTER, **DS_CONFIG, **keys}))], capsys)
    assert f"field '{field}'" in err and match in err, err


def test_a_block_that_is_off_is_accepted_and_noted(tmp_path, capsys):
    said = notes(capsys, tmp_path, {**CLUSTER, "amp": {"enabled": False}, "zero_optimization": {"stage": 1}})
    assert any(f"amp accepted, not modelled: {REFUSED['amp']}, off" in line for line in said), said


def test_auto_values_are_noted_and_left_to_the_configuration(tmp_path, capsys):
    auto = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "fp16": {"enabled": "auto"},
    }
    said = notes(capsys, tmp_path, {**CLUSTER, **auto, "zero_optimization": {"stage": 3}})
    assert sum(": auto" in line.split("not modelled")[-1] for line in said) == 3, said
    cfg = load_config(config(tmp_path, {**CLUSTER, **auto, "zero_optimization": {"stage": 3}}))
    assert cfg.grad_accum == 1 and cfg.library == "deepspeed"


def test_library_deepspeed_is_planned_over_data_parallel_ranks_only(tmp_path, capsys):
    data = {**CLUSTER, "tp": 2, "zero_optimization": {"stage": 1}}
    err = refused(["predict", str(config(tmp_path, data))], capsys)
    assert "field 'tp': library deepspeed is planned over data-parallel ranks only: set tp 1, got 2" in err, err


def test_deepspeed_settings_beside_another_library_are_refused(tmp_path, capsys):
    data = {**CLUSTER, "library": "pytorch", "deepspeed": {"reduce_bucket_size": 1000}}
    err = refused(["predict", str(config(tmp_path, data))], capsys)
    assert "field 'deepspeed': applies to library deepspeed, got library pytorch" in err, err


def test_json_and_python_read_the_same(tmp_path):
    from shardsim.config import RunConfig

    path = config(tmp_path, {**CLUSTER, **DS_CONFIG}, "ds.json")
    assert load_config(path).deepspeed == RunConfig(**json.loads(path.read_text())).deepspeed


def test_the_documented_ds_config_predicts_as_documented(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    section = (root / "docs" / "configuration.md").read_text().split("## DeepSpeed's config", 1)[1]
    command = section.split("```bash\n", 1)[1].split("```", 1)[0].split()
    assert command[:3] == ["shardsim", "predict", "docs/examples/ds_config.json"]
    shipped = root / command[2]
    assert section.split("```json\n", 1)[1].split("```", 1)[0] == shipped.read_text()
    assert cli(["predict", str(shipped), *command[3:]]) == 0
