"""Multi-stage pipeline schedules in the plan and the prediction (in-process, tiny-gpt): each
rank runs its passes in `specs.schedules.rank_order`, zbv hands its turn over locally,
zero-bubble passes split a backward's time, memory follows the schedule, the sweep's bound
stays below the step, and what PyTorch refuses is refused in one line."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardsim.cli import main
from shardsim.config import load_config, resolve
from shardsim.core.errors import ConfigError
from shardsim.simulator.bounds import compute_bound_s
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.plan import Plan
from shardsim.simulator.predict import predict, prepare
from shardsim.simulator.strategies.build import build_plan
from shardsim.simulator.strategies.virtual_pipeline import held_activations, weight_grad_share
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.schedules import Action, rank_order, rank_stages
from shardsim.specs.stage_split import balanced_split

MULTI = ["interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev"]
PASS = re.compile(r"^(F|B)(?: [a-z]\w*)? s(\d+) m(\d+)(?: (I|W))?")  # "F s0 m1", "B layer3 s2 m0 I"


def _opts(schedule: str = "zbv", **more) -> dict:
    return {
        "workload": "tiny-gpt",
        "topology": "emu-2x2",
        "strategy": "pipeline",
        "pp": 2,
        "microbatches": 4,
        "schedule": schedule,
        "stages_per_rank": 2,
        "checkpointing": False,
        **more,
    }


def _plan(opts: dict, world: int = 2) -> Plan:
    cfg = load_config(None, opts)
    w = load_workload(cfg.workload)
    cfg, res = resolve(cfg, world, len(w.layers))
    device = make_cluster(cfg.topology, cfg.nodes).instance.device
    return build_plan(cfg, res, w, ComputeModel(device, cfg.precision))


def _passes(plan: Plan, rank: int) -> list[tuple[Action, float]]:
    """Rank class `rank`'s passes in plan order, each with its compute seconds."""
    out: list[tuple[Action, float]] = []
    for op in plan.ops:
        m = PASS.match(op.name)
        if op.rank_class != rank or op.kind != "compute" or not m:
            continue
        a = Action(int(m[2]), m[4] or m[1], int(m[3]))
        if out and out[-1][0] == a:  # a pass of several block ops
            out[-1] = (a, out[-1][1] + op.duration)
        else:
            out.append((a, op.duration))
    return out


@pytest.mark.parametrize("schedule", MULTI)
@pytest.mark.parametrize("degree", [1, 2])
def test_each_rank_runs_its_passes_in_the_schedules_order(schedule: str, degree: int) -> None:
    """Plain and sharded stages: the plan's passes on each rank are rank_order's; a sharded
    stage reduce-scatters each of its units once a step (its embedding and head: its root)."""
    plan = _plan(_opts(schedule, degree=degree), world=2 * degree)
    for r in range(2):
        assert [a for a, _ in _passes(plan, r)] == rank_order(schedule, 2, 4, 2, r)
        scattered = {op.name for op in plan.ops if op.rank_class == r and op.coll == "reduce_scatter"}
        stages = rank_stages(schedule, 2, 2, r)
        roots = sum(s in (0, 3) for s in stages)
        assert len(scattered) == (2 + roots if degree > 1 else 0), scattered


def test_zbv_hands_its_turn_over_on_the_rank_and_looped_schedules_send_it() -> None:
    """Stage 1 feeds stage 2: on rank 1 itself under zbv (no send), rank 1 to rank 0 when looped."""
    for schedule, sends in (("zbv", 0), ("interleaved-1f1b", 4)):
        plan = _plan(_opts(schedule))
        assert sum(op.coll == "send_recv" and op.name.startswith("send act s1 ") for op in plan.ops) == sends


def test_zero_bubble_passes_split_the_backward() -> None:
    """I + W of a (stage, microbatch) is the B of the same pass under interleaved-1f1b; W is the
    weight-gradient share (the embedding's backward all W)."""
    full = {a: t for r in range(2) for a, t in _passes(_plan(_opts("interleaved-1f1b")), r) if a.kind == "B"}
    split = {a: t for r in range(2) for a, t in _passes(_plan(_opts("interleaved-zb")), r)}
    assert len(full) == 16
    for (stage, _, m), b in full.items():
        i, w = split[Action(stage, "I", m)], split[Action(stage, "W", m)]
        assert i + w == pytest.approx(b, rel=1e-12) and 0 < w < b
    w = load_workload("tiny-gpt")
    embed, layer, tokens = w.blocks[0], w.blocks[1], w.tokens_per_sample
    assert weight_grad_share(embed, tokens) == 1.0 and 0 < weight_grad_share(layer, tokens) <= 0.5


def test_an_moe_layers_weight_share_counts_the_experts_a_token_uses() -> None:
    """tiny-moe (4 experts, top-2): W holds the weight GEMMs of the experts a token is routed to,
    not of all four (which would make a layer's backward all W)."""
    w = load_workload("tiny-moe")
    layer = next(b for b in w.blocks if b.moe is not None)
    share = weight_grad_share(layer, w.tokens_per_sample)
    assert layer.inactive_params > 0 and 0 < share <= 0.5
    assert share == pytest.approx(2 * layer.active_params * w.tokens_per_sample / layer.bwd_flops, rel=1e-12)


