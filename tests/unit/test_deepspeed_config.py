"""DeepSpeed's `zero_optimization` block in a configuration file (and in Python's file form):
each stage's kind, MiCS's keys, a note for each accepted key that is not modelled, and one
line refusing unknown keys, offload, ZeRO++ and contradictions."""

from __future__ import annotations

import logging

import pytest
import yaml

from shardsim.config import RunConfig, load_config
from shardsim.config.deepspeed import DEEPSPEED_NOTES, REFUSED, ZERO_KEYS
from shardsim.config.deepspeed_settings import DeepSpeedSettings
from shardsim.core.errors import ConfigError

BASE = {"workload": "gpt-10b", "topology": "p4d.24xlarge", "nodes": 4}


def load(tmp_path, block, **extra):
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump({**BASE, **extra, "zero_optimization": block}))
    return load_config(path)


@pytest.mark.parametrize(("stage", "label"), [(0, "ddp"), (1, "zero1"), (2, "zero (ZeRO-2)"), (3, "zero")])
def test_each_stage_is_a_kind(tmp_path, stage, label):
    assert load(tmp_path, {"stage": stage}).strategy.label() == label


def test_no_stage_is_deepspeeds_default_stage_0(tmp_path):
    assert load(tmp_path, {}).strategy.kind == "ddp"


def test_the_block_is_library_deepspeed(tmp_path):
    assert {load(tmp_path, {"stage": s}).library for s in (0, 1, 2, 3)} == {"deepspeed"}


def test_mics_is_zero2d_with_its_shard_size_and_the_hierarchical_gather_library_smp(tmp_path):
    cfg = load(tmp_path, {"stage": 3, "mics_shard_size": 8})
    assert (cfg.strategy.kind, cfg.strategy.degree, cfg.library) == ("zero2d", 8, "deepspeed")
    cfg = load(tmp_path, {"stage": 3, "mics_shard_size": 8, "mics_hierarchical_params_gather": True})
    assert (cfg.strategy.kind, cfg.strategy.degree, cfg.library) == ("zero2d", 8, "smp")
    assert load(tmp_path, {"stage": 3, "mics_shard_size": -1}).strategy.kind == "zero"  # DeepSpeed's "off"


@pytest.mark.parametrize(
    ("block", "field", "match"),
    [
        ({"stage": 4}, "zero_optimization.stage", "expected 0, 1, 2 or 3"),
        ({"stage": "3"}, "zero_optimization.stage", "expected an integer"),
        ({"stage": 2, "mics_shard_size": 8}, "zero_optimization.mics_shard_size", "needs stage 3"),
        (
            {"stage": 3, "mics_hierarchical_params_gather": True},
            "zero_optimization.mics_hierarchical_params_gather",
            "mics_shard_size > 0",
        ),
        ({"stage": 3, "stage3_max_live_paramters": 1}, "zero_optimization.stage3_max_live_paramters", "unknown"),
        ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, "zero_optimization.offload_optimizer", "offload"),
        ({"stage": 3, "offload_param": {"device": "nvme"}}, "zero_optimization.offload_param", "offload"),
        ({"stage": 3, "zero_hpz_partition_size": 8}, "zero_optimization.zero_hpz_partition_size", "hpZ"),
        ({"stage": 3, "zero_quantized_weights": True}, "zero_optimization.zero_quantized_weights", "qwZ"),
    ],
)
def test_refused_in_one_line_naming_the_key(tmp_path, block, field, match):
    with pytest.raises(ConfigError, match=match) as err:
        load(tmp_path, block)
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_off_values_of_the_refused_keys_are_accepted(tmp_path):
    block = {"stage": 2, "offload_optimizer": {"device": "none"}, "cpu_offload": False, "zero_hpz_partition_size": 1}
    assert load(tmp_path, block).strategy.label() == "zero (ZeRO-2)"


def test_bucket_sizes_and_switches_are_library_deepspeeds_settings(tmp_path, caplog):
    block = {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 5e8, "contiguous_gradients": False}
    with caplog.at_level(logging.WARNING, logger="shardsim"):
        cfg = load(tmp_path, block)
    assert not caplog.records
    expected = DeepSpeedSettings(overlap_comm=True, reduce_bucket_size=500_000_000, contiguous_gradients=False)
    assert cfg.deepspeed == expected


def test_accepted_keys_that_are_not_modelled_are_each_reported(tmp_path, caplog):
    block = {"stage": 2, "sub_group_size": 1e9, "reduce_bucket_size": "auto", "elastic_checkpoint": False}
    with caplog.at_level(logging.WARNING, logger="shardsim"):
        cfg = load(tmp_path, block)
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 3
    for key in ("sub_group_size", "elastic_checkpoint"):
        assert any(f"zero_optimization.{key} accepted, not modelled: {DEEPSPEED_NOTES[key]}" in n for n in notes)
    assert any("zero_optimization.reduce_bucket_size accepted, not modelled: auto" in n for n in notes)
    assert cfg.deepspeed is None  # auto: DeepSpeed's defaults


@pytest.mark.parametrize("value", [-1, 1.5, True, "big"])
def test_a_bucket_size_that_is_no_count_is_refused(tmp_path, value):
    with pytest.raises(ConfigError, match="expected an integer >= 0") as err:
        load(tmp_path, {"stage": 2, "reduce_bucket_size": value})
    assert err.value.field == "zero_optimization.reduce_bucket_size"


def test_every_key_has_one_class():
    assert len(ZERO_KEYS) == len(set(ZERO_KEYS))
    assert not set(DEEPSPEED_NOTES) & set(REFUSED)


def test_a_contradiction_with_other_keys_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="contradicts") as err:
        load(tmp_path, {"stage": 1}, sharding_strategy="FULL_SHARD")
    assert err.value.field == "sharding_strategy"


def test_python_takes_the_block_as_a_file_does():
    cfg = RunConfig(**BASE, zero_optimization={"stage": 1})
    assert cfg.strategy.kind == "zero1"


def test_the_documented_example_loads(tmp_path):
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = doc.split("## DeepSpeed's `zero_optimization` block", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "ds.yaml").write_text(example)
    cfg = load_config(tmp_path / "ds.yaml")
    assert (cfg.strategy.kind, cfg.strategy.degree, cfg.library) == ("zero2d", 8, "smp")
