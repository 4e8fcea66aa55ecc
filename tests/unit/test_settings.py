"""The training settings beyond the strategy: ZeRO-2, activation checkpointing modes, the
reduce dtype and Adam's implementation, read from files and flags and costed in time and memory."""

from __future__ import annotations

import argparse

import pytest

from shardsim.cli import main
from shardsim.config import RunConfig, Strategy, add_config_arguments, config_from_args, load_config, resolve
from shardsim.core.errors import ConfigError
from shardsim.simulator.predict import predict
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import from_arch

GPT_35B = Arch("gpt", hidden=7168, layers=56, heads=56, seq_len=2048, vocab=50257)  # 34.9 B parameters


def write(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def flags(*args: str) -> RunConfig:
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    return config_from_args(p.parse_args(list(args)))


def test_to_dict_lists_every_setting_and_spells_checkpointing():
    cfg = RunConfig()
    assert (cfg.checkpointing, cfg.selective_ac_option, cfg.reduce_dtype, cfg.optimizer_impl) == (
        "full", "op", None, "foreach")  # fmt: skip
    d = cfg.to_dict()
    assert d["checkpointing"] == "full" and d["reduce_dtype"] is None and d["optimizer_impl"] == "foreach"
    tp = {"tp": 1, "sequence_parallel": False, "async_tp": False, "mesh_order": "pp,dp,tp", "tp_across_nodes": False}
    assert d["strategy"] == {"kind": "zero", "degree": None, "reshard_after_forward": True, **tp}
    assert list(d["strategy"])[0] == "kind"
    assert RunConfig(checkpointing=False).to_dict()["checkpointing"] == "none"
    d = RunConfig(checkpointing="selective", reduce_dtype="fp32").to_dict()
    assert d["checkpointing"] == "selective" and d["reduce_dtype"] == "fp32"


def test_checkpointing_spellings(tmp_path):
    assert load_config(write(tmp_path, "checkpointing: false\n")).checkpointing == "none"
    assert load_config(write(tmp_path, "checkpointing: true\n")).checkpointing == "full"
    cfg = load_config(write(tmp_path, "checkpointing: selective\nselective_ac_option: 2\n"))
    assert (cfg.checkpointing, cfg.selective_ac_option) == ("selective", "2")
    assert flags("--checkpointing").checkpointing == "full"
    assert flags("--no-checkpointing").checkpointing == "none"
    assert flags("--checkpointing", "selective", "--selective-ac-option", "3").selective_ac_option == "3"
    assert RunConfig(checkpointing=False).checkpointing == "none"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("checkpointing: some\n", "checkpointing"),
        ("checkpointing: selective\nselective_ac_option: 0\n", "selective_ac_option"),
        ("checkpointing: selective\nselective_ac_option: layer\n", "selective_ac_option"),
        ("reduce_dtype: fp64\n", "reduce_dtype"),
        ("optimizer_impl: sgd\n", "optimizer_impl"),
        ("strategy: ddp\nreshard_after_forward: false\n", "reshard_after_forward"),
        ("sharding_strategy: FULL\n", "sharding_strategy"),
        ("precision: fp32\nparam_dtype: bfloat16\n", "param_dtype"),
        ("mixed_precision: {bufer_dtype: fp32}\n", "mixed_precision.bufer_dtype"),
    ],
)
def test_bad_settings_name_the_field_and_file(tmp_path, text, field):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.field == field and str(path) in str(e.value)


def test_fsdp_keys_as_users_paste_them(tmp_path):
    cfg = load_config(write(tmp_path, "sharding_strategy: SHARD_GRAD_OP\n"))
    assert cfg.strategy.kind == "zero" and not cfg.strategy.reshard_after_forward
    assert cfg.strategy.label() == "zero (ZeRO-2)"
    cfg = load_config(write(tmp_path, "sharding_strategy: _HYBRID_SHARD_ZERO2\ndegree: 4\n"))
    assert cfg.strategy.label() == "zero2d d=4 (ZeRO-2)"
    cfg = load_config(write(tmp_path, "sharded_data_parallel_degree: 8\nsharding_strategy: FULL_SHARD\n"))
    assert (cfg.strategy.kind, cfg.strategy.degree, cfg.strategy.reshard_after_forward) == ("zero2d", 8, True)
    text = "mixed_precision: {param_dtype: torch.bfloat16, reduce_dtype: torch.float32}\n"
    cfg = load_config(write(tmp_path, text))
    assert (cfg.precision, cfg.reduce_dtype, cfg.grad_dtype) == ("bf16", "fp32", "fp32")


