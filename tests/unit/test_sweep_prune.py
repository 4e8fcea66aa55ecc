"""The pruned search: its compute bound is below every simulated step, and its answer is the
exhaustive search's (the recommendation, each cluster's leading rows, the plots' rows, the scaling
columns)."""

from __future__ import annotations

import math
import statistics

import pandas as pd
import pytest

from shardsim.config import RunConfig
from shardsim.report.plots import representative_rows
from shardsim.simulator.bounds import compute_bound_s
from shardsim.simulator.predict import chain_bound_s, predict, prepare
from shardsim.simulator.workload.resolve import load_workload
from shardsim.sweep.prune import PRUNED_COMPUTE
from shardsim.sweep.ranking import scaling_configs
from shardsim.sweep.rows import PRUNED_COLUMNS
from shardsim.sweep.search import sweep
from shardsim.sweep.space import SweepSpace, enumerate_configs

TINY = RunConfig(workload="tiny-gpt", topology="g4dn.12xlarge", nodes=2)  # 8 T4s
SPACES = {
    "tp": (TINY, SweepSpace()),
    "pipelines, gpipe and 1f1b, checkpointing listed": (
        RunConfig(workload="tiny-gpt", topology="p4d.24xlarge", nodes=2, precision="bf16"),
        SweepSpace(strategies=("zero2d", "pipeline"), checkpointing=("none", "full")),
    ),
    "tensor-parallel pipelines, asyncTP, checkpointing listed": (
        RunConfig(
            workload="tiny-gpt",
            topology="g4dn.12xlarge",
            nodes=2,
            strategy={"kind": "zero", "tp": 2, "sequence_parallel": True, "async_tp": True},
            compile=True,
        ),
        SweepSpace(strategies=("zero", "pipeline"), tp_degrees=(2, 4), checkpointing=("full", "selective")),
    ),
    "expert-parallel pipelines, tp 1 and 2": (
        RunConfig(workload="tiny-moe", topology="p4d.24xlarge", nodes=1, precision="bf16"),
        SweepSpace(strategies=("zero", "pipeline"), ep=(2, 4), tp_degrees=(1, 2), pp=(2, 4), microbatches=(2, 4, 8)),
    ),
    "several clusters, checkpointing and accumulation listed": (
        RunConfig(workload="tiny-gpt", topology="p4d.24xlarge", precision="bf16"),
        SweepSpace(
            nodes=(1, 2, 4), global_batch=64, schedules=("1f1b",), checkpointing=("none", "full"), grad_accums=(1, 2)
        ),
    ),
    "several clusters, strong scaling": (
        RunConfig(workload="tiny-gpt", topology="p4d.24xlarge", precision="bf16"),
        SweepSpace(nodes=(1, 2, 4), global_batch=64, schedules=("1f1b",)),
    ),
}


@pytest.mark.parametrize("name", SPACES)
def test_the_compute_and_chain_bounds_are_below_every_simulated_step(name) -> None:
    base, space = SPACES[name]
    w = load_workload(base.workload, base.shape, base.source)
    tight = []  # bound / step of the pipelines and ddp rows: their schedules and syncs are counted
    for c in enumerate_configs(base, space, w).candidates[::3]:
        s = prepare(c.cfg, workload=w, cluster=c.cluster)
        if not s.fits:
            continue
        step = predict(c.cfg, workload=w, cluster=c.cluster).step_time_s
        bound = compute_bound_s(s)
        assert 0 < bound <= step * (1 + 1e-12), c.label
        assert 0 < chain_bound_s(s) <= step * (1 + 1e-12), c.label
        if c.cfg.strategy.spec.is_pipeline or c.cfg.strategy.kind == "ddp":
            tight.append(bound / step)
    assert len(tight) >= 5 and statistics.median(tight) > 0.95


def _compare(base: RunConfig, space: SweepSpace, keep: int):
    exact = sweep(base, space, workers=1, prune=False)
    cut = sweep(base, space, workers=1, prune=True, keep=keep, plots=True)
    assert cut.recommendation == exact.recommendation
    a, b = cut.table, exact.table
    assert list(a.drop(columns=list(PRUNED_COLUMNS)).columns) == list(b.columns)
    assert len(a) == len(b)
    assert sum(cut.pruned.values()) == int((a["pruned"] != "").sum())
    clusters = ["topology", "nodes"]
    for (cl, ga), (cl_b, gb) in zip(a.groupby(clusters, sort=False), b.groupby(clusters, sort=False), strict=True):
        assert cl == cl_b
        head_a, head_b = ga.head(keep).drop(columns=list(PRUNED_COLUMNS)), gb.head(keep)
        pd.testing.assert_frame_equal(head_a.reset_index(drop=True), head_b.reset_index(drop=True))
        rep_a, rep_b = representative_rows(ga), representative_rows(gb)
        pd.testing.assert_frame_equal(
            rep_a.drop(columns=[*PRUNED_COLUMNS, "rank"]).reset_index(drop=True),
            rep_b.drop(columns="rank").reset_index(drop=True),
        )
    for top, ga in a.groupby("topology", sort=False):  # the scaling tables: the same lines, every row exact
        gb = b[b["topology"] == top]
        lines = scaling_configs(ga)
        assert lines == scaling_configs(gb)
        shown = ga[ga["label"].isin(lines) & ga["fits"]]
        assert (shown["pruned"] == "").all(), shown[shown["pruned"] != ""]["label"].tolist()
    simulated = a["pruned"] == ""
    # every row simulated has the exhaustive figures (its rank aside), and every row pruned by the
    # bound would not have changed the answer: it fits, with NaN times
    key = ["topology", "nodes", "label"]
    merged = a.merge(b, on=key, suffixes=("", "_x"))
    for col in ("step_time_s", "samples_per_s", "memory_required_gib", "scaling_efficiency"):
        if col in a:
            sim = merged[simulated.values]
            assert (sim[col].fillna(-1) == sim[f"{col}_x"].fillna(-1)).all(), col
    gone = a[a["pruned"] == PRUNED_COMPUTE]
    assert gone["fits"].all() and gone["step_time_s"].isna().all()
    # a row a bound pruned: its bound is below its exhaustive step, and the configuration it names
    # as pruning it (simulated on its topology: a scaling line's best is over the cluster sizes)
    # runs faster than that bound allows it to
    bounded = merged[merged["pruned"].isin((PRUNED_COMPUTE, "chain bound")).values]
    assert (bounded["bound_step_s"] <= bounded["step_time_s_x"] * (1 + 1e-9)).all()
    for _, r in bounded.iterrows():
        by = a[(a["topology"] == r["topology"]) & (a["label"] == r["pruned_by"]) & (a["pruned"] == "")]
        assert len(by) >= 1, r["pruned_by"]
        assert by["samples_per_s"].max() > r["global_batch"] / r["bound_step_s"], r["label"]
    assert (a.loc[simulated, "pruned_by"] == "").all() and a.loc[simulated, "bound_step_s"].isna().all()
    return cut


