"""Expert parallelism with tensor parallelism (`etp`: 1 or tp, torchtitan's two): the experts' mesh
against torchtitan's construction, the per-rank all-to-all bytes and the tensor-parallel
collectives around an MoE layer counted by hand, the experts' shards in memory, the refusals, and
the sweep's rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardsim.cli import main
from shardsim.config import RunConfig
from shardsim.config.load import load_config
from shardsim.simulator.predict import predict, prepare
from shardsim.simulator.strategies.expert_parallel import ep_groups
from shardsim.simulator.strategies.steps import rank_classes
from shardsim.specs.model.library import PRESETS
from shardsim.specs.parallel_dims import ParallelDims
from shardsim.sweep.space import SweepSpace, enumerate_configs

CHECKS = settings(derandomize=True, database=None, max_examples=150, deadline=None)


def titan_groups(pp: int, r: int, shard: int, tp: int, ep: int, etp: int) -> dict[str, list[list[int]]]:
    """torchtitan's ParallelDims.build_mesh, its ranks: the world unflattened as (pp, dp_replicate,
    dp_shard, tp) for the dense mesh and (pp, dp_replicate, efsdp, ep, etp) for the experts' (its
    efsdp = dp_shard x tp / (ep x etp)); each dimension's groups, sorted."""
    world = np.arange(pp * r * shard * tp)
    efsdp = shard * tp // (ep * etp)
    sparse = world.reshape(pp, r, efsdp, ep, etp)
    dense = world.reshape(pp, r, shard, tp)

    def along(mesh: np.ndarray, axis: int) -> list[list[int]]:
        return sorted(np.moveaxis(mesh, axis, -1).reshape(-1, mesh.shape[axis]).tolist())

    return {"ep": along(sparse, 3), "efsdp": along(sparse, 2), "dense": along(dense, 2), "replica": along(dense, 1)}


