"""The sweep: enumeration, ranking, recommendation, outputs, scaling, bad input (small and fast)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.cli import main
from shardsim.config import RunConfig, resolve
from shardsim.core.errors import ConfigError
from shardsim.simulator.results import flatten
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import Cluster
from shardsim.sweep.faces import default_microbatches
from shardsim.sweep.recommendation import recommend
from shardsim.sweep.rows import COLUMNS, SCALING_COLUMNS, SETTING_COLUMNS, with_pruned
from shardsim.sweep.search import sweep
from shardsim.sweep.space import SweepSpace, enumerate_configs
from tests.helpers import instance

# 2 x g4dn.12xlarge = 8 T4s; tiny-gpt has 4 layers: every kind, a few dozen configurations.
TINY = RunConfig(workload="tiny-gpt", topology="g4dn.12xlarge", nodes=2)
ROW_KEYS = (
    "strategy",
    "label",
    "step_time_s",
    "samples_per_s",
    "memory_allocated_gib",
    "memory_reserved_gib",
    "memory_required_gib",
    "fits",
)


def run_cli(argv: list[str]) -> int:
    """main(), with argparse's usage errors (SystemExit) turned into their exit status."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


@pytest.fixture(scope="module")
def tiny_df() -> pd.DataFrame:
    return sweep(TINY, workers=1).table


def test_enumeration_covers_every_kind_degree_and_only_valid_configs() -> None:
    # The default space tries every tensor-parallel degree that divides the 4 GPUs per node and that
    # tiny-gpt admits (4 heads, FFN 256: tp 1, 2, 4; sequence parallel above 1, its 32 tokens divide),
    # each with the data-parallel and pipeline strategies of the world / tp = 8, 4, 2 ranks left.
    w = load_workload("tiny-gpt")
    en = enumerate_configs(TINY, workload=w)
    strategies = [c.cfg.strategy for c in en.candidates]
    assert {(s.tp, s.sequence_parallel) for s in strategies} == {(1, False), (2, True), (4, True)}
    by_tp = {tp: [s for s in strategies if s.tp == tp] for tp in (1, 2, 4)}
    assert {s.kind for s in by_tp[1]} == {s.kind for s in by_tp[2]} == {"ddp", "zero", "zero2d", "pipeline"}
    assert {s.kind for s in by_tp[4]} == {"ddp", "zero", "pipeline"}  # no zero2d degree strictly inside 1..2
    # zero2d: the divisors of the data-parallel ranks, not 1 or all of them; zero: all of them
    assert {tp: sorted(s.degree for s in ss if s.kind == "zero2d") for tp, ss in by_tp.items()} == {
        1: [2, 4],
        2: [2],
        4: [],
    }
    assert {tp: [s.degree for s in ss if s.kind == "zero"] for tp, ss in by_tp.items()} == {1: [8], 2: [4], 4: [2]}
    pipes = {tp: [s for s in ss if s.kind == "pipeline"] for tp, ss in by_tp.items()}
    # pp: the divisors of the data-parallel ranks up to the 4 layers; sharded stages too (divisors of dp / pp)
    assert {tp: {s.pp for s in ps} for tp, ps in pipes.items()} == {1: {2, 4}, 2: {2, 4}, 4: {2}}
    assert {tp: {s.degree for s in ps if s.pp == 2} for tp, ps in pipes.items()} == {1: {1, 2, 4}, 2: {1, 2}, 4: {1}}
    for s in (s for ps in pipes.values() for s in ps):
        assert s.microbatches in default_microbatches(s.pp, TINY.batch_per_device)
    assert {s.schedule for ps in pipes.values() for s in ps} == {"gpipe", "1f1b"}
    # each is valid, and none twice
    for c in en.candidates:
        assert resolve(c.cfg, c.cluster.world, len(w.layers), arch=w.arch, devices_per_node=4)[0] == c.cfg
    assert len({(c.cfg.strategy, c.cluster.nodes) for c in en.candidates}) == len(en.candidates)