def test_ddp_reduces_fp32_unless_a_hook_dtype_is_named():
    assert RunConfig(strategy=Strategy("ddp"), precision="bf16").ddp_reduce_dtype == "fp32"
    cfg = RunConfig(strategy=Strategy("ddp"), precision="bf16", reduce_dtype="bf16")
    cfg, _ = resolve(cfg, 8, 4)  # nccl: PyTorch's bf16_compress_hook
    assert cfg.ddp_reduce_dtype == "bf16"


def test_ddp_refuses_bf16_reduction_on_gloo():
    cfg = RunConfig(strategy=Strategy("ddp"), backend="gloo", reduce_dtype="bf16")
    with pytest.raises(ConfigError) as e:
        resolve(cfg, 8, 4)
    assert e.value.field == "reduce_dtype" and "nccl" in e.value.message
    resolve(cfg.replace(reduce_dtype="fp16"), 8, 4)  # fp16_compress_hook runs on gloo
    resolve(cfg.replace(strategy=Strategy("zero")), 8, 4)  # FSDP2 reduces bf16 on gloo


def test_activation_memory_selective_between_none_and_full():
    acts = {}
    for mode, opt in [("none", "op"), ("full", "op"), ("selective", "op"), ("selective", "2")]:
        p = predict(RunConfig(topology="p4d.24xlarge", nodes=1, precision="bf16", checkpointing=mode,
                              selective_ac_option=opt, workload="gpt2-xl"))  # fmt: skip
        acts[mode, opt] = (p.memory["activations_gib"], p.breakdown["compute_s"])
    none, full = acts["none", "op"], acts["full", "op"]
    for sel in (acts["selective", "op"], acts["selective", "2"]):
        assert full[0] < sel[0] < none[0]  # memory
        assert none[1] < sel[1] < full[1]  # compute: recompute of some of the forward
    assert acts["selective", "op"][1] - none[1] < (full[1] - none[1]) / 2  # only the memory-bound part


def test_zero2_keeps_gathered_layers_and_gathers_once():
    base = RunConfig(topology="p4d.24xlarge", nodes=2, precision="bf16", workload="gpt-10b")
    z3 = predict(base)
    z2 = predict(base.replace(strategy=Strategy("zero", reshard_after_forward=False)))
    assert z2.label == "zero (ZeRO-2)"
    assert z2.collectives["all_gather"] == z3.collectives["all_gather"] - 32  # no all-gather in backward
    assert z2.memory["gathered_gib"] > 5 * z3.memory["gathered_gib"]


def test_reduce_dtype_fp32_doubles_reduce_scatter_bytes_not_gathers():
    base = dict(topology="p4d.24xlarge", nodes=2, precision="bf16", workload="gpt-10b")
    lo, hi = predict(RunConfig(**base)), predict(RunConfig(**base, reduce_dtype="fp32"))
    assert hi.memory["gathered_gib"] > lo.memory["gathered_gib"]
    assert hi.breakdown["comm_total_s"] > lo.breakdown["comm_total_s"]


def test_a_35b_model_on_8_x_80gb_is_decided_by_adam_implementation():
    """foreach's step temporary (fp32, the size of the local parameters, beside the model states
    at the optimizer step) does not fit; fused and per-parameter Adam do; per-parameter pays its
    launches in time."""
    w = from_arch("gpt-35b", GPT_35B)
    assert 34e9 < w.params < 36e9
    got = {}
    for impl in ("foreach", "fused", "per-parameter"):
        cfg = RunConfig(workload="gpt-35b", topology="p5.48xlarge", nodes=1, precision="bf16", batch_per_device=1,
                        optimizer_impl=impl)  # fmt: skip
        got[impl] = predict(cfg, workload=w)
    assert not got["foreach"].fits and got["fused"].fits and got["per-parameter"].fits
    assert got["per-parameter"].breakdown["optimizer_s"] > got["fused"].breakdown["optimizer_s"]


