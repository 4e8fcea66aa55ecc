"""A pipeline of a model with tied embeddings, as Megatron-LM runs it: the first stage holds the
embedding, the last a copy of it as its output projection, and after backward each rank of the
first stage and its peer of the last (the same dp / tp coordinates) sum their shard of the
embedding's gradient before the optimizer step: the vocabulary rows of a tensor-parallel rank,
FSDP2's shard of those on sharded stages. Refused in one line with context parallelism."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from shardsim.config import RunConfig, Strategy, resolve
from shardsim.core.errors import ConfigError
from shardsim.runtime.models.build import n_blocks
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.predict import predict
from shardsim.simulator.strategies.build import build_plan
from shardsim.simulator.strategies.steps import rank_classes
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.model.blocks import from_arch
from shardsim.sweep.space import SweepSpace, enumerate_configs

TIED = RunConfig(workload="gpt2-xl", topology="g4dn.12xlarge", nodes=4, precision="fp16", batch_per_device=2)
PIPE = Strategy("pipeline", pp=4, microbatches=8)


def planned(cfg: RunConfig, w):
    cfg, res = resolve(cfg, 16, len(w.layers), tied_embeddings=w.tied_embeddings, arch=w.arch)
    cm = ComputeModel(make_cluster(cfg.topology, cfg.nodes).instance.device, cfg.precision)
    return build_plan(cfg, res, w, cm), res


def test_the_first_and_last_stage_sum_the_embedding_gradient_before_their_optimizer_steps():
    w = load_workload("gpt2-xl")
    plan, res = planned(TIED.replace(strategy=PIPE), w)
    (ar,) = [op for op in plan.ops if op.name == "AR tied embedding grad"]
    a = w.arch
    assert ar.coll == "all_reduce" and ar.nbytes == a.vocab * a.hidden * 4  # fp32 gradients
    R = res.world // res.pp
    assert ar.layout.groups().tolist() == [[i, 3 * R + i] for i in range(R)]
    steps = {op.rank_class: op for op in plan.ops if op.kind == "optimizer"}
    assert ar.id in steps[0].deps and ar.id in steps[3].deps
    assert ar.id not in steps[1].deps and ar.id not in steps[2].deps


def test_the_last_stage_holds_the_copy_as_an_untied_head_holds_its_matrix():
    tied = load_workload("gpt2-xl")
    untied = from_arch("gpt2-xl", replace(tied.arch, tied_embeddings=False))
    _, res = planned(TIED.replace(strategy=PIPE), tied)
    t = [rc.params for rc, _ in rank_classes(res, tied, pipeline=True)]
    u = [rc.params for rc, _ in rank_classes(res, untied, pipeline=True)]
    assert t == u and t[3] > t[2]
    assert tied.params < untied.params  # the model itself holds the matrix once
    whole = rank_classes(replace(res, dims=res.dims.replace(pp=1)), tied, pipeline=True)  # one stage: no copy
    assert whole[0][0].params == tied.params


def test_a_v_shaped_schedule_holds_the_embedding_once_on_rank_0_and_sums_nothing():
    tied = load_workload("gpt2-xl")
    untied = from_arch("gpt2-xl", replace(tied.arch, tied_embeddings=False))
    plan, res = planned(
        TIED.replace(strategy=Strategy("pipeline", pp=4, microbatches=8, schedule="zbv", stages_per_rank=2)), tied
    )
    assert not [op for op in plan.ops if op.name == "AR tied embedding grad"]
    t = [rc.params for rc, _ in rank_classes(res, tied, pipeline=True)]
    u = [rc.params for rc, _ in rank_classes(res, untied, pipeline=True)]
    assert t[0] == u[0] - tied.arch.vocab * tied.arch.hidden and t[1:] == u[1:]  # rank 0: stages 0 and 7


def test_predict_and_the_runtime_take_a_tied_pipeline():
    p = predict(TIED.replace(strategy=PIPE))
    assert p.collectives["all_reduce"] >= 1
    assert n_blocks("gpt2-xl", pipeline=True) == 48


MPT = TIED.replace(workload="mpt-7b")  # tied, 32 heads: tensor parallel up to 8


def per_rank(name: str, tp: int):
    """The workload as one of `tp` tensor-parallel ranks runs it."""
    w = load_workload(name)
    return from_arch(name, w.arch, tp=tp)


def tied_all_reduce(cfg: RunConfig):
    """(the plan's tied all-reduce, the resolved sizes, the per-rank workload) of `cfg` on 16 ranks."""
    w = per_rank(cfg.workload, cfg.strategy.tp)
    plan, res = planned(cfg, w)
    (ar,) = [op for op in plan.ops if op.name == "AR tied embedding grad"]
    return ar, res, w


@pytest.mark.parametrize(("pp", "tp", "degree"), [(2, 2, 1), (4, 1, 2), (2, 2, 4)], ids=["tp2", "fsdp2", "tp2-fsdp4"])
def test_the_embedding_group_sums_each_ranks_shard_of_the_gradient(pp, tp, degree):
    strategy = Strategy("pipeline", pp=pp, microbatches=2 * pp, tp=tp, degree=degree)
    ar, res, w = tied_all_reduce(MPT.replace(strategy=strategy))
    a = w.arch
    rows = math.ceil(math.ceil(a.vocab / tp) / degree)  # vocabulary-parallel rows, FSDP2's dim-0 shard of them
    assert ar.coll == "all_reduce" and ar.nbytes == rows * a.hidden * 4  # fp32 gradient shards
    pp_groups = res.dims.groups("pp")  # the ranks of one dp / tp coordinate, stage by stage
    assert sorted(ar.layout.groups().tolist()) == sorted([g[0], g[-1]] for g in pp_groups)
    assert len(pp_groups) == res.world // res.pp


def test_the_copy_is_a_tensor_parallel_ranks_rows_and_sharded_with_its_stage():
    cfg = MPT.replace(strategy=Strategy("pipeline", pp=2, microbatches=4, tp=2, degree=4))
    w = per_rank("mpt-7b", 2)
    _, res = planned(cfg, w)
    untied = from_arch("mpt-7b", replace(w.arch, tied_embeddings=False), tp=2)
    t = [rc for rc, _ in rank_classes(res, w, pipeline=True)]
    u = [rc for rc, _ in rank_classes(res, untied, pipeline=True)]
    assert [rc.params for rc in t] == [rc.params for rc in u]  # the copy's rows as an untied head's
    assert t[1].local_params == t[1].params / 4  # sharded with the stage
    head, untied_head = (rank_classes(res, x, pipeline=True)[1][1][-1] for x in (w, untied))
    assert head.dtensor_params == untied_head.dtensor_params > 0  # the copy is a DTensor as the embedding is


TINY = "{family: gpt, hidden: 64, layers: 4, heads: 4, ffn: 256, seq_len: 32, vocab: 256, tied_embeddings: %s}"


@pytest.mark.parametrize(("tp", "degree"), [(2, 1), (1, 2), (2, 4)], ids=["tp2", "fsdp2", "tp2-fsdp4"])
def test_a_tied_pipeline_predicts_one_all_reduce_more_than_the_untied_model(tp, degree):
    """What the sum costs, end to end: one all-reduce more than the untied model, and time."""
    strategy = Strategy("pipeline", pp=2, microbatches=4, tp=tp, degree=degree)
    tied, untied = (predict(TIED.replace(workload=TINY % t, strategy=strategy)) for t in ("true", "false"))
    assert tied.collectives["all_reduce"] == untied.collectives["all_reduce"] + 1
    assert tied.step_time_s > untied.step_time_s


def test_context_parallel_tied_pipelines_are_refused_in_one_line():
    arch = (
        "{family: llama, hidden: 256, layers: 4, heads: 4, ffn: 512, vocab: 1024, seq_len: 256, tied_embeddings: true}"
    )
    cfg = TIED.replace(workload=arch, precision="fp32", strategy=Strategy("pipeline", pp=2, microbatches=4, cp=2))
    with pytest.raises(ConfigError, match="tied embeddings") as err:
        predict(cfg)
    assert err.value.field == "cp" and "\n" not in str(err.value)


def test_a_sweep_tries_sharded_tied_pipelines():
    out = enumerate_configs(TIED, SweepSpace(strategies=("pipeline",)))
    degrees = {c.cfg.strategy.degree or 1 for c in out.candidates}
    assert 1 in degrees and max(degrees) > 1
    assert not any("tied embeddings" in why for why in out.dropped)
