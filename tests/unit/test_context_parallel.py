"""Context parallelism (`cp`): what it refuses, where its ranks sit in the mesh, and what a rank
holds and computes against cp 1 (a cp-th of the activations and of the work)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.cli import main
from shardsim.config import RunConfig, Strategy, load_config, resolve
from shardsim.core.errors import ConfigError
from shardsim.runtime.stack import check_runtime_stack
from shardsim.simulator.bounds import compute_bound_s
from shardsim.simulator.predict import chain_bound_s, predict, prepare, rank_workload
from shardsim.simulator.scale import plan_ops_estimate
from shardsim.simulator.strategies.mesh import StageMesh
from shardsim.specs.hardware.topology import Cluster
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.parallel_dims import ORDERS, ParallelDims
from shardsim.sweep.space import SweepSpace, enumerate_configs
from tests.helpers import instance

LLAMA = Arch("llama", hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, seq_len=64, vocab=256)
GPT = ["--workload", "tiny-gpt", "--topology", "g4dn.12xlarge", "--nodes", "1"]  # 4 GPUs, 32 tokens


@pytest.mark.parametrize(
    ("flags", "field", "says"),
    [
        (["--cp", "3"], "cp", "cp 3 does not divide the world size 4"),
        (["--cp", "2", "--tp", "4"], "cp", "tp 4 x cp 2 does not divide the world size 4"),
        (["--cp", "2", "--strategy", "ddp"], "cp", "ddp does not shard with FSDP2"),
        (["--cp", "2", "--strategy", "zero1"], "cp", "zero1 does not shard with FSDP2"),
        (["--cp", "2", "--seq-len", "30"], "cp", "2 x cp = 4 chunks: it does not divide the 30 tokens"),
        (["--cp", "2", "--workload", "bert-large"], "cp", "needs causal attention; bert attends bidirectionally"),
        (["--cp", "2", "--workload", "tiny-vit"], "cp", "vit has no sequence of tokens"),
        (["--cp", "2", "--workload", "tiny-mlp"], "cp", "mlp has no sequence of tokens"),
        (["--cp", "2", "--attention", "math"], "attention", "not math"),
        (
            ["--cp", "2", "--nodes", "2", "--tp", "4", "--sequence-parallel", "--seq-len", "36"],
            "sequence_parallel",
            "18 tokens over tp 4",
        ),
        (["--cp-rotate", "alltoall"], "cp_rotate", "cp_rotate applies with cp > 1"),
        (
            ["--cp", "2", "--workload", "gpt2-xl", "--strategy", "pipeline", "--pp", "2", "--microbatches", "2"],
            "cp",
            "a pipeline of a model with tied embeddings is planned with cp 1 only",
        ),
    ],
)
def test_refused_in_one_line(flags: list[str], field: str, says: str, capsys) -> None:
    assert main(["predict", *GPT, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"field '{field}'" in err and says in err, err


def test_the_runtime_refuses_it() -> None:
    cfg = RunConfig(workload=LLAMA, strategy=Strategy("zero", cp=2), backend="gloo")
    with pytest.raises(ConfigError, match="context parallelism") as exc:
        check_runtime_stack(cfg, on_gpu=False, sharded=True)
    assert exc.value.field == "cp"


def test_a_config_file_key_and_the_label(tmp_path, capsys) -> None:
    path = tmp_path / "cp.yaml"
    path.write_text(
        "workload: tiny-gpt\ntopology: g4dn.12xlarge\nnodes: 1\nstrategy: zero\ncp: 2\ncp_rotate: alltoall\n"
    )
    assert main(["predict", str(path), "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["strategy"]["cp"] == 2 and pred["label"] == "zero cp=2 alltoall"
    assert pred["config"]["strategy"]["cp"] == 2 and pred["config"]["strategy"]["cp_rotate"] == "alltoall"


def test_without_it_a_configuration_reads_as_before() -> None:
    dumped = Strategy("zero").model_dump()
    assert "cp" not in dumped and "cp_rotate" not in dumped  # unchanged files and cache keys


def test_resolve_shards_over_dp_shard_times_cp_and_splits_the_batch_over_dp() -> None:
    cfg = RunConfig(workload=LLAMA, strategy=Strategy("zero2d", degree=2, cp=2, tp=2), batch_per_device=3)
    _, res = resolve(cfg, 16, LLAMA.layers, arch=LLAMA, devices_per_node=8)
    d = res.dims
    assert (d.dp_replicate, d.dp_shard, d.cp, d.tp) == (2, 2, 2, 2)
    assert res.shard == 4  # FSDP over dp_shard x cp
    assert res.global_batch == 3 * 4  # batch_per_device x the data-parallel ranks (world / tp / cp)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    pp=st.sampled_from([1, 2]),
    rep=st.sampled_from([1, 2, 3]),
    shard=st.sampled_from([1, 2]),
    cp=st.sampled_from([1, 2, 4]),
    tp=st.sampled_from([1, 2]),
    order=st.sampled_from(sorted(ORDERS)),
)
def test_the_plans_groups_are_the_meshs(pp: int, rep: int, shard: int, cp: int, tp: int, order: str) -> None:
    """The network's groups of each stage (`StageMesh.groups`) are the device mesh's: cp groups,
    FSDP's over dp_shard x cp (torchtitan's dp_shard_cp), the replicas across them."""
    dims = ParallelDims(pp=pp, dp_replicate=rep, dp_shard=shard, cp=cp, tp=tp, mesh_order=order)
    for stage in range(pp):
        m = StageMesh(dims, stage)

        def mine(names: tuple[str, ...], m: StageMesh = m) -> set[tuple[int, ...]]:
            stage_ranks = range(m.start, m.start + m.count)
            return {tuple(sorted(g)) for g in dims.groups(*names) if g[0] in stage_ranks}

        def layout(*names: str, m: StageMesh = m) -> set[tuple[int, ...]]:
            return {tuple(sorted(int(r) for r in g)) for g in m.groups(*names).groups()}

        assert layout("cp") == mine(("cp",))
        assert layout("dp_shard") == mine(("dp_shard", "cp"))
        assert layout("dp_replicate") == mine(("dp_replicate",))


def test_a_cp_group_of_consecutive_ranks_beside_tp() -> None:
    dims = ParallelDims(dp_shard=2, cp=4, tp=2)  # torchtitan's order: pp, dp_replicate, dp_shard, cp, tp
    assert dims.group(0, "cp") == (0, 2, 4, 6)
    assert dims.group(0, "dp_shard", "cp") == (0, 2, 4, 6, 8, 10, 12, 14)
    assert dims.within_node(8, "cp") and not dims.within_node(4, "cp")


@pytest.mark.parametrize("tp", [1, 2])
def test_a_rank_holds_the_model_and_a_cp_th_of_the_work(tp: int) -> None:
    w = from_arch("m", LLAMA)
    one = rank_workload(w, tp, tp > 1)
    for cp in (2, 4):
        rank = rank_workload(w, tp, tp > 1, cp=cp)
        assert rank.params == one.params
        assert [b.params for b in rank.blocks] == [b.params for b in one.blocks]
        # load-balanced causal ring attention: every FLOP a cp-th, attention's rounds included
        for mine, whole in zip(rank.blocks, one.blocks, strict=True):
            assert mine.fwd_flops * cp == pytest.approx(whole.fwd_flops, rel=1e-12)
            assert mine.bwd_flops * cp == pytest.approx(whole.bwd_flops, rel=1e-12)
            assert mine.act_elems * cp == pytest.approx(whole.act_elems, rel=1e-12)


def _prepared(cp: int, checkpointing: str = "none"):
    cfg = RunConfig(workload=LLAMA, strategy=Strategy("zero", cp=cp), batch_per_device=2, checkpointing=checkpointing)
    return prepare(cfg, cluster=Cluster(instance(devices=8), 1))


def _compute_s(s) -> float:
    """Seconds of the compute ops of a step's plan (what the ranks compute, before the engine)."""
    return sum(o.duration for o in s.plan().ops if o.kind == "compute")


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_activations_and_compute_per_rank_scale_as_one_over_cp(checkpointing: str) -> None:
    base = _prepared(1, checkpointing)
    for cp in (2, 4):
        s = _prepared(cp, checkpointing)
        assert s.memory.activations_gib * cp == pytest.approx(base.memory.activations_gib, rel=1e-9)
        assert s.memory.params_gib == pytest.approx(base.memory.params_gib, rel=1e-12)  # over 8 ranks both
        # the roofline device: a rank computes a cp-th (its samples, a cp-th of their tokens)
        assert _compute_s(s) * cp == pytest.approx(_compute_s(base), rel=1e-9)
        assert s.res.global_batch * cp == base.res.global_batch


