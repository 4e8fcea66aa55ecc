"""The configuration tree: built in Python it validates as a file and a flag do (the same field
named for the same bad value), the strategy union refuses another kind's field, every setting has
a flag or is a file key only, the sweep's list flags come from the same fields, and a
configuration survives JSON unchanged."""

from __future__ import annotations

import argparse
import json

import pytest
from pydantic import ValidationError

from shardsim.cli.app import build_parser as cli_parser
from shardsim.config import (
    SETTINGS,
    DdpConfig,
    PipelineConfig,
    RunConfig,
    Strategy,
    Zero2DConfig,
    ZeroConfig,
    add_config_arguments,
    config_from_args,
    load_config,
)
from shardsim.config.deepspeed_settings import DeepSpeedSettings
from shardsim.config.flags import AXES
from shardsim.config.load import load_config_json
from shardsim.config.strategy import CP_FIELDS, EP_FIELDS, MODELS, STRATEGY_FIELDS, TP_FIELDS
from shardsim.core.errors import ConfigError
from shardsim.specs.bounds import SETTING_BOUNDS
from shardsim.specs.model.arch import Arch, Shape
from shardsim.specs.strategies import STRATEGIES


def from_flags(*args: str) -> RunConfig:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_config_arguments(p)
    return config_from_args(p.parse_args(list(args)))


def error_field(make) -> str | None:
    with pytest.raises(ConfigError) as err:
        make()
    assert "\n" not in str(err.value)
    return err.value.field


# (setting, a bad value, the flat settings it needs beside it): a file key, a flag's value
# after parsing (argparse's own checks are bypassed with the overrides), and Python
BAD = [
    ("batch_per_device", 0, {}),
    ("grad_accum", SETTING_BOUNDS["grad_accum"].maximum + 1, {}),
    ("nodes", 0, {}),
    ("seed", -1, {}),
    ("precision", "fp8", {}),
    ("checkpointing", "partial", {}),
    ("selective_ac_option", "layer", {"checkpointing": "selective"}),
    ("optimizer_impl", "magic", {}),
    ("backend", "mpi", {}),
    ("reduce_dtype", "fp64", {}),
    ("degree", 0, {"strategy": "zero2d"}),
    ("degree", 4, {"strategy": "ddp"}),
    ("pp", 2, {"strategy": "zero"}),
    ("microbatches", 0, {"strategy": "pipeline"}),
    ("schedule", "zb", {"strategy": "pipeline"}),
    ("reshard_after_forward", False, {"strategy": "ddp"}),
    ("hidden", 0, {}),
    ("layers", SETTING_BOUNDS["layers"].maximum + 1, {}),
]


def python_config(flat: dict) -> RunConfig:
    """The same flat settings built as Python does: the strategy by `Strategy`, the rest as fields."""
    strategy = {k: flat.pop(k) for k in [*STRATEGY_FIELDS] if k in flat}
    shape = {k: flat.pop(k) for k in ("hidden", "layers") if k in flat}
    kind = flat.pop("strategy", "zero")
    return RunConfig(strategy=Strategy(kind, **strategy), shape=Shape(**shape), **flat)


@pytest.mark.parametrize(("name", "value", "beside"), BAD, ids=[f"{n}={v}" for n, v, _ in BAD])
def test_a_bad_value_names_the_same_field_from_a_file_a_flag_and_python(tmp_path, name, value, beside):
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({**beside, name: value}))  # JSON is YAML
    from_file = error_field(lambda: load_config(path))
    from_flag = error_field(lambda: load_config(None, {**beside, name: value}))
    from_python = error_field(lambda: python_config({**beside, name: value}))
    assert from_file == from_flag == from_python == name


def test_python_refuses_as_the_issue_lists():
    with pytest.raises(ConfigError, match="unknown strategy 'zero3'"):
        Strategy("zero3")
    with pytest.raises(ConfigError, match="unknown strategy 'zero3'"):
        RunConfig(strategy="zero3")
    assert error_field(lambda: RunConfig(batch_per_device=0)) == "batch_per_device"
    assert error_field(lambda: RunConfig(checkpointing="partial")) == "checkpointing"
    with pytest.raises(ConfigError, match="did you mean 'batch_per_device'") as err:
        RunConfig(batch_per_devise=4)  # an unknown name, as a file's is told
    assert err.value.field == "batch_per_devise"
    with pytest.raises(ConfigError, match="expected a kind's name") as err:
        RunConfig(strategy=3)
    assert Strategy("zero2d").degree is None  # within each node, once the cluster is known (`resolve`)