def test_restrictions_keep_only_valid_combinations() -> None:
    space = SweepSpace(  # tp 1: the restrictions of the data-parallel and pipeline axes over 8 ranks
        strategies=("zero2d", "pipeline"),
        degrees=(2, 3),
        pp=(2, 3),
        microbatches=(3, 4, 8),
        schedules=("1f1b",),
        tp_degrees=(1,),
    )
    strategies = [c.cfg.strategy for c in enumerate_configs(TINY, space).candidates]
    assert [s.degree for s in strategies if s.kind == "zero2d"] == [2]  # 3 does not divide 8
    pipes = [s for s in strategies if s.kind == "pipeline"]
    assert {(s.pp, s.degree, s.microbatches) for s in pipes} == {(2, 2, 4), (2, 2, 8)}  # per-replica batch 8
    assert {s.schedule for s in pipes} == {"1f1b"}


def test_rows_ranked_and_a_config_that_does_not_fit_is_never_recommended() -> None:
    # Take the fastest configuration on paper and give the devices a little less memory than it
    # needs: timings do not change, it stays the fastest, and is no longer recommended.
    space = SweepSpace(strategies=("ddp", "zero", "zero2d"), nodes=(2,))
    base = TINY.replace(workload="mlp-4x16k")
    roomy = sweep(base, replace(space, topologies=(instance(devices=4, memory_gib=80.0),)), workers=1).table
    fastest = roomy.loc[roomy["samples_per_s"].idxmax()]
    assert (roomy["memory_required_gib"] < fastest["memory_required_gib"]).any()  # something smaller exists
    tight = instance(devices=4, memory_gib=fastest["memory_required_gib"] - 0.01)
    df = sweep(base, replace(space, topologies=(tight,)), workers=1).table
    row = df[df["label"] == fastest["label"]].iloc[0]
    assert not row["fits"] and "GiB" in row["fit_reason"]
    assert row["memory_required_gib"] == fastest["memory_required_gib"]  # its memory, known before simulating
    assert math.isnan(row["samples_per_s"]) and math.isnan(row["step_time_s"])  # pruned: not simulated
    rec = recommend(df)
    assert rec["best"]["label"] != fastest["label"] and rec["best"]["fits"]
    assert rec["sdp"]["label"] != fastest["label"] and (rec["margin"] is None or rec["margin"] >= 0)
    assert df["rank"].tolist() == list(range(1, len(df) + 1))
    assert df["fits"].tolist() == sorted(df["fits"].tolist(), reverse=True)  # fitting rows first
    assert row["rank"] > df["fits"].sum()


def test_nothing_fits_gives_no_recommendation() -> None:
    tiny_mem = instance(devices=4, memory_gib=0.5, name="tiny-mem")
    space = SweepSpace(strategies=("ddp", "zero"), topologies=(tiny_mem,), nodes=(1,))
    rec = sweep(TINY.replace(workload="mlp-4x16k"), space, workers=1).recommendation
    assert rec["best"] is None and rec["sharded_data_parallel_degree"] is None
    assert "no configuration fits" in rec["reason"]


def test_recommendation_is_the_fastest_fitting_row(tiny_df: pd.DataFrame) -> None:
    rec = recommend(tiny_df)
    fit = tiny_df[tiny_df["fits"]]
    assert rec["best"]["samples_per_s"] == fit["samples_per_s"].max()
    dp = fit[fit["strategy_kind"].isin(["ddp", "zero", "zero2d"])]
    best_dp = dp.loc[dp["samples_per_s"].idxmax()]
    assert rec["sharded_data_parallel_degree"] == best_dp["strategy_degree"]
    second = fit["samples_per_s"].nlargest(2).iloc[1]
    assert rec["margin"] == pytest.approx(fit["samples_per_s"].max() / second - 1)
    assert set(COLUMNS) <= set(tiny_df.columns)


def test_deterministic_serial_and_parallel(tiny_df: pd.DataFrame) -> None:
    again = sweep(TINY, workers=2).table  # the process pool
    pd.testing.assert_frame_equal(tiny_df, again)