def test_the_rotate_methods_differ_in_what_they_issue() -> None:
    cfg = RunConfig(workload=LLAMA, strategy=Strategy("zero", cp=4, cp_rotate="alltoall"), checkpointing="none")
    p = predict(cfg, cluster=Cluster(instance(devices=8), 1))
    # per layer: forward 3 K/V passes, backward 3 K/V passes and 4 gradient passes
    assert p.collectives["send_recv"] == LLAMA.layers * (3 + 3 + 4)


def test_the_sweep_axis() -> None:
    base = RunConfig(workload="tiny-gpt", topology="g4dn.12xlarge", nodes=2)
    default = enumerate_configs(base, SweepSpace(tp_degrees=(1,)))
    assert all(c.cfg.strategy.cp == 1 for c in default.candidates)
    both = enumerate_configs(base, SweepSpace(tp_degrees=(1,), cp=(1, 2)))
    with_cp = [c for c in both.candidates if c.cfg.strategy.cp == 2]
    assert with_cp and len(both.candidates) == len(default.candidates) + len(with_cp)
    assert {c.cfg.strategy.kind for c in with_cp} == {"zero", "zero2d", "pipeline"}  # not ddp: refused
    assert all(" cp=2" in c.label for c in with_cp)
    assert not both.dropped


