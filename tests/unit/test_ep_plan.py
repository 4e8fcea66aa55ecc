"""Expert parallelism in the simulator's plan: its all-to-alls against the runtime's, its groups,
and what the degree, the fabric and the imbalance do to a step and to memory."""

from __future__ import annotations

import json

import pytest

from shardsim.cli import main
from shardsim.config import RunConfig
from shardsim.config.load import load_config
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.predict import predict, prepare
from shardsim.simulator.strategies.expert_parallel import ep_groups
from shardsim.simulator.strategies.planners import PLANNERS
from shardsim.specs.parallel_dims import ParallelDims
from shardsim.sweep.space import SweepSpace, enumerate_configs


def _tiny(**keys):
    base = {"topology": "emu-2x2", "nodes": 1, "workload": "tiny-moe", "strategy": "zero", "ep": 2}
    return load_config(None, base | {"checkpointing": "none", "backend": "gloo"} | keys)


def test_the_plans_all_to_alls_are_the_runtimes():
    """tiny-moe (3 MoE layers of 4 experts, top-2; 4 samples of 32 tokens, hidden 64, fp32), zero ep 2
    on 2 ranks: per rank and step 3 exchanges of the 4 int64 counts and 12 of rows (dispatch and
    combine in forward, their reverses in backward), over both ranks 4 x 3 x 2 x 16,384 floats:
    what the runtime's trace records (tests/integration/test_runtime_strategies.py)."""
    p = prepare(_tiny()).plan()
    a2a = [o for o in p.ops if o.coll == "all_to_all"]
    assert all(o.layout is not None and o.layout.size == 2 for o in a2a)
    counts = [o for o in a2a if o.nbytes == 4 * 8]
    rows = [o for o in a2a if o.nbytes != 4 * 8]
    assert len(counts) == 3 and len(rows) == 12
    world = p.classes[0].count
    assert world == 2 and sum(o.nbytes for o in rows) * world == 4 * 3 * 2 * 16_384 * 4


def test_recomputation_repeats_the_forwards_all_to_alls():
    plain = prepare(_tiny()).plan()
    again = prepare(_tiny(checkpointing="full")).plan()
    count = [sum(o.coll == "all_to_all" for o in p.ops) for p in (plain, again)]
    assert count == [15, 15 + 9]


@pytest.mark.parametrize(("r", "d", "e"), [(1, 2, 2), (2, 2, 2), (1, 1, 4), (2, 4, 1)])
def test_the_groups_are_the_meshes(r, d, e):
    dims = ParallelDims(dp_replicate=r, dp_shard=d, ep=e)
    g = ep_groups(dims)

    def same(layout: GroupLayout | None, *names: str) -> bool:
        want = sorted(map(sorted, dims.groups(*names)))
        return layout is not None and sorted(map(sorted, layout.groups().tolist())) == want

    assert same(g.ep, "ep") and same(g.experts, "dp_shard") and same(g.dense, "dp_shard", "ep")
    assert (g.replica is None) == (r == 1) and (r == 1 or same(g.replica, "dp_replicate"))


def _mixtral(**changes) -> RunConfig:
    base = dict(
        workload="mixtral-8x7b", topology="p5.48xlarge", nodes=1, strategy="zero", shape={"layers": 2, "seq_len": 4096}
    )
    return RunConfig(**(base | changes))


def test_imbalance_raises_the_step_monotonically():
    steps = [predict(_mixtral(ep=8, moe_imbalance=i)).step_time_s for i in (1.0, 1.5, 2.0, 4.0)]
    assert steps == sorted(steps) and steps[-1] > steps[0]


def test_memory_falls_with_ep():
    mem = [predict(_mixtral(ep=e)).memory_required_gib for e in (1, 2, 4, 8)]
    assert mem == sorted(mem, reverse=True) and mem[-1] < mem[0]


def test_ep_across_nodes_is_slower_than_inside_one():
    """qwen3-30b-a3b (128 experts) on 2 x p5: ep 16 spans the nodes (EFA), ep 8 stays on NVSwitch."""
    cfg = dict(workload="qwen3-30b-a3b", nodes=2, shape={"layers": 2, "seq_len": 4096})
    inside, across = (predict(_mixtral(**cfg, ep=e)).moe for e in (8, 16))
    assert inside is not None and across is not None
    assert across["all_to_all_s"] > 1.5 * inside["all_to_all_s"]


def test_a_dense_prediction_has_no_all_to_all():
    assert "all_to_all" not in predict(_mixtral(shape={"layers": 2, "seq_len": 4096}, ep=1)).collectives


