"""Tensor parallelism in the simulator: one rank's shards of the model, the collectives of its
plan on the tensor-parallel groups, the mesh, and the refusals of what cannot work."""

from __future__ import annotations

import numpy as np
import pytest

from shardsim.config import RunConfig, Strategy, resolve
from shardsim.core.errors import ConfigError
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.predict import predict, rank_workload
from shardsim.simulator.strategies.build import build_plan
from shardsim.simulator.strategies.mesh import StageMesh
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.parallel_dims import ParallelDims

LLAMA = {"workload": "llama-3.1-70b", "topology": "p5.48xlarge", "precision": "bf16", "shape": {"seq_len": 4096}}


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("tp", [2, 8])
def test_a_rank_holds_a_tp_th_of_the_weights_and_does_a_tp_th_of_the_flops(tp, sp):
    w = load_workload("llama-3.1-70b")
    r = from_arch(w.name, w.arch, tp, sp)
    assert r.train_flops * tp == pytest.approx(w.train_flops, rel=1e-12)
    norms = 2 * w.arch.hidden  # two RMSNorm weights a layer, replicated
    for full, mine in zip(w.layers, r.layers, strict=True):
        assert mine.params == (full.params - norms) // tp + norms
    # sequence parallelism splits what the norms save (the matmuls' gathered inputs stay whole)
    other = from_arch(w.name, w.arch, tp, not sp)
    assert (r.layers[0].act_elems < other.layers[0].act_elems) == sp
    assert r.layers[0].act_elems < w.layers[0].act_elems / tp * 3
    if sp:
        assert r.layers[0].out_elems * tp == w.layers[0].out_elems  # a stage sends its tp-th of the tokens