def test_cli_json_shape(capsys) -> None:
    rc = main(
        [
            "sweep",
            "--workload",
            "tiny-gpt",
            "--nodes",
            "2",
            "--strategies",
            "ddp,zero2d,pipeline",
            "--pp",
            "2",
            "--json",
            "--workers",
            "1",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {"rows", "recommended"}
    assert doc["rows"] and all(set(ROW_KEYS) <= set(r) for r in doc["rows"])
    assert {r["strategy"]["kind"] for r in doc["rows"]} == {"ddp", "zero2d", "pipeline"}
    assert all(r["strategy"]["schedule"] is None for r in doc["rows"] if r["strategy"]["kind"] != "pipeline")
    assert all(r["strategy"]["degree"] == 1 for r in doc["rows"] if r["strategy"]["kind"] == "ddp")
    rec = doc["recommended"]
    assert rec["best"]["fits"] and isinstance(rec["sharded_data_parallel_degree"], int)
    assert rec["margin"] >= 0 and rec["sdp"]["strategy"]["kind"] in ("ddp", "zero", "zero2d")


def test_cli_table_and_files(tmp_path, capsys) -> None:
    out = tmp_path / "sweep"
    rc = main(
        [
            "sweep",
            "--workload",
            "tiny-gpt",
            "--nodes",
            "2",
            "--pp",
            "2",
            "--microbatches",
            "2",
            "--out",
            str(out),
            "--workers",
            "1",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "Recommended sharded_data_parallel_degree" in text and "Best configuration overall" in text
    for name in (
        "sweep.csv",
        "sweep.parquet",
        "recommended.json",
        "breakdown.png",
        "breakdown.svg",
        "memory.png",
        "memory.svg",
        "throughput_cost.png",
        "throughput_cost.svg",
    ):
        assert (out / name).stat().st_size > 0, name
    csv, parquet = pd.read_csv(out / "sweep.csv"), pd.read_parquet(out / "sweep.parquet")
    # every configuration a row, pruned as the printed table is (its bound and why beside it)
    assert len(csv) == len(parquet) > 0 and list(parquet.columns) == list(with_pruned(COLUMNS))
    cut = parquet[parquet["pruned"].isin(("compute bound", "chain bound"))]
    assert (
        cut["step_time_s"].isna().all()
        and (cut["bound_step_s"] > 0).all()
        and cut["pruned_by"].isin(parquet["label"]).all()
    )
    assert (out / "breakdown.png").read_bytes()[:4] == b"\x89PNG"


def test_topology_without_price_says_unknown(capsys) -> None:
    rc = main(
        [
            "sweep",
            "--workload",
            "tiny-gpt",
            "--topology",
            "emu-2x2",
            "--backend",
            "gloo",
            "--strategies",
            "ddp,zero",
            "--workers",
            "1",
        ]
    )
    assert rc == 0
    assert "unknown" in capsys.readouterr().out
    rc = main(
        [
            "sweep",
            "--workload",
            "tiny-gpt",
            "--topology",
            "emu-2x2",
            "--backend",
            "gloo",
            "--strategies",
            "ddp,zero",
            "--json",
            "--workers",
            "1",
        ]
    )
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert all(r["cost_per_million_samples_usd"] is None for r in rows)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--strategies", "zero2d", "--degrees", "3"], "empty sweep space"),
        (["--strategies", "pipeline", "--pp", "16"], "empty sweep space"),
        (["--topology", "emu-2x2"], "nccl needs GPUs"),
        (["--topology", "p3dn.24xlarge", "--precision", "bf16"], "no bf16"),
        (["--global-batch", "12", "--nodes", "2", "--tp", "1"], "does not divide"),  # (tp 2: 12 over 4 ranks)
        (["--topology", "no-such-instance"], "unknown topology"),
        (["--nodes", "two"], "comma-separated integers"),
        (["--strategies", "ddp,zero3"], "expected some of"),
        (["--reshard-after-forward", "maybe"], "expected true and/or false"),
        (["--checkpointing", "none,some"], "expected some of"),
        (["--reduce-dtypes", "fp32,fp8"], "expected some of"),
        (["--optimizer-impls", "foreach,lazy"], "expected some of"),
        (["--checkpointing", "selective", "--selective-ac-options", "op,0"], "selective_ac_option"),
        (["--checkpointing", "full", "--selective-ac-options", "op,2"], "need selective checkpointing"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, needle, capsys) -> None:
    assert run_cli(["sweep", "--workload", "tiny-gpt", "--workers", "1", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_unwritable_output_folder_fails_before_predicting(tmp_path, capsys, monkeypatch) -> None:
    from shardsim.sweep import search  # where sweep() looks up predict_all

    monkeypatch.setattr(search, "predict_all", lambda *a, **k: pytest.fail("predicted before checking --out"))
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for out in (a_file, a_file / "sub"):
        assert main(["sweep", "--workload", "tiny-gpt", "--nodes", "2", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{out}: field '--out': " in err, err


def test_weak_scaling_rows_and_efficiency(capsys) -> None:
    space = SweepSpace(strategies=("ddp", "zero"), nodes=(1, 2, 4))
    df = sweep(TINY, space, workers=1).table
    assert set(SCALING_COLUMNS) <= set(df.columns)
    assert sorted(df["world"].unique()) == [4, 8, 16]
    # weak: the data-parallel rows' batch per device fixed; every layout of a cluster at their global batch
    dp = df["strategy_tp"] == 1
    assert (df.loc[dp, "batch_per_device"] == TINY.batch_per_device).all() and (~dp).any()
    assert (df["global_batch"] == TINY.batch_per_device * df["world"]).all()
    assert (df["batch_per_device"] == TINY.batch_per_device * df["strategy_tp"]).all()
    assert (df["scaling_mode"] == "weak").all()
    for cfg, g in df.groupby("label"):
        g = g.sort_values("world")
        base = g.iloc[0]
        assert base["scaling_efficiency"] == pytest.approx(1.0)
        assert g["ideal_samples_per_s"].tolist() == pytest.approx((base["samples_per_s"] * g["world"] / 4).tolist())
        assert (g["scaling_efficiency"] > 0).all() and (g["scaling_efficiency"] <= 1.0 + 1e-9).all(), cfg
    rec = recommend(df)
    assert len(rec["clusters"]) == 3
    rc = main(["sweep", "--workload", "tiny-gpt", "--nodes", "1,2,4", "--strategies", "ddp,zero", "--workers", "1"])
    assert rc == 0 and "scaling efficiency" in capsys.readouterr().out


def test_strong_scaling_fixes_the_global_batch_and_skips_worlds_it_does_not_divide() -> None:
    # 24 = 6 x 4, 3 x 8, not 16 (tp 1: test_sweep_tp.py has tensor parallelism under a global batch)
    space = SweepSpace(strategies=("zero",), nodes=(1, 2, 4), global_batch=24, tp_degrees=(1,))
    result = sweep(TINY, space, workers=1)
    df, skipped = result.table, result.skipped
    assert sorted(df["world"]) == [4, 8]
    assert (df["global_batch"] == 24).all() and sorted(df["batch_per_device"]) == [3, 6]
    assert (df["scaling_mode"] == "strong").all()
    assert len(skipped) == 1 and "does not divide" in skipped[0]


def test_several_topologies_in_one_sweep(tmp_path) -> None:
    topologies = ("g4dn.12xlarge", "p3dn.24xlarge")
    space = SweepSpace(strategies=("zero",), topologies=topologies, nodes=(1, 2), tp_degrees=(1,))  # a row a cluster
    df = sweep(TINY.replace(precision="fp16"), space, workers=1).table
    assert df.groupby("topology")["world"].apply(sorted).to_dict() == {
        "g4dn.12xlarge": [4, 8],
        "p3dn.24xlarge": [8, 16],
    }
    assert df["scaling_efficiency"].notna().all()
    from shardsim.report.plots import plot_all

    names = {p.name for p in plot_all(df, tmp_path)}
    assert {"scaling.png", "scaling.svg"} <= names


def test_space_rejects_nonsense() -> None:
    with pytest.raises(ConfigError):
        SweepSpace(strategies=("tp",))
    with pytest.raises(ConfigError):
        SweepSpace(degrees=(0,))
    with pytest.raises(ConfigError):
        SweepSpace(nodes=())


def test_synthetic_cluster_object_is_accepted() -> None:
    inst = instance(devices=2)
    df = sweep(TINY, SweepSpace(strategies=("ddp",), topologies=(inst,), nodes=(2,), tp_degrees=(1,)), workers=1).table
    assert df["world"].tolist() == [Cluster(inst, 2).world]
    assert df["cost_per_million_samples_usd"].isna().all()  # no price: unknown, not zero


# The settings as opt-in dimensions of the space.
SETTINGS_SPACE = SweepSpace(
    strategies=("ddp", "zero", "zero2d", "pipeline"),
    pp=(2,),
    microbatches=(4,),
    schedules=("1f1b",),
    reshard_after_forward=(True, False),
    checkpointing=("full", "selective"),
    selective_ac_options=("op", 2),
    reduce_dtypes=("fp32", "fp16"),
    optimizer_impls=("foreach", "fused"),
    tp_degrees=(1,),  # the settings' dimensions over the data-parallel and pipeline strategies alone
)


def test_without_settings_lists_the_space_and_columns_are_todays(tiny_df: pd.DataFrame) -> None:
    en = enumerate_configs(TINY)
    assert [c.label for c in en.candidates] == [c.cfg.strategy.label() for c in en.candidates]
    # the base's settings, and its global batch: a tensor-parallel group of t devices takes t times the batch
    t = TINY.batch_per_device
    assert all(
        c.cfg == TINY.replace(strategy=c.cfg.strategy, batch_per_device=t * c.cfg.strategy.tp) for c in en.candidates
    )
    assert list(tiny_df.columns) == list(COLUMNS) and not set(SETTING_COLUMNS) & set(tiny_df.columns)


def test_settings_lists_multiply_the_space_with_unique_labels() -> None:
    base = TINY.replace(precision="fp16")
    en = enumerate_configs(base, SETTINGS_SPACE)
    labels = [c.label for c in en.candidates]
    assert len(set(labels)) == len(labels)
    by_kind: dict[str, list] = {}
    for c in en.candidates:
        by_kind.setdefault(c.cfg.strategy.kind, []).append(c)
    # checkpointing full, selective op, selective 2 (3) x foreach, fused (2) for every strategy;
    # x reduce fp32, fp16 (2); x ZeRO-3, ZeRO-2 (2) for zero and zero2d
    assert len(by_kind["ddp"]) == 12 and len(by_kind["zero"]) == 24
    assert len(by_kind["zero2d"]) == 2 * 24  # d = 2, 4
    assert {c.cfg.strategy.reshard_after_forward for c in by_kind["pipeline"]} == {True}
    assert {c.cfg.ddp_reduce_dtype for c in by_kind["ddp"]} == {"fp32", "fp16"}  # fp16: its compression hook
    assert "ddp, reduce fp32" not in labels and "ddp, reduce fp16" in labels  # DDP's base reduces fp32
    # the base's settings (full, reduce fp16 = the precision, foreach) give no suffix; the others name what differs
    assert "zero" in labels and "ddp" in labels
    assert "zero (ZeRO-2), ckpt selective k=2, reduce fp32, adam fused" in labels
    assert "ddp, adam fused" in labels and all("reduce fp16" in lb for lb in labels if lb.startswith("ddp, reduce"))
    # order: each strategy with all its settings, ZeRO-3 before ZeRO-2
    zero = [c.label for c in by_kind["zero"]]
    assert zero[:3] == ["zero, reduce fp32", "zero, reduce fp32, adam fused", "zero"]
    assert zero[12].startswith("zero (ZeRO-2)")


def test_settings_rows_columns_ranking_and_recommendation(capsys) -> None:
    base = TINY.replace(precision="fp16")
    df = sweep(base, SETTINGS_SPACE, workers=1).table
    assert list(df.columns) == [
        *COLUMNS[: COLUMNS.index("global_batch") + 1],
        *SETTING_COLUMNS,
        *COLUMNS[COLUMNS.index("global_batch") + 1 :],
    ]
    assert df["label"].is_unique and df["rank"].tolist() == list(range(1, len(df) + 1))
    zero2 = df[df["label"] == "zero (ZeRO-2)"].iloc[0]
    assert zero2["strategy_reshard_after_forward"] == False and zero2["reduce_dtype"] == "fp16"  # noqa: E712
    assert zero2["checkpointing"] == "full" and zero2["optimizer_impl"] == "foreach"
    assert pd.isna(zero2["selective_ac_option"])
    assert df[df["strategy_kind"] == "ddp"]["strategy_reshard_after_forward"].isna().all()
    ddp = df[df["label"] == "ddp"].iloc[0]
    ddp16 = df[df["label"] == "ddp, reduce fp16"].iloc[0]
    assert (ddp["reduce_dtype"], ddp16["reduce_dtype"]) == ("fp32", "fp16")  # the base (None): DDP's fp32
    k2 = df[df["label"] == "zero, ckpt selective k=2, reduce fp32"].iloc[0]
    assert k2["selective_ac_option"] == "2" and k2["reduce_dtype"] == "fp32"
    # ranking: fitting rows by samples/s; the settings change the predictions
    fit = df[df["fits"]]
    assert fit["samples_per_s"].is_monotonic_decreasing
    assert df[df["strategy_kind"] == "zero"]["step_time_s"].nunique() > 1
    rec = recommend(df)
    assert set(SETTING_COLUMNS) <= set(rec["best"]) and set(SETTING_COLUMNS) <= set(rec["sdp"])
    best = df.iloc[0]
    assert rec["best"]["label"] == best["label"]
    assert rec["best"]["checkpointing"] == best["checkpointing"]
    assert rec["best"]["reduce_dtype"] == best["reduce_dtype"]
    # today's recommendation keys where no settings are listed
    assert not set(SETTING_COLUMNS) & set(sweep(TINY, SweepSpace(strategies=("zero",)), workers=1).recommendation.best)


def test_cli_settings_lists(tmp_path, capsys) -> None:
    argv = "sweep --workload tiny-gpt --nodes 2 --strategies ddp,zero --tp 1 --workers 1".split()  # tp 1: the settings
    rc = main(
        [
            *argv,
            "--reshard-after-forward",
            "true,false",
            "--checkpointing",
            "none,selective",
            "--selective-ac-options",
            "op,2",
            "--optimizer-impls",
            "fused,foreach",
            "--json",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["rows"]
    assert all(set(SETTING_COLUMNS) <= set(r) for r in rows)
    configs = {r["label"] for r in rows}
    assert len(configs) == len(rows) == 3 * 2 + 3 * 2 * 2  # ddp: 3 checkpointing x 2 impls; zero: x ZeRO-3/2
    assert {"ddp", "zero", "zero (ZeRO-2)", "zero, ckpt selective k=2, adam foreach"} <= configs  # base: none, fused
    assert {r["optimizer_impl"] for r in rows} == {"fused", "foreach"}
    assert doc["recommended"]["best"]["optimizer_impl"] in ("fused", "foreach")
    # a single value sets the base alone: today's columns
    assert main([*argv, "--checkpointing", "none", "--optimizer-impl", "fused", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert set(flatten(rows[0])) == set(COLUMNS) and {r["label"] for r in rows} == {"ddp", "zero"}
    # the table and the CSV say the settings
    out = tmp_path / "s"
    assert main([*argv, "--checkpointing", "full,none", "--out", str(out), "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "checkpointing on/off" not in text and "checkpointing off/on" in text and "zero, ckpt off" in text
    csv = pd.read_csv(out / "sweep.csv")
    assert set(SETTING_COLUMNS) <= set(csv.columns) and set(csv["checkpointing"]) == {"full", "none"}
    assert "checkpointing" in json.loads((out / "recommended.json").read_text())["best"]


def test_space_rejects_bad_settings() -> None:
    with pytest.raises(ConfigError, match="fp8"):
        SweepSpace(reduce_dtypes=("fp8",))
    with pytest.raises(ConfigError):
        SweepSpace(checkpointing=())
    with pytest.raises(ConfigError):
        SweepSpace(reshard_after_forward=("no",))
    with pytest.raises(ConfigError):
        SweepSpace(selective_ac_options=("every",))
    with pytest.raises(ConfigError, match="selective"):
        enumerate_configs(TINY, SweepSpace(selective_ac_options=("op", "2")))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(batch=st.integers(1, 4), accum=st.integers(1, 3), nodes=st.sampled_from((1, 2)))
def test_every_layout_of_a_cluster_runs_the_data_parallel_layouts_global_batch(batch, accum, nodes) -> None:
    base = TINY.replace(batch_per_device=batch, grad_accum=accum, nodes=nodes)
    en = enumerate_configs(base, SweepSpace(pp=(2,)))
    world = en.candidates[0].cluster.world
    tps = {c.cfg.strategy.tp for c in en.candidates}
    assert tps > {1}  # tensor-parallel layouts are among them
    for c in en.candidates:
        s = c.cfg.strategy
        assert c.cfg.batch_per_device * (world // s.tp) * c.cfg.grad_accum == batch * world * accum, c.label
        assert c.cfg.batch_per_device == batch * s.tp and c.cfg.grad_accum == accum
    apart = enumerate_configs(base, SweepSpace(pp=(2,), hold_global_batch=False))
    assert {c.cfg.batch_per_device for c in apart.candidates} == {batch}