def test_the_union_carries_each_kinds_own_fields_only():
    assert isinstance(Strategy("ddp"), DdpConfig) and isinstance(Strategy("zero"), ZeroConfig)
    assert isinstance(Strategy("zero2d", degree=4), Zero2DConfig)
    assert isinstance(Strategy("pipeline", pp=2, microbatches=4), PipelineConfig)
    assert set(MODELS) == set(STRATEGIES)
    own = {k: set(m.model_fields) - {"kind", *TP_FIELDS, *CP_FIELDS, *EP_FIELDS} for k, m in MODELS.items()}
    # tensor parallelism composes with every kind; context and expert parallelism's fields are every
    # kind's too (`config.cp`, `config.ep` refuse them on the kinds they do not compose with)
    assert all(set(TP_FIELDS) | set(CP_FIELDS) | set(EP_FIELDS) <= set(m.model_fields) for m in MODELS.values())
    assert own == {
        "ddp": set(),
        "zero": {"degree", "reshard_after_forward"},
        "zero2d": {"degree", "reshard_after_forward"},
        "pipeline": {"pp", "microbatches", "schedule", "degree", "stages_per_rank", "layers_per_stage"},
        "zero1": set(),
    }
    for kind, fields in own.items():
        for other in set(STRATEGY_FIELDS) - fields - set(TP_FIELDS) - set(CP_FIELDS) - set(EP_FIELDS):
            value = {"degree": 1, "pp": 1, "microbatches": 1, "schedule": "1f1b", "reshard_after_forward": True}
            value |= {"stages_per_rank": 1, "layers_per_stage": "auto"}
            needed = {"degree": 4} if kind == "zero2d" else {}
            with pytest.raises(ConfigError) as err:
                Strategy(kind, **needed, **{other: value[other]})
            assert err.value.field == other, (kind, other)
    with pytest.raises(ValidationError, match="frozen"):
        RunConfig(strategy=Strategy("zero")).strategy.degree = 2


def test_the_file_form_drops_what_another_kind_leaves_at_its_neutral_value(tmp_path):
    cfg = load_config(None, {"strategy": "ddp", "degree": 1, "pp": 1, "microbatches": 1})
    assert cfg.strategy == Strategy("ddp")
    path = tmp_path / "c.yaml"
    path.write_text("strategy: zero\nschedule: gpipe\n")
    with pytest.raises(ConfigError, match="applies to a pipeline") as err:
        load_config(path)
    assert err.value.field == "schedule" and err.value.where == str(path)


def test_every_setting_has_a_flag_or_is_a_file_key_and_the_sweep_lists_come_from_it():
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    options = {a.dest for a in p._actions}
    file_only = {s.name for s in SETTINGS if not s.flag}
    assert file_only == {"deepspeed"}  # a mapping: a file's key (a DeepSpeed block fills it)
    assert {s.name for s in SETTINGS} - file_only <= options
    fields = set(RunConfig.model_fields) - {"strategy", "shape", "source"}
    flat = {s.name for s in SETTINGS}
    assert fields | set(STRATEGY_FIELDS) | {"strategy"} <= flat  # every field is a setting
    # the sweep's list flags: the strategy's kind and fields and the settings it spans, each
    # generated from its field (its bound for an integer: checked as the list is parsed)
    # a setting of the base, not a dimension
    no_axis = {
        "async_tp",
        "mesh_order",
        "tp_across_nodes",
        "cp_rotate",
        "layers_per_stage",
    }
    spanned = {
        "strategy",
        *(set(STRATEGY_FIELDS) - no_axis),
        "checkpointing",
        "selective_ac_option",
        "reduce_dtype",
        "optimizer_impl",
        *("precision", "optimizer", "attention", "compile", "mlm_fraction", "float8"),  # the training stack
        "moe_imbalance",  # a mixture of experts' what-if
    }
    assert {s.name for s in AXES} == spanned
    sweep = next(a for a in cli_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["sweep"]
    by_option = {o: a for a in sweep._actions for o in a.option_strings}
    for s in AXES:
        flag = "--" + s.axis.replace("_", "-")
        assert by_option[flag].dest == s.name and by_option[s.option].dest == s.name
    degrees = by_option["--degrees"]
    assert degrees.type("2,4") == (2, 4)
    with pytest.raises((argparse.ArgumentTypeError, ValueError)):
        degrees.type(str(SETTING_BOUNDS["degree"].maximum + 1))


@pytest.mark.parametrize(
    "cfg",
    [
        RunConfig(),
        RunConfig(strategy=Strategy("pipeline", pp=2, microbatches=4, schedule="gpipe", degree=2), grad_accum=3),
        RunConfig(
            strategy=Strategy("zero2d", degree=4, reshard_after_forward=False),
            checkpointing="selective",
            selective_ac_option="2",
            reduce_dtype="fp32",
            shape=Shape(seq_len=512, layers=4),
        ),  # fmt: skip
        RunConfig(workload=Arch("gpt", hidden=64, layers=2, heads=2, seq_len=32, vocab=128), strategy=Strategy("ddp")),
        RunConfig(workload="mixtral-8x7b", moe_imbalance=1.5, moe_capacity=1.25),
        RunConfig(library="deepspeed", deepspeed=DeepSpeedSettings(reduce_bucket_size=10**8, overlap_comm=True)),
    ],
    ids=["defaults", "pipeline", "zero2d", "inline-model", "moe", "deepspeed"],
)
def test_json_round_trip(tmp_path, cfg):
    d = cfg.to_dict()
    assert RunConfig.from_dict(json.loads(json.dumps(d))) == cfg
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json())
    again = load_config_json(path)
    assert again.to_dict() == d and again.strategy == cfg.strategy
    assert d["checkpointing"] in ("none", "full", "selective")
    # given only where set (a whole node's configuration, a run without Float8 or experts, reads as before them)
    unset = {"gpus_per_node", "float8", "float8_all_gather", "moe_imbalance", "moe_capacity", "deepspeed"}
    assert {s.name for s in SETTINGS} - set(STRATEGY_FIELDS) - {"strategy", *Shape.__dataclass_fields__} - unset <= set(
        d
    )