def test_gqa_with_fewer_kv_heads_than_tp_replicates_them():
    w = load_workload("llama-3.1-70b")  # 8 key/value heads
    r16 = from_arch(w.name, w.arch, 16)
    r8 = from_arch(w.name, w.arch, 8)
    hd = w.arch.head_dim
    # one kv head a rank either way: the q part halves, the k/v part stays
    q8, q16 = w.arch.hidden * w.arch.hidden // 8, w.arch.hidden * w.arch.hidden // 16
    assert r8.layers[0].params - r16.layers[0].params == pytest.approx(
        (q8 - q16) * 2 + 3 * w.arch.hidden * (w.arch.ffn_size // 8 - w.arch.ffn_size // 16), abs=2 * hd
    )


def _plan(cfg: RunConfig):
    cluster = make_cluster(cfg.topology, cfg.nodes)
    w = load_workload(cfg.workload, cfg.shape)
    cfg, res = resolve(cfg, cluster.world, len(w.layers), arch=w.arch, devices_per_node=cluster.devices_per_node)
    wr = rank_workload(w, res.tp, cfg.strategy.sequence_parallel)
    cm = ComputeModel(cluster.instance.device, cfg.precision, arch=w.arch, tp=res.tp)
    return build_plan(cfg, res, wr, cm), res, w


@pytest.mark.parametrize("checkpointing", ["none", "full", "selective"])
@pytest.mark.parametrize("sp", [False, True])
def test_each_layer_issues_its_tp_collectives_on_consecutive_ranks(sp, checkpointing):
    cfg = RunConfig(**LLAMA, nodes=2, checkpointing=checkpointing, batch_per_device=1,
                    strategy=Strategy("zero", tp=8, sequence_parallel=sp))  # fmt: skip
    plan, res, w = _plan(cfg)
    tp_ops = [o for o in plan.ops if o.stream == "tp"]
    per_layer = [o for o in tp_ops if " layer3 " in o.name]
    recomputed = checkpointing != "none"  # full and op-level both re-run the forward, all but its last reduction
    a = w.arch
    acts = [o for o in per_layer if o.nbytes == a.tokens * a.hidden * 2]  # one activation, bf16, batch 1
    if sp:
        kinds = sorted(o.coll for o in acts)
        assert kinds.count("all_gather") == 4 + 2 * recomputed and kinds.count("reduce_scatter") == 4 + recomputed
        norm_grads = [o for o in per_layer if o.nbytes == a.hidden * 2]  # RMSNorm weights' gradients, bf16
        assert [o.coll for o in norm_grads] == ["all_reduce"] * 2 and len(acts) + 2 == len(per_layer)
    else:
        # forward 2; backward 2: attention's and the MLP's input gradients (SwiGLU's gate and up share one)
        assert [o.coll for o in per_layer] == ["all_reduce"] * (4 + recomputed) and acts == per_layer
    groups = per_layer[0].layout.groups()
    assert groups.shape == (2, 8) and (np.diff(groups, axis=1) == 1).all()  # one node's GPUs each
    fsdp = next(o for o in plan.ops if o.coll == "all_gather" and o.stream == "ag")
    g = fsdp.layout.groups()
    assert g.shape == (8, 2) and (g[:, 1] - g[:, 0] == 8).all()  # data parallel across the tp groups


def test_the_mesh_orders():
    dims = ParallelDims(dp_replicate=2, dp_shard=2, tp=4)
    inner, outer = StageMesh(dims), StageMesh(dims.replace(mesh_order="pp,tp,dp"))
    assert inner.groups("tp").groups()[1].tolist() == [4, 5, 6, 7]
    assert inner.groups("dp_shard").groups()[0].tolist() == [0, 4]
    assert inner.groups("dp_replicate").groups()[0].tolist() == [0, 8]
    assert outer.groups("tp").groups()[1].tolist() == [1, 5, 9, 13]
    assert outer.groups("dp_shard").groups()[0].tolist() == [0, 1]
    assert outer.groups("dp_replicate").groups()[0].tolist() == [0, 2]
    every = np.sort(np.concatenate([m.groups().ravel() for m in (outer.groups("dp_replicate"),)]))
    assert every.tolist() == list(range(16))


def test_tp_within_a_node_beats_tp_across_nodes_and_memory_falls_with_tp():
    base = RunConfig(**LLAMA, nodes=4, batch_per_device=1)
    inside = predict(base.replace(strategy=Strategy("zero", tp=8, sequence_parallel=True)))
    across = predict(base.replace(strategy=Strategy("zero", tp=16, sequence_parallel=True, tp_across_nodes=True)))
    assert inside.samples_per_s > across.samples_per_s
    tp2 = predict(base.replace(strategy=Strategy("zero", tp=2, sequence_parallel=True)))
    assert inside.memory_allocated_gib < tp2.memory_allocated_gib
    assert inside.collectives["reduce_scatter"] > tp2.collectives["reduce_scatter"] // 2  # TP's and FSDP's


def test_async_tp_hides_the_collectives_behind_the_gemms():
    base = RunConfig(**LLAMA, nodes=2, batch_per_device=1, compile=True)  # asyncTP needs torch.compile
    plain = predict(base.replace(strategy=Strategy("zero", tp=8, sequence_parallel=True)))
    overlapped = predict(base.replace(strategy=Strategy("zero", tp=8, sequence_parallel=True, async_tp=True)))
    assert overlapped.step_time_s < plain.step_time_s
    assert overlapped.samples_per_s * (1 - 1e-9) <= predict(base.replace(strategy=Strategy("zero"))).samples_per_s * 8
    # the fused pairs issue no collective: FSDP's and the plain ones (SwiGLU's input gradient's) are left
    assert overlapped.collectives["reduce_scatter"] < plain.collectives["reduce_scatter"]


@pytest.mark.parametrize(
    ("strategy", "workload", "field", "match"),
    [
        (Strategy("zero", tp=3), "llama-3.1-70b", "tp", "does not divide the world"),
        (Strategy("zero", tp=16), "llama-3.1-70b", "tp", "would span nodes"),
        (Strategy("zero", tp=4), "tiny-mlp", "tp", "transformer families"),
        (Strategy("zero", tp=16, tp_across_nodes=True), "llama-3.1-70b", None, None),
        (Strategy("zero", tp=16, tp_across_nodes=True), "mistral-7b", None, None),
        (Strategy("zero", tp=8, sequence_parallel=True), "bert-large", None, None),
    ],
)
def test_tp_refusals_name_the_field(strategy, workload, field, match):
    cfg = RunConfig(workload=workload, topology="p5.48xlarge", nodes=2, strategy=strategy)
    w = load_workload(workload)
    if field is None:
        resolve(cfg, 16, len(w.layers), arch=w.arch, devices_per_node=8)
        return
    with pytest.raises(ConfigError, match=match) as err:
        resolve(cfg, 16, len(w.layers), arch=w.arch, devices_per_node=8)
    assert err.value.field == field


def test_tp_refusals_of_the_model():
    heads = RunConfig(
        workload="llama-3.1-70b",
        shape={"heads": 24, "kv_heads": 8, "hidden": 3072, "ffn": 8192},
        strategy=Strategy("zero", tp=16),
    )
    w = load_workload(heads.workload, heads.shape)
    with pytest.raises(ConfigError, match="24 attention heads") as err:
        resolve(heads, 16, 80, arch=w.arch)
    assert err.value.field == "tp"
    kv = RunConfig(workload="llama-3.1-70b", shape={"kv_heads": 8}, strategy=Strategy("zero", tp=16))
    resolve(kv, 16, 80, arch=load_workload(kv.workload, kv.shape).arch)  # kv 8 divides 16: replicated
    odd = RunConfig(workload="llama-3.1-70b", shape={"heads": 48, "kv_heads": 3, "hidden": 6144},
                    strategy=Strategy("zero", tp=2))  # fmt: skip
    with pytest.raises(ConfigError, match="neither divides") as err:
        resolve(odd, 16, 80, arch=load_workload(odd.workload, odd.shape).arch)
    with pytest.raises(ConfigError, match="import path") as err:
        resolve(RunConfig(strategy=Strategy("zero", tp=2)), 16, 8, arch=None)
    with pytest.raises(ConfigError, match="asyncTP needs NCCL") as err:
        cfg = RunConfig(backend="gloo", workload="tiny-gpt", strategy=Strategy("zero", tp=2, sequence_parallel=True,
                                                                              async_tp=True))  # fmt: skip
        resolve(cfg, 4, 2, arch=load_workload("tiny-gpt").arch)
    assert err.value.field == "async_tp"
    with pytest.raises(ConfigError, match="applies with tp > 1") as err:
        Strategy("zero", sequence_parallel=True)
    assert err.value.field == "sequence_parallel"


def test_sagemaker_tensor_parallel_degree_is_tp(tmp_path):
    from shardsim.config import load_config

    p = tmp_path / "smp.yaml"
    p.write_text(
        "workload: llama-3.1-70b\ndistribution:\n  torch_distributed: {enabled: true}\n  smdistributed:\n"
        "    modelparallel:\n      enabled: true\n"
        "      parameters: {hybrid_shard_degree: 8, tensor_parallel_degree: 8}\n"
    )
    cfg = load_config(p)
    assert cfg.strategy.tp == 8 and cfg.strategy.degree == 8


def test_a_profile_s_measured_tp_share_scales_its_blocks_else_the_roofline_does():
    from dataclasses import replace

    from shardsim.simulator.hardware.profile import load_profile

    w = load_workload("small-gpt")
    prof = load_profile("experiments/validation/tp/profile.json", w.name)
    dev = make_cluster("emu-2x2", None).instance.device
    layer = from_arch(w.name, w.arch, 2).layers[0]
    whole = prof.block_time(layer.name, 4)
    assert (2, False) in prof.tp_share and (2, True) in prof.tp_share  # validate measured both layouts
    measured = ComputeModel(dev, "fp32", prof, arch=w.arch, tp=2).block(layer, 4)
    f, b = prof.tp_share_at(2, False, 4)
    assert measured.fwd_s == pytest.approx(whole[0] * f) and measured.bwd_s == pytest.approx(whole[1] * b)
    bare = replace(prof, tp_share={}, tp_share_by_batch={})
    roofline = ComputeModel(dev, "fp32", bare, arch=w.arch, tp=2).block(layer, 4)
    assert roofline.fwd_s < measured.fwd_s  # the roofline's share leaves out DTensor's dispatch on a CPU


def test_a_tp_share_is_taken_at_the_microbatch_size_or_the_nearest_measured():
    """DTensor's dispatch costs the same per op at every size: a profile measures a rank's share
    at each microbatch size, and a block of microbatch b is scaled by the share at b (the nearest
    size by ratio when b was not measured; the single-size `tp_share` of an older profile else)."""
    from dataclasses import replace

    from shardsim.simulator.hardware.profile import load_profile

    w = load_workload("small-gpt")
    prof = load_profile("experiments/validation/tp/profile.json", w.name)
    by = {2: {(2, False): (1.1, 0.9)}, 4: {(2, False): (0.7, 0.6)}}
    p = replace(prof, tp_share={(2, False): (0.5, 0.5)}, tp_share_by_batch=by)
    assert p.tp_share_at(2, False, 2) == (1.1, 0.9) and p.tp_share_at(2, False, 4) == (0.7, 0.6)
    assert p.tp_share_at(2, False, 1) == (1.1, 0.9) and p.tp_share_at(2, False, 16) == (0.7, 0.6)
    assert p.tp_share_at(2, False, 3) == (0.7, 0.6)  # 3 is nearer 4 by ratio (4/3 against 3/2)
    assert p.tp_share_at(2, True, 2) is None  # not measured with sequence parallelism
    assert replace(p, tp_share_by_batch={}).tp_share_at(2, False, 2) == (0.5, 0.5)
    dev = make_cluster("emu-2x2", None).instance.device
    layer = from_arch(w.name, w.arch, 2).layers[0]
    whole = prof.block_time(layer.name, 2)
    got = ComputeModel(dev, "fp32", p, arch=w.arch, tp=2).block(layer, 2)
    assert got.fwd_s == pytest.approx(whole[0] * 1.1) and got.bwd_s == pytest.approx(whole[1] * 0.9)


@pytest.mark.parametrize("sp", [False, True])
def test_a_tp_rank_holds_all_but_its_norms_as_dtensors(sp):
    """What `runtime.strategies.tensor_parallel` leaves plain: the norms without sequence
    parallelism (every other parameter a DTensor: sharded, or replicated by its style)."""
    w = load_workload("small-gpt")
    r = from_arch(w.name, w.arch, 2, sp)
    norm = 2 * w.arch.hidden  # LayerNorm: weight and bias
    plain = {b.name: b.params - b.dtensor_params for b in r.blocks}
    assert plain == {"embed": 0, **{b.name: 0 if sp else 2 * norm for b in r.layers}, "head": 0 if sp else norm}
    assert all(b.dtensor_params == 0 for b in from_arch(w.name, w.arch, 1).blocks)
    vit = load_workload("vit-630m")
    v = from_arch(vit.name, vit.arch, 2, sp)
    assert v.blocks[0].dtensor_params == 0 and v.blocks[-1].dtensor_params == 0  # patch embedding, classifier


def test_ddp_with_tp_all_reduces_every_bucket_after_backward():
    """TP + DDP: the DTensors are rebuilt from DDP's local shards in a forward pre-hook, so the
    autograd engine accumulates the shards' gradients after every block's backward (measured on
    emu-2x2: both buckets of small-gpt's tp 2 rank, 2.0 and 14.2 MiB, launched within 10 ms at
    the end of backward): no bucket overlaps backward. Without TP the first bucket does."""
    base = dict(workload="small-gpt", topology="emu-2x2", nodes=2, precision="fp32", backend="gloo")

    def starts(cfg: RunConfig) -> tuple[list[float], float]:
        spans = predict(cfg).spans
        end_bwd = max(s.end for s in spans if s.name.startswith("B "))
        return sorted(s.start for s in spans if s.name.startswith("AR bucket")), end_bwd

    tp_starts, tp_end = starts(RunConfig(**base, strategy=Strategy("ddp", tp=2)))
    assert len(tp_starts) == 2 and min(tp_starts) >= tp_end - 1e-12
    dp_starts, dp_end = starts(RunConfig(**base, strategy=Strategy("ddp")))
    assert len(dp_starts) == 3 and min(dp_starts) < dp_end - 0.1  # 1 MiB, 25 MiB, the rest