PIPE = ["--ep", "2", "--strategy", "pipeline", "--pp", "2"]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--ep", "2", "--strategy", "ddp"], "ddp does not shard with FSDP2"),
        (["--ep", "3"], "ep 3 does not divide the model's 4 experts"),
        (PIPE, "degree 1 (DDP stages) has none"),
        ([*PIPE, "--degree", "2", "--schedule", "zbv", "--stages-per-rank", "2"], "zbv schedule (a split backward)"),
    ],
)
def test_predict_refuses_the_rest_in_one_line(flags, says, capsys):
    base = ["predict", "--workload", "tiny-moe", "--topology", "emu-2x2", "--backend", "gloo"]
    assert main([*base, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'ep'" in err and says in err, err


def test_predict_prints_the_moe_layers_all_to_alls(capsys):
    flags = ["--workload", "tiny-moe", "--topology", "emu-2x2", "--backend", "gloo", "--ep", "2", "--json"]
    assert main(["predict", *flags]) == 0
    moe = json.loads(capsys.readouterr().out)["moe"]
    assert moe["ep"] == 2 and moe["all_to_all_s"] > 0 and 0 <= moe["all_to_all_exposed_s"] <= moe["all_to_all_s"]


def test_a_sweep_spans_ep_with_the_kinds_it_composes_with():
    base = _tiny(nodes=2, ep=1)
    space = SweepSpace(strategies=("ddp", "zero", "zero2d"), ep=(1, 2, 4), tp_degrees=(1,))
    found = {c.label: c for c in enumerate_configs(base, space).candidates}
    labels = set(found)
    assert {"zero ep=2", "zero ep=4", "zero2d d=2 ep=2"} <= labels and "ddp" in labels
    assert not any("ep=" in label for label in labels if label.startswith("ddp"))
    assert "zero2d d=2 ep=4" not in labels  # ep divides the shard degree
    assert {c.label for c in enumerate_configs(base, SweepSpace(strategies=("zero",), tp_degrees=(1,))).candidates} == {
        "zero"
    }
    assert predict(found["zero ep=2"].cfg).moe["ep"] == 2  # type: ignore[index]


def test_imbalance_raises_an_expert_parallel_step_on_the_roofline_too():
    """On CPUs (no kernel figures) a block costs the mean load; with EP the busiest rank's experts set the pace."""
    steps = [predict(_tiny(moe_imbalance=i)).step_time_s for i in (1.0, 1.5, 2.0)]
    assert steps[0] < steps[1] < steps[2]


def test_a_sweep_spans_the_imbalance_as_a_what_if():
    space = SweepSpace(strategies=("zero",), ep=(2,), tp_degrees=(1,), moe_imbalances=(1.0, 2.0))
    labels = [c.label for c in enumerate_configs(_tiny(), space).candidates]
    assert labels == ["zero ep=2", "zero ep=2, imbalance 2"]


@pytest.mark.parametrize("given", ["1,0.5", "1,1e30", "1,nan"])
def test_a_sweeps_imbalances_are_bounded_in_one_line(given, capsys):
    with pytest.raises(SystemExit) as out:
        main(["sweep", "--workload", "tiny-moe", "--moe-imbalance", given])
    err = capsys.readouterr().err
    assert out.value.code == 2 and err.count("\n") == 1 and "--moe-imbalance" in err, err


def test_the_dispatch_sends_the_busiest_rank_its_share():
    """tiny-moe at imbalance 2: the busiest expert takes 2/4 of the rows, the others 1/6 each, so the
    EP rank holding it and one other receives 2/3 of all rows: every rank sends it 2/3 of its own."""
    p = prepare(_tiny(moe_imbalance=2.0, checkpointing="full")).plan()
    ops = [o for o in p.ops if o.coll == "all_to_all" and o.nbytes > 32]
    assert len(ops) == 3 * 6 and len({o.nbytes for o in ops}) == 1  # forward, recomputation, backward: 2 each
    for o in ops:
        assert o.exchange is not None
        shares = o.exchange.matrix()
        to_experts = "dispatch " in o.name or "combine'" in o.name  # the dispatch, and the combine's reverse
        sent = shares if to_experts else shares.T
        assert sent[:, 0] == pytest.approx([2 / 3, 2 / 3]) and sent.sum(axis=1) == pytest.approx([1, 1])


def test_the_plans_size_is_within_its_estimate():
    cfg = _tiny(checkpointing="full", grad_accum=2)
    p = prepare(cfg).plan()
    assert len(p.ops) <= PLANNERS["zero"].ops_estimate(cfg.strategy, 2, 3)


def test_the_shared_expert_runs_while_the_combine_is_in_flight():
    """deepseek-v3 (a shared expert; its first 3 layers dense) on one p5: torchtitan's MoE.forward runs
    the shared expert after the routed experts, before it waits for their combine."""
    cfg = load_config(None, {"workload": "deepseek-v3", "topology": "p5.48xlarge", "nodes": 1, "ep": 8})
    cfg = cfg.replace(shape=cfg.shape.__class__(layers=4, seq_len=4096))
    p = prepare(cfg).plan()
    shared = next(o for o in p.ops if o.name.endswith("shared expert"))
    combine = next(o for o in p.ops if o.name.startswith("A2A combine F"))
    after = next(o for o in p.ops if shared.id in o.deps and combine.id in o.deps)
    assert combine.id not in shared.deps and shared.duration > 0 and after.name.endswith("un-permute")