def test_prepare_gives_the_kernels_a_cp_th_of_the_sequence() -> None:
    cfg = RunConfig(workload=LLAMA, strategy=Strategy("zero", cp=4))
    s = prepare(cfg, cluster=Cluster(instance(devices=8), 1))
    assert s.compute.arch is not None and s.compute.arch.seq_len == LLAMA.seq_len // 4 and s.compute.cp == 4


@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("rotate", ["allgather", "alltoall"])
@pytest.mark.parametrize(
    "strategy",
    [
        Strategy("zero", cp=2),
        Strategy("zero2d", degree=2, cp=4, tp=2, sequence_parallel=True),
        Strategy("pipeline", pp=2, microbatches=4, cp=2),
        Strategy("pipeline", pp=2, microbatches=2, cp=2, tp=2),
    ],
    ids=["zero", "zero2d-tp", "pipeline", "pipeline-tp"],
)
def test_the_plan_size_estimate_is_within_four_times_the_plan(
    strategy: Strategy, rotate: str, checkpointing: str
) -> None:
    cfg = RunConfig(
        workload=LLAMA,
        strategy=strategy.replace(cp_rotate=rotate),
        batch_per_device=4,
        grad_accum=2,
        checkpointing=checkpointing,
    )
    cfg, res = resolve(cfg, 32, LLAMA.layers, arch=LLAMA, devices_per_node=8)
    s = prepare(cfg, cluster=Cluster(instance(devices=8), 4))
    ops = len(s.plan().ops)
    assert ops <= plan_ops_estimate(cfg, LLAMA.layers) <= 4 * ops


def test_the_sweeps_bounds_stay_below_every_context_parallel_step() -> None:
    """The pruned search is exact only if its bounds are below every step: with cp's rounds and
    ring collectives too (both rotate methods, with tensor parallelism and pipelines)."""
    base = RunConfig(workload="tiny-gpt", topology="p4d.24xlarge", nodes=2, precision="bf16")
    space = SweepSpace(strategies=("zero", "zero2d", "pipeline"), cp=(2, 4), tp_degrees=(1, 2))
    candidates = [c for c in enumerate_configs(base, space).candidates if c.cfg.strategy.cp > 1]
    assert {c.cfg.strategy.spec.is_pipeline for c in candidates} == {False, True}
    for c in candidates[::2]:
        for rotate in ("allgather", "alltoall"):
            cfg = c.cfg.replace(strategy=c.cfg.strategy.replace(cp_rotate=rotate))
            s = prepare(cfg, cluster=c.cluster)
            step = predict(cfg, cluster=c.cluster).step_time_s
            assert 0 < compute_bound_s(s) <= step * (1 + 1e-12), c.label
            assert 0 < chain_bound_s(s) <= step * (1 + 1e-12), c.label


def test_sagemaker_context_parallel_degree_is_cp(tmp_path) -> None:
    """SageMaker model parallelism v2's context_parallel_degree lands on cp, as its
    recommendation writes it back (`sweep.recommendation`)."""
    p = tmp_path / "smp.yaml"
    p.write_text(
        "workload: llama-3.1-8b\nseq_len: 8192\ndistribution:\n  torch_distributed: {enabled: true}\n"
        "  smdistributed:\n    modelparallel:\n      enabled: true\n"
        "      parameters: {hybrid_shard_degree: 8, context_parallel_degree: 2}\n"
    )
    cfg = load_config(p)
    assert cfg.strategy.cp == 2 and cfg.strategy.degree == 8
    p.write_text(p.read_text().replace("context_parallel_degree: 2", "context_parallel_degree: 0"))
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert err.value.field == "context_parallel_degree"