@pytest.mark.parametrize("schedule", ["interleaved-zb", "zbv"])
def test_context_parallel_rings_run_in_the_input_gradient_pass(schedule) -> None:
    """With context parallelism a zero-bubble backward's I runs attention's backward with its ring
    collectives and W none: a step issues the ring collectives a whole-backward schedule does."""
    opts = {"workload": "llama-3.1-8b", "layers": 4, "topology": "p5.48xlarge", "nodes": 1, "precision": "bf16",
            "strategy": "pipeline", "pp": 2, "microbatches": 2, "stages_per_rank": 2, "cp": 4,
            "seq_len": 16384}  # fmt: skip
    ring = {}
    for name in (schedule, "interleaved-1f1b"):
        plan = prepare(load_config(None, {**opts, "schedule": name})).plan()
        ring[name] = [op for op in plan.ops if op.stream == "cp"]
        assert not [op.name for op in ring[name] if op.name.endswith(" W")]
    assert len(ring[schedule]) == len(ring["interleaved-1f1b"]) > 0


@given(st.integers(1, 8), st.integers(1, 16))
@settings(derandomize=True, max_examples=40, deadline=None)
def test_held_activations_agree_with_the_single_stage_model(pp: int, m: int) -> None:
    """GPipe holds every microbatch, 1F1B min(pp - r, m) on rank r (PipelinePlanner's counts)."""
    for r in range(pp):
        assert held_activations(rank_order("gpipe", pp, m, 1, r), {r: 1.0}) == m
        assert held_activations(rank_order("1f1b", pp, m, 1, r), {r: 1.0}) == min(pp - r, m)


@given(st.lists(st.integers(1, 9), min_size=1, max_size=7), st.integers(0, 9), st.integers(0, 9), st.integers(1, 7))
@settings(derandomize=True, max_examples=60, deadline=None)
def test_the_auto_split_minimizes_the_slowest_stage(layers: list[int], first: int, last: int, stages: int) -> None:
    """balanced_split's slowest stage is the least of every split (brute force over small cases)."""
    from itertools import combinations

    assume(stages <= len(layers))

    def slowest(counts: list[int]) -> float:
        out, start = 0.0, 0
        for s, c in enumerate(counts):
            extra = (first if s == 0 else 0) + (last if s == len(counts) - 1 else 0)
            out, start = max(out, sum(layers[start : start + c]) + extra), start + c
        return out

    best = min(
        slowest([b - a for a, b in zip((0, *cuts), (*cuts, len(layers)), strict=True)])
        for cuts in combinations(range(1, len(layers)), stages - 1)
    )
    got = balanced_split([float(x) for x in layers], float(first), float(last), stages)
    assert len(got) == stages and sum(got) == len(layers) and min(got) >= 1
    assert slowest(got) == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("schedule", MULTI)
def test_multi_stage_predictions_stay_above_the_sweeps_bound(schedule: str) -> None:
    """The pruned sweep's compute bound is below the simulated step; zero-bubble and interleaved
    schedules leave less idle than 1F1B here (equal stages, small sends)."""
    opts = _opts(schedule, topology="p4d.24xlarge", nodes=1, pp=4, microbatches=8, batch_per_device=2)
    opts["workload"] = "gpt2-xl"
    cfg = load_config(None, opts)
    step = predict(cfg).step_time_s
    assert 0 < compute_bound_s(prepare(cfg)) <= step
    one = predict(load_config(None, {**opts, "schedule": "1f1b", "stages_per_rank": 1})).step_time_s
    assert step < one


def test_auto_settles_a_split_that_spares_the_ends(capsys) -> None:
    """auto: the embedding's and head's stages take fewer layers than the middle ones; the
    prediction names the split it settled."""
    argv = ["predict", "--workload", "gpt2-xl", "--topology", "p4d.24xlarge", "--nodes", "1", "--strategy"]
    argv += ["pipeline", "--pp", "4", "--microbatches", "8", "--layers-per-stage", "auto", "--json"]
    assert main(argv) == 0
    import json

    split = json.loads(capsys.readouterr().out)["config"]["strategy"]["layers_per_stage"]
    counts = [int(x) for x in split.split(",")]
    assert sum(counts) == 48 and counts[-1] < max(counts[1:-1])


