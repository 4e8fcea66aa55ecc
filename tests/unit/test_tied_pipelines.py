"""A pipeline of a model with tied embeddings, as Megatron-LM runs it: the first stage holds the
embedding, the last a copy of it as its output projection, and after backward each rank of the
first stage and its peer of the last sum the embedding's gradient before the optimizer step.
Refused in one line with sharded stages or tensor parallelism (not implemented there)."""

from __future__ import annotations

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


def test_predict_and_the_runtime_take_a_tied_pipeline():
    p = predict(TIED.replace(strategy=PIPE))
    assert p.collectives["all_reduce"] >= 1
    assert n_blocks("gpt2-xl", pipeline=True) == 48


@pytest.mark.parametrize(
    ("strategy", "field"),
    [(Strategy("pipeline", pp=4, microbatches=8, degree=2), "degree"),
     (Strategy("pipeline", pp=2, microbatches=4, tp=2), "tp")],
)  # fmt: skip
def test_sharded_or_tensor_parallel_stages_are_refused_in_one_line(strategy, field):
    cfg = TIED.replace(workload="mpt-7b", strategy=strategy)
    with pytest.raises(ConfigError, match="tied embeddings") as err:
        predict(cfg)
    assert err.value.field == field and "\n" not in str(err.value)


def test_a_sweep_tries_the_tied_pipelines_it_can_run():
    out = enumerate_configs(TIED, SweepSpace(strategies=("pipeline",)))
    kinds = {(c.cfg.strategy.kind, c.cfg.strategy.degree) for c in out.candidates}
    assert ("pipeline", None) in kinds or ("pipeline", 1) in kinds
    assert all((c.cfg.strategy.degree or 1) == 1 for c in out.candidates)
    assert any("tied embeddings" in why for why in out.dropped)