CHAIN_PRUNES = {"tensor-parallel pipelines, asyncTP, checkpointing listed"}


@pytest.mark.parametrize("name", SPACES)
def test_the_pruned_search_answers_as_the_exhaustive_one(name) -> None:
    base, space = SPACES[name]
    cut = _compare(base, space, keep=2)
    assert cut.pruned[PRUNED_COMPUTE] > 0
    if name in CHAIN_PRUNES:  # what the compute bound leaves, the chain bound prunes
        assert cut.pruned["chain bound"] > 0


def test_the_seed_sweep_prunes_and_answers_the_same() -> None:
    exact = sweep(RunConfig(), SweepSpace(strategies=("zero2d", "pipeline"), tp_degrees=(1,)), workers=1, prune=False)
    cut = sweep(
        RunConfig(), SweepSpace(strategies=("zero2d", "pipeline"), tp_degrees=(1,)), workers=1, prune=True, keep=3
    )
    assert cut.recommendation == exact.recommendation
    assert cut.pruned[PRUNED_COMPUTE] > 0
    assert "compute bound" in (cut.pruned_line() or "")
    assert set(cut.table["pruned"]) <= {"", "memory", "compute bound", "chain bound"}
    assert not math.isnan(cut.table["samples_per_s"].iloc[0])


def test_the_pruned_search_gives_the_same_rows_on_one_worker_and_on_two() -> None:
    base, space = SPACES["tp"]
    one = sweep(base, space, workers=1, prune=True, keep=3)
    two = sweep(base, space, workers=2, prune=True, keep=3)
    pd.testing.assert_frame_equal(one.table, two.table)
    assert one.pruned == two.pruned and one.pruned.get("chain bound", 0) + one.pruned.get(PRUNED_COMPUTE, 0) > 0


def test_the_compute_bound_counts_tensor_parallel_collectives() -> None:
    # over PCIe (g4dn), a tp 4 layer's collectives are on the critical path: the bound counts them;
    # with asyncTP its fused pairs are in the layer's time, and tiny-gpt's chunks (8 rows) each cost
    # a wave of tiles as the whole (32 rows) does: the decomposition does not pay, and the bound says so
    base, _ = SPACES["tp"]
    w = load_workload(base.workload, base.shape, base.source)
    base = base.replace(compile=True)  # asyncTP needs torch.compile
    s = prepare(base.replace(strategy={"kind": "zero", "tp": 4, "sequence_parallel": True}), workload=w)
    fused = prepare(
        base.replace(strategy={"kind": "zero", "tp": 4, "sequence_parallel": True, "async_tp": True}), workload=w
    )
    step, fused_step = (predict(x.cfg, workload=w).step_time_s for x in (s, fused))
    assert compute_bound_s(s) <= step
    assert compute_bound_s(s) < compute_bound_s(fused) <= fused_step


def test_an_assessed_row_is_the_row_of_its_prediction_without_simulation() -> None:
    """`assess` builds each row without the configuration's dict: the same row as from the whole
    unsimulated prediction, whose key and memory dicts are `asdict`'s."""
    import json
    from dataclasses import asdict

    from shardsim.simulator.results import result_key
    from shardsim.sweep.prune import assess
    from shardsim.sweep.rows import row_of

    base = RunConfig(workload="tiny-gpt", topology="p4d.24xlarge", nodes=2, precision="bf16")
    w = load_workload(base.workload, base.shape, base.source)
    cands = enumerate_configs(base, SweepSpace(strategies=("zero2d", "pipeline"), pp=(2,)), w).candidates
    assert len(cands) >= 4
    for c in cands:
        s = prepare(c.cfg, workload=w, cluster=c.cluster)
        whole = s.unsimulated()
        assert whole.config == s.cfg.to_dict()
        want = row_of(c, whole)
        got = assess(c, w).row
        assert json.dumps({k: got[k] for k in want}) == json.dumps(want)
        allocator = ("workspaces_gib", "rounding_gib", "cached_gib")  # in the allocated and reserved totals
        assert whole.memory == {k: v for k, v in asdict(s.memory).items() if k not in allocator}
        key = result_key(c.cfg, topology="t", nodes=1, world=c.cluster.world, device="d")
        assert key.to_dict() == asdict(key)