@pytest.mark.parametrize(
    ("flags", "field", "words"),
    [
        (["--schedule", "zbv"], "stages_per_rank", "exactly 2 stages"),
        (["--schedule", "interleaved-1f1b"], "stages_per_rank", "with 1 it is 1f1b"),
        (["--schedule", "1f1b", "--stages-per-rank", "2"], "stages_per_rank", "one stage a rank"),
        (
            ["--schedule", "interleaved-zb", "--stages-per-rank", "2", "--pp", "2", "--microbatches", "5"]
            + ["--batch-per-device", "5"],
            "microbatches",
            "rounds",
        ),
        (["--layers-per-stage", "1,2"], "layers_per_stage", "2 layer counts for 4"),
        (["--layers-per-stage", "1,1,1,2"], "layers_per_stage", "sum to 5"),
        (["--layers-per-stage", "1,0,2,1"], "layers_per_stage", "at least 1"),
        (["--schedule", "looped-bfs", "--stages-per-rank", "3"], "stages_per_rank", "exceed the model's 4 layers"),
    ],
)
def test_what_pytorch_refuses_is_one_line_and_exit_2(capsys, flags: list[str], field: str, words: str) -> None:
    argv = ["predict", "--workload", "tiny-gpt", "--topology", "p4d.24xlarge", "--nodes", "1", "--strategy"]
    argv += ["pipeline", "--pp", "4", "--microbatches", "4", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"'{field}'" in err and words in err, err


def test_the_runtime_refuses_what_it_does_not_run() -> None:
    """auto (the simulator's stage times settle it), a zero-bubble schedule with tp or with
    replicated stages; it runs the rest (tied embeddings, tp under the looped schedules)."""
    from shardsim.runtime.schedule_checks import check_runtime_pipeline

    def strategy(**more):
        return load_config(None, _opts(**more)).strategy

    refused = [
        ((strategy(schedule="1f1b", stages_per_rank=1, layers_per_stage="auto"),), "layers_per_stage"),
        ((strategy(schedule="interleaved-zb", tp=2),), "tp"),
        ((strategy(schedule="zbv"), True), "schedule"),
    ]
    for args, field in refused:
        with pytest.raises(ConfigError) as err:
            check_runtime_pipeline(*args)
        assert err.value.field == field
    check_runtime_pipeline(strategy(schedule="zbv"), False)
    check_runtime_pipeline(strategy(schedule="interleaved-1f1b"), True)
    check_runtime_pipeline(strategy(schedule="looped-bfs"), True)
    check_runtime_pipeline(strategy(schedule="interleaved-1f1b", tp=2), True)
    check_runtime_pipeline(strategy(schedule="1f1b", stages_per_rank=1, layers_per_stage="1,3"), True)


def test_the_sweep_spans_schedules_and_stages_per_rank() -> None:
    """Each listed schedule with each listed count PyTorch builds; by default 1 for gpipe and
    1f1b (the sweep's default schedules: unchanged), 2 for the others."""
    from shardsim.config import RunConfig
    from shardsim.sweep.space import SweepSpace, enumerate_configs

    base = RunConfig(workload="tiny-gpt", topology="p4d.24xlarge", nodes=1)
    w = load_workload(base.workload)
    axes = {"strategies": ("pipeline",), "pp": (2,), "degrees": (1,), "microbatches": (4,), "tp_degrees": (1,)}

    def labels(**more) -> list[str]:
        return sorted(c.label for c in enumerate_configs(base, SweepSpace(**axes, **more), w).candidates)

    listed = labels(schedules=("1f1b", "interleaved-1f1b", "zbv"), stages_per_rank=(1, 2))
    assert listed == [
        "pipeline pp=2 m=4 1f1b",
        "pipeline pp=2 m=4 interleaved-1f1b v=2",
        "pipeline pp=2 m=4 zbv v=2",
    ]
    assert labels(schedules=("looped-bfs",)) == ["pipeline pp=2 m=4 looped-bfs v=2"]
    assert labels() == ["pipeline pp=2 m=4 1f1b", "pipeline pp=2 m=4 gpipe"]
    # a base pipeline's auto splits every row so; a list of counts is refused in a sweep
    from shardsim.config import Strategy

    auto = base.replace(strategy=Strategy("pipeline", pp=2, microbatches=4, layers_per_stage="auto"))
    rows = enumerate_configs(auto, SweepSpace(**axes), w).candidates
    assert rows and all(c.cfg.strategy.layers_per_stage == "auto" for c in rows)
    listed_split = base.replace(strategy=Strategy("pipeline", pp=2, microbatches=4, layers_per_stage="1,3"))
    with pytest.raises(ConfigError, match="fits one stage count"):
        enumerate_configs(listed_split, SweepSpace(**axes), w)


def test_looped_bfs_of_one_stage_a_rank_holds_what_gpipe_holds() -> None:
    """looped-bfs with stages_per_rank 1 runs every forward before any backward, as GPipe: the
    same activations at the peak (without checkpointing; with it the multi-stage count holds
    one recomputation's buffer a rank)."""
    opts = _opts("gpipe", topology="p4d.24xlarge", nodes=1, pp=4, microbatches=8, stages_per_rank=1)
    opts |= {"workload": "gpt2-xl", "batch_per_device": 2, "checkpointing": "none"}
    gpipe = prepare(load_config(None, opts)).memory
    looped = prepare(load_config(None, {**opts, "schedule": "looped-bfs"})).memory
    assert looped.activations_gib == pytest.approx(gpipe.activations_gib, rel=1e-12) and gpipe.activations_gib > 0
    full = {**opts, "schedule": "looped-bfs", "checkpointing": "full"}
    assert prepare(load_config(None, full)).memory.activations_gib < looped.activations_gib