def dims_of(pp: int, r: int, shard: int, tp: int, ep: int, etp: int) -> ParallelDims:
    """The dims `resolve` builds for these sizes (dp_shard: the degree over the ranks EP takes)."""
    mesh = ParallelDims(ep=ep, tp=tp, etp=etp)
    return mesh.replace(pp=pp, dp_replicate=r, dp_shard=shard // mesh.ep_dp)


def sim_groups(dims: ParallelDims) -> dict[str, list[list[int]]]:
    """The simulator's groups of every pipeline stage (`ep_groups`), as torchtitan's are named."""
    out: dict[str, list[list[int]]] = {"ep": [], "efsdp": [], "dense": [], "replica": []}
    for stage in range(dims.pp):
        g = ep_groups(dims, stage)
        for name, layout in (("ep", g.ep), ("efsdp", g.experts), ("dense", g.dense), ("replica", g.replica)):
            out[name] += layout.groups().tolist() if layout is not None else []
    return {k: sorted(sorted(x) for x in v) for k, v in out.items()}


# 8 ranks, zero (degree 4), tp 2: etp 1 takes its EP ranks from dp_shard x tp (consecutive, a
# tensor-parallel pair inside), etp 2 from dp_shard alone (tp apart)
TABLE = [
    (4, 1, [[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (2, 1, [[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 2, 4, 6], [1, 3, 5, 7]]),
    (8, 1, [list(range(8))], [[r] for r in range(8)]),
    (2, 2, [[0, 2], [1, 3], [4, 6], [5, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (4, 2, [[0, 2, 4, 6], [1, 3, 5, 7]], [[r] for r in range(8)]),
]


@pytest.mark.parametrize(("ep", "etp", "ep_want", "efsdp_want"), TABLE)
def test_the_experts_groups_of_eight_ranks(ep, etp, ep_want, efsdp_want) -> None:
    dims = dims_of(1, 1, 4, 2, ep, etp)
    assert dims.world == 8
    assert sorted(dims.expert_groups("ep")) == [tuple(g) for g in ep_want]
    assert sorted(dims.expert_groups("efsdp")) == [tuple(g) for g in efsdp_want]
    sim = sim_groups(dims)
    assert sim["ep"] == ep_want and sim["efsdp"] == efsdp_want
    assert sim["dense"] == [[0, 2, 4, 6], [1, 3, 5, 7]]  # the rest: FSDP2 over the degree's ranks, tp apart


@CHECKS
@given(
    pp=st.sampled_from([1, 2]),
    r=st.sampled_from([1, 2]),
    shard=st.sampled_from([1, 2, 4, 8]),
    tp=st.sampled_from([1, 2, 4]),
    ep=st.sampled_from([2, 4, 8, 16]),
    tensor_parallel_experts=st.booleans(),
)
def test_the_groups_are_torchtitans(pp, r, shard, tp, ep, tensor_parallel_experts) -> None:
    """Every valid mesh: the simulator's groups and `ParallelDims.expert_groups` are the ones torchtitan's
    unflatten gives (EP, the experts' FSDP, the rest's FSDP and the replicas)."""
    etp = tp if tensor_parallel_experts else 1
    assume((shard * tp // etp) % ep == 0 and (etp == tp or ep % tp == 0 or tp % ep == 0))
    dims = dims_of(pp, r, shard, tp, ep, etp)
    want = titan_groups(pp, r, shard, tp, ep, etp)
    got = sim_groups(dims)
    assert got["ep"] == want["ep"] and got["efsdp"] == want["efsdp"] and got["dense"] == want["dense"]
    assert got["replica"] == (want["replica"] if r > 1 else [])
    assert sorted(map(list, dims.expert_groups("ep"))) == want["ep"]
    assert sorted(map(list, dims.expert_groups("efsdp"))) == want["efsdp"]
    assert dims.world == pp * r * shard * tp and dims.efsdp * ep * etp == shard * tp


def _tiny(**keys) -> RunConfig:
    """tiny-moe (3 MoE layers of 4 experts, top-2, 32 tokens, hidden 64, fp32) on 4 CPU ranks, zero tp 2 sp."""
    base = {"topology": "emu-2x2", "nodes": 2, "workload": "tiny-moe", "strategy": "zero", "tp": 2, "ep": 2}
    return load_config(None, base | {"sequence_parallel": True, "checkpointing": "none", "backend": "gloo"} | keys)


@pytest.mark.parametrize(("etp", "groups", "tokens"), [(1, [[0, 1], [2, 3]], 16), (2, [[0, 2], [1, 3]], 32)])
def test_the_all_to_all_bytes_per_rank(etp, groups, tokens) -> None:
    """Per rank and MoE layer (micro-batch of 4 samples): etp 1 dispatches its tp-th of the 32 tokens
    (torchtitan's sequence split before dispatch) within the tensor-parallel pair, etp 2 all 32
    tokens to its peer of the same tensor-parallel index; each copy top-2 rows of 64 fp32."""
    cfg = _tiny(etp=etp)
    p = prepare(cfg).plan()
    a2a = [o for o in p.ops if o.coll == "all_to_all"]
    counts = [o for o in a2a if o.nbytes == 4 * 8]
    rows = [o for o in a2a if o.nbytes != 4 * 8]
    assert len(counts) == 3 and len(rows) == 12  # dispatch, combine and their reverses, 3 layers
    mb = cfg.batch_per_device
    assert {o.nbytes for o in rows} == {mb * tokens * 2 * 64 * 4}
    assert all(o.layout is not None and sorted(map(sorted, o.layout.groups().tolist())) == groups for o in a2a)


def _moe_part(p, layer: str) -> list[tuple[str, str, float]]:
    """(phase, collective, bytes) of the plan's tensor-parallel calls of `layer`'s MLP part and router, in order."""
    part = [o for o in p.ops if o.name.startswith("TP ") and any(f" {layer} {w}" in o.name for w in ("mlp", "router"))]
    return [(o.phase, o.coll, o.nbytes) for o in part]


@pytest.mark.parametrize("etp", [1, 2])
def test_the_tensor_parallel_collectives_around_the_moe_layer(etp) -> None:
    """torchtitan's TP plan of the MoE module under sequence parallelism: its input all-gathered and
    its output reduce-scattered (32 tokens x 64 fp32 a sample), the converse in backward, and between
    those the all-reduce of the replicated router's input gradient; the same for both etp (etp 1's
    combine leaves each rank its tokens' part: the reduce-scatter sums it). The dense layer has no router."""
    cfg = _tiny(etp=etp)
    p = prepare(cfg).plan()
    n = cfg.batch_per_device * 32 * 64 * 4
    for layer in ("layer1", "layer2", "layer3"):  # layer0 is dense
        assert _moe_part(p, layer) == [
            ("fwd", "all_gather", n),
            ("fwd", "reduce_scatter", n),
            ("bwd", "all_gather", n),
            ("bwd", "all_reduce", n),
            ("bwd", "reduce_scatter", n),
        ]
        assert all(o.layout.size == 2 for o in p.ops if o.name.startswith("TP ") and layer in o.name)
    assert [c for _, c, _ in _moe_part(p, "layer0")] == ["all_gather", "reduce_scatter"] * 2


@pytest.mark.parametrize(
    ("keys", "bwd"),
    [
        ({"sequence_parallel": False}, ["all_reduce", "all_reduce"]),  # the router's, then the MLP input's
        ({"checkpointing": "full"}, ["all_gather", "all_gather", "all_reduce", "reduce_scatter"]),
    ],
)
def test_the_routers_all_reduce_without_sequence_parallelism_and_under_recomputation(keys, bwd) -> None:
    """Without sequence parallelism the router's input gradient is all-reduced before the MLP's; a
    recomputed forward issues its gathers again but not the router's all-reduce, a backward call."""
    cfg = _tiny(**keys)
    p = prepare(cfg).plan()
    n = cfg.batch_per_device * 32 * 64 * 4
    assert [(c, b) for ph, c, b in _moe_part(p, "layer2") if ph == "bwd"] == [(c, n) for c in bwd]
    assert sum(o.coll == "all_reduce" and "router" in o.name for o in p.ops) == 3  # once per MoE layer


def test_the_routers_all_reduce_is_in_the_activations_dtype() -> None:
    """Mixtral (hidden 4,096, 4,096 tokens a sample) in bf16, zero tp 2 sp: each MoE layer's backward
    all-reduces its router's input gradient over the tensor-parallel pair, 2 bytes an element (an
    activation's gradient: the reduce dtype is the parameters' gradients'), with expert parallelism or without."""
    for ep in (1, 2):
        cfg = _mixtral(kind="zero", tp=2, ep=ep, sequence_parallel=True).replace(precision="bf16", reduce_dtype="fp32")
        p = prepare(cfg).plan()
        router = [o for o in p.ops if o.name.startswith("TP ") and "router" in o.name]
        assert [(o.phase, o.coll, o.layout.size) for o in router] == [("bwd", "all_reduce", 2)] * 2
        assert {o.nbytes for o in router} == {cfg.batch_per_device * 4096 * 4096 * 2}


def _mixtral(**strategy) -> RunConfig:
    shape = {"layers": 2, "seq_len": 4096}
    return RunConfig(workload="mixtral-8x7b", topology="p5.48xlarge", nodes=1, shape=shape, strategy=strategy)


@pytest.mark.parametrize(("ep", "etp"), [(4, 1), (2, 2), (2, 1)])
def test_the_experts_shards_in_memory(ep, etp) -> None:
    """zero2d d=2 tp 2 on 8 GPUs: each rank holds a quarter of every layer's experts (ep x etp x
    efsdp = degree x tp = 4 ranks split them), the rest a tp-th over the degree's 2 ranks."""
    pre = prepare(_mixtral(kind="zero2d", degree=2, tp=2, ep=ep, etp=etp))
    a = pre.workload.arch
    assert a is not None
    experts = 2 * a.experts * 3 * a.hidden * a.expert_ffn_size  # two MoE layers, whole
    rc, blocks = rank_classes(pre.res, pre.ranks_workload, False)[0]
    rest = sum(b.params - (b.moe.experts * b.moe.expert_params if b.moe else 0) for b in blocks)
    assert rc.local_params == pytest.approx(rest / 2 + experts / 4, rel=1e-12)


def test_etp_one_trades_all_to_all_for_whole_experts() -> None:
    """Mixtral on one p5 (8 GPUs) zero tp 2 ep 4 (degree 4): etp 1 dispatches a tp-th of the tokens
    over 4 NVSwitch ranks, etp 2 all of them: its all-to-alls take longer."""
    one = predict(_mixtral(kind="zero", tp=2, ep=4, etp=1, sequence_parallel=True))
    two = predict(_mixtral(kind="zero", tp=2, ep=4, etp=2, sequence_parallel=True))
    assert one.moe is not None and two.moe is not None
    assert one.moe["all_to_all_s"] < two.moe["all_to_all_s"]


PREDICT = ["predict", "--workload", "tiny-moe", "--topology", "emu-2x2", "--backend", "gloo", "--tp", "2"]


@pytest.mark.parametrize(
    ("flags", "field", "says"),
    [
        (["--ep", "4", "--etp", "2"], "ep", "ep 4 does not divide the 2 data-parallel ranks"),
        (["--strategy", "zero2d", "--degree", "1", "--ep", "4"], "ep", "ep 4 does not divide the 2 ranks of degree 1"),
        (["--ep", "2", "--etp", "3"], "etp", "etp 3 is neither 1"),
        (["--etp", "2"], "etp", "etp 2 applies with expert parallelism"),
        (["--ep", "2", "--mesh-order", "pp,tp,dp"], "ep", "tp innermost: mesh_order pp,dp,tp"),
        (["--ep", "2", "--cp", "2"], "ep", "with context parallelism is not built yet"),
    ],
)
def test_refused_in_one_line(flags, field, says, capsys) -> None:
    assert main([*PREDICT, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"field '{field}'" in err and says in err, err


def test_etp_one_needs_ep_and_tp_to_nest(capsys) -> None:
    flags = ["predict", "--workload", "mixtral-8x7b", "--topology", "p5.48xlarge", "--layers", "2", "--tp", "4"]
    assert main([*flags, "--ep", "8", "--strategy", "zero2d", "--degree", "2"]) == 0
    capsys.readouterr()
    assert main([*flags, "--ep", "6"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'etp'" in err and "a multiple or a divisor of tp" in err, err


def test_a_sweep_spans_ep_with_tp_under_both_etp() -> None:
    base = load_config(None, {"topology": "emu-2x2", "nodes": 2, "workload": "tiny-moe", "backend": "gloo"})
    space = SweepSpace(strategies=("zero", "zero2d"), ep=(2, 4), tp_degrees=(1, 2))
    labels = {c.label for c in enumerate_configs(base, space).candidates}
    assert {"zero ep=2 tp=2 sp", "zero ep=2 tp=2 etp=2 sp", "zero ep=4 tp=2 sp", "zero ep=4", "zero ep=2"} <= labels
    assert "zero ep=4 tp=2 etp=2 sp" not in labels  # 4 ranks, tp 2: etp 2's EP takes the degree's 2 ranks only
    assert not any("etp=1" in x for x in labels)  # torchtitan's default, unnamed
    only = SweepSpace(strategies=("zero",), ep=(2,), tp_degrees=(2,), etp=(1,))
    assert {c.label for c in enumerate_configs(base, only).candidates} == {"zero ep=2 tp=2 sp"}


def test_torchtitans_default_etp_is_left_out_of_a_configuration() -> None:
    from shardsim.config import Strategy

    assert "etp" not in Strategy("zero", tp=2, ep=2).model_dump()  # unchanged files and cache keys
    s = Strategy("zero", tp=2, ep=2, etp=2)
    assert s.model_dump()["etp"] == 2 and s.label() == "zero ep=2 tp=2 etp=2"


def _no_parallel(module, mesh):
    """torchtitan's NoParallel of the router's gate (torchtitan/distributed/tensor_parallel.py): its
    weight replicated, its input made a Replicate DTensor, its output local with a Partial gradient."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_module

    def inputs(_, args, mesh):
        return (DTensor.from_local(args[0], mesh, (Replicate(),), run_check=False),)

    def output(_, out, mesh):
        return out.to_local(grad_placements=(Partial(),))

    return distribute_module(module, mesh, None, inputs, output)


def _traced_moe_layer(tp: int, etp: int, tokens: int, hidden: int, experts: int, top_k: int, ffn: int) -> list:
    """The collectives one rank of a tensor-parallel group of `tp` issues for a small MoE layer under
    torchtitan's TP plan (its llama4 apply_moe_ep_tp with sequence parallelism: the module's input
    gathered, its Partial output reduce-scattered, x.to_local with a Partial gradient as its MoE.forward,
    the router NoParallel; with etp 1 each rank routes its tp-th of the tokens to whole experts, with
    etp tp all of them to experts split by tp), one forward and backward, under the fake process group."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInputOutput, parallelize_module
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shardsim.runtime.collective_trace import mesh_group_names, record_collectives

    class MoE(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            f = ffn // etp
            self.gate = torch.nn.Linear(hidden, experts, bias=False)
            self.w13 = torch.nn.Parameter(torch.randn(experts, 2 * f, hidden) / 8)
            self.w2 = torch.nn.Parameter(torch.randn(experts, hidden, f) / 8)

        def forward(self, x):
            x = x.to_local(grad_placements=(Partial(),)) if isinstance(x, DTensor) else x
            top, idx = self.gate(x).softmax(-1).topk(top_k, -1)
            n = x.shape[0] * etp // tp  # the tokens this rank routes
            lo = dist.get_rank() % (tp // etp) * n
            part = torch.zeros_like(x[lo : lo + n])
            for e in range(experts):
                rows = (idx[lo : lo + n] == e).nonzero()
                t = x[lo : lo + n][rows[:, 0]]
                g, u = (t @ self.w13[e].T).chunk(2, -1)
                y = (torch.nn.functional.silu(g) * u) @ self.w2[e].T * top[lo : lo + n][rows[:, 0], rows[:, 1], None]
                part = part.index_add(0, rows[:, 0], y)
            return torch.zeros_like(x).index_add(0, torch.arange(lo, lo + n), part)

    dist.init_process_group("fake", rank=0, world_size=tp, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
        moe = MoE()
        _no_parallel(moe.gate, mesh)
        style = PrepareModuleInputOutput(
            input_layouts=(Shard(0),),
            desired_input_layouts=(Replicate(),),
            use_local_input=False,
            output_layouts=(Partial(),),
            desired_output_layouts=(Shard(0),),
            use_local_output=True,
        )
        parallelize_module(moe, mesh, style)
        x = torch.randn(tokens // tp, hidden, requires_grad=True)
        with record_collectives(mesh_group_names(mesh)) as calls:
            moe(x).sum().backward()
        return calls
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("etp", [1, 2])
def test_the_moe_layers_tensor_parallel_collectives_are_pytorchs(etp) -> None:
    """tiny-moe's MoE layer, zero tp 2 sp ep 2: the plan's collectives of its MLP part and router
    (forward and backward) are those DTensor issues for the layer under torchtitan's TP plan, kind,
    count and size, in order: backward's all-reduce of the router's input gradient (NoParallel's
    Replicate input receiving a Partial gradient) among them."""
    cfg = _tiny(etp=etp)
    plan = prepare(cfg).plan()
    mb = cfg.batch_per_device
    planned = [(c, b / 4) for _, c, b in _moe_part(plan, "layer1")]
    a = PRESETS["tiny-moe"]
    calls = _traced_moe_layer(2, etp, mb * a.tokens, a.hidden, a.experts, a.top_k, a.expert_ffn_size)
    assert calls and all(c.group_size == 2 and c.group == "tp" for c in calls)
    traced = [(c.kind, c.numel) for c in calls]
    assert traced.count(("all_reduce", mb * 32 * 64)) == 1  # the router's
    assert traced == planned
