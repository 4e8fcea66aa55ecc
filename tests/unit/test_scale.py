"""How far the simulator goes: a 16,384-GPU prediction in seconds and well
under 2 GB; beyond the stated bounds a one-line refusal before any work; the sweep's memory
held in bounds; the shortcuts change no result."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from shardsim.cli import main
from shardsim.config import RunConfig, Strategy, load_config, resolve
from shardsim.simulator.network import collectives
from shardsim.simulator.network.collectives import Algo, GroupLayout, _PlanCache
from shardsim.simulator.network.fluid import Route
from shardsim.simulator.network.linkgroups import group_links
from shardsim.simulator.network.links import build_links
from shardsim.simulator.predict import prepare
from shardsim.simulator.scale import MAX_PLAN_OPS, plan_ops_estimate
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.bounds import MAX_WORLD
from shardsim.specs.hardware.topology import make_cluster
from shardsim.sweep.search import sweep
from shardsim.sweep.space import SweepSpace, enumerate_configs

# one fresh interpreter per configuration: its peak RSS is the prediction's, not pytest's
_MEASURE = """
import json, resource, sys, time
from shardsim.config import load_config
from shardsim.simulator.predict import predict
over = json.loads(sys.argv[1])
cfg = load_config(None, over)
t = time.perf_counter()
p = predict(cfg)
print(json.dumps({"s": time.perf_counter() - t, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "world": p.world, "step": p.step_time_s}))
"""

P5_16K = {"topology": "p5.48xlarge", "nodes": 2048}  # 16,384 H100s


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy",
    [
        {"strategy": "zero"},  # the seed workload's strategy: a hierarchical all-gather over every rank
        # 32 sharded stages: 32 x 4 layouts of 512 ranks each, 12k ops
        {"strategy": "pipeline", "pp": 32, "degree": 8, "microbatches": 64, "schedule": "1f1b"},
        # the 3D layout: tensor parallel 8 in each node, 8 stages, FSDP2 over groups of 8 of the 256
        # data-parallel ranks; 21k ops (0.5 s / 95 MiB measured)
        {
            "workload": "llama-3.1-70b",
            "precision": "bf16",
            "seq_len": 4096,
            "batch_per_device": 2,
            "strategy": "pipeline",
            "pp": 8,
            "degree": 8,
            "microbatches": 16,
            "tp": 8,
            "sequence_parallel": True,
        },
    ],
    ids=["zero", "pipeline-32-sharded", "tp8-pp8-dp256"],
)
@pytest.mark.serial  # a wall-clock promise
def test_a_16384_gpu_prediction_takes_seconds_and_well_under_2_gb(strategy) -> None:
    """docs/simulator.md ("How far it goes"): 16,384 GPUs predicted within 5 s and 2 GB."""
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, json.dumps({**P5_16K, **strategy})], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["world"] == 16384 and got["step"] > 0
    assert got["s"] < 5.0, got
    assert got["rss_mib"] < 2048, got


def test_beyond_the_world_bound_predict_refuses_in_one_line_before_any_work(capsys, monkeypatch) -> None:
    import shardsim.simulator.predict as predict_module

    monkeypatch.setattr(predict_module, "build_plan", lambda *a, **k: pytest.fail("planned beyond the bound"))
    assert main(["predict", "--nodes", "65536"]) == 2  # 262,144 T4s
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{MAX_WORLD:,} devices" in err and "262,144" in err, err


def test_beyond_the_plan_bound_predict_refuses_in_one_line(capsys, monkeypatch) -> None:
    import shardsim.simulator.predict as predict_module

    monkeypatch.setattr(predict_module, "build_plan", lambda *a, **k: pytest.fail("planned beyond the bound"))
    assert main(["predict", "--grad-accum", "1000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{MAX_PLAN_OPS:,}" in err and "grad_accum" in err, err


def test_collective_refuses_beyond_the_world_bound(capsys) -> None:
    assert main(["collective", "--nodes", "65536"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{MAX_WORLD:,} devices" in err, err


def test_a_sweep_beyond_the_bound_refuses_and_one_that_spans_it_says_what_it_left_out(capsys) -> None:
    assert main(["sweep", "--workload", "tiny-gpt", "--nodes", "65536", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{MAX_WORLD:,} devices" in err, err
    space = SweepSpace(strategies=("ddp",), nodes=(1, 100000), tp_degrees=(1,))  # a row a cluster kept
    result = sweep(RunConfig(workload="tiny-gpt"), space, workers=1)
    df, skipped = result.table, result.skipped
    assert df["nodes"].tolist() == [1]
    assert len(skipped) == 1 and "100000 x g4dn.12xlarge" in skipped[0] and f"{MAX_WORLD:,}" in skipped[0]


@pytest.mark.parametrize("workload", ["tiny-gpt", "vit-630m", "gpt2-xl"])
def test_the_plan_size_estimate_is_within_four_times_the_plan(workload) -> None:
    from shardsim.simulator.compute import ComputeModel
    from shardsim.simulator.predict import rank_workload
    from shardsim.simulator.strategies.build import build_plan

    base = RunConfig(workload=workload, topology="g4dn.12xlarge", nodes=4, grad_accum=2, batch_per_device=8)
    w = load_workload(base.workload, base.shape, base.source)
    n_layers = len(w.layers)
    space = SweepSpace(microbatches=(4, 32), tp_degrees=(1, 2, 4), sequence_parallel=(False, True))
    configs = [c.cfg for c in enumerate_configs(base, space).candidates]
    assert len({c.strategy.kind for c in configs}) == 4  # a tied model's pipelines too (unsharded stages)
    assert {c.strategy.tp for c in configs} == ({1} if w.arch.heads % 2 else {1, 2, 4})  # gpt2-xl: 25 heads
    for cfg in configs:
        cfg, res = resolve(cfg, 16, n_layers, tied_embeddings=w.tied_embeddings, arch=w.arch)
        cluster = make_cluster(cfg.topology, cfg.nodes)
        cm = ComputeModel(cluster.instance.device, cfg.precision, None, cfg.optimizer_impl, w.arch, tp=res.tp)
        ranks_w = rank_workload(w, res.tp, cfg.strategy.sequence_parallel)
        ops = len(build_plan(cfg, res, ranks_w, cm).ops)
        est = plan_ops_estimate(cfg, n_layers)
        assert ops <= est <= 4 * ops, (cfg.strategy.label(), ops, est)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-zb", "zbv"])
def test_the_estimate_bounds_a_context_parallel_pipeline(schedule) -> None:
    """Ring attention's ops in every pass of a pipeline, zero-bubble ones split in I and W."""
    opts = {"workload": "llama-3.1-8b", "layers": 8, "topology": "p5.48xlarge", "nodes": 2, "precision": "bf16",
            "strategy": "pipeline", "pp": 2, "microbatches": 4, "batch_per_device": 2, "schedule": schedule,
            "stages_per_rank": 1 if schedule == "1f1b" else 2, "cp": 8, "tp": 1, "seq_len": 65536}  # fmt: skip
    pre = prepare(load_config(None, opts))
    ops = len(pre.plan().ops)
    est = plan_ops_estimate(pre.cfg, 8)
    assert ops <= est <= 4 * ops, (ops, est)