def test_an_older_record_still_reads():
    old = {"workload": "tiny-gpt", "topology": "emu-2x2", "nodes": 2, "batch_per_device": 4, "grad_accum": 1,
           "precision": "fp32", "checkpointing": True, "backend": "gloo", "optimizer": "adam", "profile": None,
           "seed": 0,
           "strategy": {"kind": "ddp", "degree": None, "pp": 1, "microbatches": 1, "schedule": "1f1b"}}  # fmt: skip
    cfg = RunConfig.from_dict(old)
    assert cfg.checkpointing == "full" and cfg.strategy == Strategy("ddp") and cfg.optimizer_impl == "foreach"
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({**old, "strategy": {"kind": "ddp", "degree": 4}}, where="r.json")
    assert err.value.field == "degree" and err.value.where == "r.json"


def test_from_flags_equals_from_python():
    assert from_flags("--strategy", "zero2d", "--degree", "4", "--precision", "bf16").replace(
        source="defaults"
    ) == RunConfig(strategy=Strategy("zero2d", degree=4), precision="bf16", library="smp")  # the seed's library


@pytest.mark.parametrize("axis", AXES, ids=[s.axis for s in AXES])
def test_a_sweeps_lists_are_checked_as_their_settings_are(axis):
    from shardsim.sweep.space import SweepSpace

    bad = 0 if axis.kind is int else "no" if axis.kind is bool else "bogus"
    with pytest.raises(ConfigError) as err:
        SweepSpace(**{axis.axis: (bad,)})
    assert err.value.field == axis.axis
    with pytest.raises(ConfigError):
        load_config(None, {axis.name: bad, **({"strategy": "pipeline"} if axis.name in ("pp", "schedule") else {})})
    if axis.maximum is not None:
        with pytest.raises(ConfigError, match="beyond the simulator's bound"):
            SweepSpace(**{axis.axis: (axis.maximum + 1,)})


def test_python_takes_sagemaker_fsdp_keys_and_the_flat_form_as_a_file_does(tmp_path):
    keys = {"sharded_data_parallel_degree": 4, "instance_type": "ml.p4d.24xlarge", "instance_count": 2,
            "mixed_precision": {"param_dtype": "torch.bfloat16", "reduce_dtype": "float32"}}  # fmt: skip
    path = tmp_path / "smp.yaml"
    path.write_text(json.dumps(keys))
    from_file = load_config(path)
    assert RunConfig(**keys) == from_file.replace(source="defaults")
    assert from_file.strategy == Strategy("zero2d", degree=4) and (from_file.topology, from_file.nodes) == (
        "p4d.24xlarge", 2)  # fmt: skip
    assert (from_file.precision, from_file.reduce_dtype) == ("bf16", "fp32")
    flat = RunConfig(strategy="pipeline", pp=2, microbatches=4, hidden=64)
    assert flat.strategy == Strategy("pipeline", pp=2, microbatches=4) and flat.shape == Shape(hidden=64)
    for bad, field in (({"sharded_data_parallel_degree": 4, "degree": 8}, "sharded_data_parallel_degree"),
                       ({"sharding_strategy": "NO_SUCH"}, "sharding_strategy"),
                       ({"strategy": Strategy("zero"), "degree": 4}, "degree")):  # fmt: skip
        assert error_field(lambda bad=bad: RunConfig(**bad)) == field


@pytest.mark.parametrize("topology", ["p5.48xlarge", "emu-4x2", "g4dn.12xlarge"])
def test_a_topology_without_a_node_count_means_the_same_from_python_and_from_flags(topology):
    """The seed's 8 nodes only on the default topology left implicit; a topology named decides."""
    from shardsim.config import load_config

    assert RunConfig(topology=topology).nodes == load_config(None, {"topology": topology}).nodes is None
    assert RunConfig().nodes == load_config().nodes == 8
