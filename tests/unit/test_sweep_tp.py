"""Tensor parallelism in the sweep: the degrees and sequence parallelism it tries by default or as
listed, the batch under a fixed global batch, the layout column and the recommendation's degrees,
and memory first (small and fast: tiny models)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from shardsim.cli import main
from shardsim.config import RunConfig
from shardsim.config.schema import Shape
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import make_cluster
from shardsim.sweep.recommendation import recommend
from shardsim.sweep.search import sweep
from shardsim.sweep.space import SweepSpace, enumerate_configs, mesh_layouts
from tests.helpers import instance

TINY = RunConfig(workload="tiny-gpt", topology="g4dn.12xlarge", nodes=2)  # 4 heads, FFN 256, 32 tokens; 8 T4s


def _layouts(workload: str, topology: str = "g4dn.12xlarge", shape: Shape | None = None, **space) -> list:
    base = RunConfig(workload=workload, topology=topology, nodes=1, shape=shape or Shape())
    arch = load_workload(base.workload, base.shape, base.source).arch
    layouts = mesh_layouts(base, SweepSpace(**space), make_cluster(topology, 1), arch)
    return [(lay.dims.tp, lay.sequence_parallel) for lay in layouts]


def test_the_default_degrees_divide_the_gpus_per_node_and_what_the_model_splits() -> None:
    # g4dn.12xlarge has 4 GPUs a node: tp 1, 2, 4 where the model admits them, sequence parallel above 1
    assert _layouts("tiny-gpt") == [(1, False), (2, True), (4, True)]
    assert _layouts("gpt2-xl") == [(1, False)]  # 25 heads: neither 2 nor 4 divides them
    assert _layouts("tiny-gpt", shape=Shape(ffn=258)) == [(1, False), (2, True)]  # 4 does not divide FFN 258
    assert _layouts("tiny-gpt", "p4d.24xlarge") == [(1, False), (2, True), (4, True)]  # 8 GPUs, but 4 heads
    assert _layouts("tiny-mlp") == [(1, False)]  # no heads: no tensor parallelism
    # a ViT's tokens (tiny-vit: 16 patches + 1) do not split over tp ranks: tensor parallelism without
    assert _layouts("tiny-vit") == [(1, False), (2, False), (4, False)]


def test_sequence_parallelism_listed_gives_both_and_listed_degrees_replace_the_default() -> None:
    both = _layouts("tiny-gpt", sequence_parallel=(False, True))
    assert both == [(1, False), (2, False), (2, True), (4, False), (4, True)]  # tp 1 has no sequence to split
    assert _layouts("tiny-gpt", tp_degrees=(4,)) == [(4, True)]
    assert _layouts("tiny-gpt", tp_degrees=(1,), sequence_parallel=(True,)) == [(1, False)]
    en = enumerate_configs(TINY, SweepSpace(strategies=("ddp",), sequence_parallel=(False, True)))
    assert [(c.cfg.strategy.tp, c.cfg.strategy.sequence_parallel) for c in en.candidates] == both
    # asked for on a ViT, sequence parallelism is dropped with its reason (its 17 tokens over 2 or 4 ranks)
    vit = enumerate_configs(
        TINY.replace(workload="tiny-vit"), SweepSpace(strategies=("ddp",), sequence_parallel=(True,))
    )
    assert [c.cfg.strategy.tp for c in vit.candidates] == [1]
    assert len(vit.dropped) == 2 and all("sequence parallelism splits the 17 tokens" in why for why in vit.dropped)


def test_the_cli_lists_tp_degrees_and_sequence_parallelism(capsys) -> None:
    argv = "sweep --workload tiny-gpt --nodes 1 --strategies ddp --workers 1 --json".split()
    assert main([*argv, "--tp", "2,4", "--sequence-parallel", "false,true"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    got = sorted((r["strategy"]["tp"], r["strategy"]["sequence_parallel"]) for r in rows)
    assert got == [(2, False), (2, True), (4, False), (4, True)]
    assert main([*argv, "--tp-degrees", "2", "--no-sequence-parallel"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["strategy"]["tp"], r["strategy"]["sequence_parallel"], r["label"]) for r in rows] == [
        (2, False, "ddp tp=2")
    ]
    with pytest.raises(SystemExit) as exit_:  # argparse's refusal: one line naming the flag, status 2
        main([*argv, "--tp", "0"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "--tp" in err and "got '0'" in err, err


def test_under_a_global_batch_the_batch_per_device_follows_the_data_parallel_ranks() -> None:
    # 1 node = 4 T4s: 12 samples over 4 (tp 1), 2 (tp 2), 1 (tp 4) data-parallel ranks: 3, 6, 12 a device
    space = SweepSpace(strategies=("ddp",), nodes=(1,), global_batch=12)
    df = sweep(TINY, space, workers=1).table
    assert sorted(zip(df["strategy_tp"], df["batch_per_device"], strict=True)) == [(1, 3), (2, 6), (4, 12)]
    assert (df["global_batch"] == 12).all()
    # 6 samples: not over 4 ranks (tp 1) but over 2 and 1; on 2 nodes (8 T4s) over the 2 of tp 4 alone
    space = SweepSpace(strategies=("ddp",), nodes=(1, 2), global_batch=6)
    result = sweep(TINY, space, workers=1)
    got = sorted(zip(result.table["world"], result.table["strategy_tp"], result.table["batch_per_device"], strict=True))
    assert got == [(4, 2, 3), (4, 4, 6), (8, 4, 3)]
    assert not result.skipped
    # 3 samples over 8 T4s: no tensor-parallel degree leaves ranks it divides over, the cluster is skipped
    result = sweep(TINY, replace(space, global_batch=3), workers=1)
    assert sorted(result.table["world"].unique()) == [4]  # 3 over tp 4's one rank of 4 T4s
    assert list(result.skipped) == [
        "2 x g4dn.12xlarge: global batch 3 does not divide over 8 devices "
        "(data-parallel ranks: 8 at tp 1, 4 at tp 2, 2 at tp 4)"
    ]


def test_the_layout_column_and_the_recommendation_name_every_degree(capsys) -> None:
    # one configuration: 8 T4s as tp 2 x pp 2 x 2 data-parallel ranks, its stages sharded over both
    space = SweepSpace(
        strategies=("pipeline",), pp=(2,), degrees=(2,), microbatches=(4,), schedules=("1f1b",), tp_degrees=(2,)
    )
    result = sweep(TINY, space, workers=1)
    assert result.table["layout"].tolist() == ["2 × 2 × 2(2)"]
    best = result.recommendation.best
    assert best["layout"] == "2 × 2 × 2(2)"
    assert best["degrees"] == {"tp": 2, "pp": 2, "dp": 2, "shard": 2}
    assert best["sagemaker"] == {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2, "hybrid_shard_degree": 2}
    # each row's layout: tp, pp, the data-parallel ranks of a stage (world / tp / pp) and its shard degree
    df = sweep(TINY, SweepSpace(strategies=("ddp", "zero", "zero2d"), tp_degrees=(1, 4)), workers=1).table
    assert dict(zip(df["label"], df["layout"], strict=True)) == {
        "ddp": "1 × 1 × 8(1)",
        "zero": "1 × 1 × 8(8)",
        "zero2d d=2": "1 × 1 × 8(2)",
        "zero2d d=4": "1 × 1 × 8(4)",
        "ddp tp=4 sp": "4 × 1 × 2(1)",
        "zero tp=4 sp": "4 × 1 × 2(2)",
    }
    # the table shows the column, the JSON recommendation the degrees
    argv = "sweep --workload tiny-gpt --nodes 2 --strategies zero --tp 2 --workers 1 --no-progress".split()
    assert main(argv) == 0
    assert "2 × 1 × 4(4)" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)["recommended"]["best"]
    assert rec["degrees"] == {"tp": 2, "pp": 1, "dp": 4, "shard": 4}
    assert rec["sagemaker"] == {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 1, "hybrid_shard_degree": 4}


def test_a_layout_that_does_not_fit_is_not_simulated_nor_recommended() -> None:
    # small-gpt's tp 1 DDP replicates every weight: the fastest on paper and the largest; devices a
    # little short of its memory leave it out, and the tensor-parallel rows (a tp-th of the weights) in
    # (over PCIe: NCCL's 2 channels keep the TP group's buffers under what a tp-th of the weights saves)
    base = TINY.replace(workload="small-gpt")
    space = SweepSpace(strategies=("ddp",), nodes=(2,))
    roomy = sweep(base, replace(space, topologies=(instance(devices=4, memory_gib=80.0, fabric="pcie"),)), workers=1)
    roomy = roomy.table
    fastest = roomy.loc[roomy["samples_per_s"].idxmax()]
    assert fastest["strategy_tp"] == 1 and sorted(roomy["strategy_tp"]) == [1, 2, 4]
    assert (roomy["memory_required_gib"] < fastest["memory_required_gib"]).sum() == 2
    tight = instance(devices=4, memory_gib=fastest["memory_required_gib"] - 0.01, fabric="pcie")
    df = sweep(base, replace(space, topologies=(tight,)), workers=1).table
    row = df[df["strategy_tp"] == 1].iloc[0]
    assert not row["fits"] and "GiB" in row["fit_reason"]
    assert row["memory_required_gib"] == fastest["memory_required_gib"]  # its memory, known before simulating
    assert math.isnan(row["samples_per_s"]) and math.isnan(row["step_time_s"])  # not simulated
    assert df[df["strategy_tp"] > 1]["fits"].all()
    rec = recommend(df)
    assert rec["best"]["strategy"]["tp"] > 1 and rec["best"]["fits"]
    assert rec["sdp"]["strategy"]["tp"] > 1 and row["rank"] == len(df)


@pytest.mark.parametrize("tp", [2, 4])
def test_a_listed_degree_the_model_refuses_is_dropped_with_its_reason(tp) -> None:
    # gpt2-xl's 25 heads: tp 2 and 4 do not divide them; tp 1 stays
    en = enumerate_configs(TINY.replace(workload="gpt2-xl"), SweepSpace(strategies=("ddp",), tp_degrees=(1, tp)))
    assert [c.cfg.strategy.tp for c in en.candidates] == [1]
    assert list(en.dropped) == [f"tp {tp} does not divide the model's 25 attention heads"]