def test_the_plan_cache_keeps_its_arrays_within_its_budget() -> None:
    g = build_links(make_cluster("p4d.24xlarge", 64))  # 512 ranks
    cache = _PlanCache(budget=50_000)
    layouts = [GroupLayout(0, 512, d) for d in (2, 4, 8, 16, 32, 64, 128, 256, 512)]
    for lay in layouts:
        phases = cache(g, "all_gather", lay, Algo("ring", "Simple"), "nccl", 1e6)
        fresh = collectives._phases(g, "all_gather", lay, Algo("ring", "Simple"), "nccl", 1e6, None)
        assert [(p.links.tolist(), p.load.tolist()) for p in phases] == [
            (p.links.tolist(), p.load.tolist()) for p in fresh
        ]
        assert cache.nbytes <= 50_000 or len(cache.entries) == 1
    assert 1 <= len(cache.entries) < len(layouts)  # the least recently used went
    assert cache(g, "all_gather", layouts[-1], Algo("ring", "Simple"), "nccl", 1e6) is phases  # the latest is kept


def _group_links_python(capacity: np.ndarray, routes: list[Route]) -> tuple[list[float], list[tuple]]:
    """Signatures as tuples, sorted in Python: the definition, for routes of any length."""
    n = len(routes)
    sig: dict[int, list[float]] = {}
    for r, route in enumerate(routes):
        for link, u in zip(route.links, route.unit, strict=True):
            sig.setdefault(link, [float(capacity[link])] + [0.0] * n)[r + 1] = u
    order = {k: i for i, k in enumerate(sorted({tuple(s) for s in sig.values()}))}
    gid = {link: order[tuple(s)] for link, s in sig.items()}
    out = []
    for route in routes:
        first: dict[int, float] = {}
        for link, u in zip(route.links, route.unit, strict=True):
            first.setdefault(gid[link], u)
        out.append((tuple(sorted(first)), tuple(first[k] for k in sorted(first))))
    return [k[0] for k in order], out


def test_grouping_the_links_of_a_big_cluster_equals_the_definition() -> None:
    g = build_links(make_cluster("p5.48xlarge", 64))  # 512 H100s, 32 NICs per node
    routes = []
    for coll, lay, algo in [
        ("all_gather", GroupLayout(0, 512, 512), "hierarchical"),
        ("reduce_scatter", GroupLayout(0, 512, 64), "ring"),
        ("all_reduce", GroupLayout(0, 512, 8, strided=True), "ring"),
        ("all_reduce", GroupLayout(0, 512, 512), "tree"),
        ("send_recv", GroupLayout(0, 256, 2, strided=True), "ring"),
    ]:
        routes += [ph.route for ph in collectives.plan(g, coll, lay, algo, "nccl")]
    caps, got = group_links(g.capacity, routes)
    want_caps, want = _group_links_python(g.capacity, routes)
    assert caps.tolist() == want_caps
    assert [(r.links, r.unit) for r in got] == want
    assert len(caps) < 40  # thousands of links, a few dozen resources


def test_a_big_prediction_is_the_same_through_array_routes(monkeypatch) -> None:
    """The engine hands group_links arrays; as Routes the result is the same."""
    import shardsim.simulator.engine as engine
    from shardsim.simulator.predict import predict

    cfg = RunConfig(topology="p4d.24xlarge", nodes=32, strategy=Strategy("zero2d", degree=16))
    fast = predict(cfg)
    real = engine.group_links
    monkeypatch.setattr(engine, "group_links", lambda cap, rs: real(cap, [Route.of(*r) for r in rs]))
    assert predict(cfg).to_dict() == fast.to_dict()