def run_main(argv: list[str]) -> int:
    """The `shardsim` command in process, argparse's usage errors (SystemExit) as their status."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


@pytest.mark.parametrize("command", ["predict", "sweep"])
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--reduce-dtype", "fp8"], "--reduce-dtype"),
        (["--optimizer-impl", "lazy"], "--optimizer-impl"),
        (["--checkpointing", "partial"], "--checkpointing"),
        (["--checkpointing", "selective", "--selective-ac-option", "0"], "selective_ac_option"),
        (["--checkpointing", "selective", "--selective-ac-option", "every"], "selective_ac_option"),
    ],
)
def test_cli_bad_setting_flag_is_one_line_exit_2(command, args, needle, capsys):
    assert run_main([command, "--workload", "tiny-gpt", "--nodes", "1", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_cli_zero2_flag_for_a_pipeline_is_one_line_exit_2(capsys):
    argv = ["predict", "--workload", "tiny-gpt", "--strategy", "pipeline", "--pp", "2", "--no-reshard-after-forward"]
    assert run_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reshard_after_forward" in err, err
    argv = ["predict", "--workload", "tiny-gpt", "--strategy", "ddp", "--reduce-dtype", "bf16", "--backend", "gloo"]
    assert run_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reduce_dtype" in err, err


@pytest.mark.parametrize("command", ["predict", "sweep", "run"])
@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("reduce_dtype: fp8\n", "reduce_dtype"),
        ("optimizer_impl: lazy\n", "optimizer_impl"),
        ("checkpointing: partial\n", "checkpointing"),
        ("checkpointing: selective\nselective_ac_option: -1\n", "selective_ac_option"),
        ("reshard_after_forward: maybe\n", "reshard_after_forward"),
        ("strategy: {kind: ddp, reshard_after_forward: false}\n", "reshard_after_forward"),
        (
            "mixed_precision: {param_dtype: torch.bfloat16, reduce_dtype: torch.float8}\n",
            "mixed_precision.reduce_dtype",
        ),
    ],
)
def test_cli_bad_setting_in_a_file_is_one_line_naming_field_and_file(tmp_path, command, text, field, capsys):
    path = write(tmp_path, "workload: tiny-gpt\ntopology: emu-2x2\n" + text)
    assert run_main([command, str(path)]) == 2  # `run` fails on reading the file, before any rank starts
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"'{field}" in err and str(path) in err, err


def test_hybrid_shard_without_a_degree_shards_within_each_node(tmp_path):
    """PyTorch's HYBRID_SHARD shards within a node by default: the degree is the node's
    data-parallel ranks (its GPUs, over tp), settled once the cluster is known."""
    from shardsim.config import resolve

    cfg = load_config(write(tmp_path, "sharding_strategy: HYBRID_SHARD\ntopology: p4d.24xlarge\nnodes: 4\n"))
    assert (cfg.strategy.kind, cfg.strategy.degree, cfg.strategy.label()) == ("zero2d", None, "zero2d d=node")
    assert resolve(cfg, 32, 8, devices_per_node=8)[0].strategy.degree == 8
    from shardsim.simulator.workload.resolve import load_workload

    tp2 = cfg.replace(strategy=cfg.strategy.replace(tp=2))
    assert resolve(tp2, 32, 8, devices_per_node=8, arch=load_workload(cfg.workload).arch)[1].shard == 4
    assert resolve(cfg, 8, 8, devices_per_node=8)[0].strategy.kind == "zero"  # one node: FULL_SHARD
    with pytest.raises(ConfigError, match="shards within a node") as err:
        resolve(cfg, 32, 8)  # no node size known
    assert err.value.field == "degree"
