"""Expert parallelism (`ep`): the setting, what it refuses in one line (exit 2), where its ranks
sit (the EP group innermost of the data-parallel ranks; the experts sharded over the ranks left
after EP, the rest over all of them), and that a prediction of it is refused until it is planned."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from shardsim.cli import main
from shardsim.config import RunConfig, Strategy, resolve
from shardsim.specs.model.library import PRESETS

TINY = PRESETS["tiny-moe"]  # 4 experts
RUN = ["run", "--workload", "tiny-moe", "--topology", "emu-2x2", "--no-emulate", "--steps", "1"]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--nproc", "2", "--ep", "3"], "ep 3 does not divide the model's 4 experts"),
        (["--nproc", "4", "--strategy", "zero2d", "--degree", "2", "--ep", "4"], "ep 4 does not divide the 2 data"),
        (["--nproc", "2", "--ep", "2", "--strategy", "ddp"], "ddp does not shard with FSDP2"),
        (["--nproc", "2", "--ep", "2", "--strategy", "zero1"], "zero1 does not shard with FSDP2"),
        (["--nproc", "2", "--ep", "2", "--strategy", "pipeline", "--pp", "2"], "degree 1 (DDP stages) has none"),
        (["--nproc", "4", "--ep", "2", "--strategy", "pipeline", "--pp", "2", "--degree", "2"], "not in a pipeline's"),
        (["--nproc", "2", "--ep", "2", "--workload", "tiny-gpt"], "this gpt model has no experts"),
        (["--nproc", "2", "--ep", "2", "--workload", "tests.fixtures_models:build_tiny_gpt"], "not an import path"),
    ],
)
def test_refused_in_one_line(flags: list[str], says: str, capsys) -> None:
    assert main([*RUN, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'ep'" in err and says in err, err


@pytest.mark.parametrize("ep", [[], ["--ep", "2"], ["--ep", "2", "--etp", "2"]])
def test_the_runtime_refuses_tensor_parallel_moe_layers(ep, capsys) -> None:
    """The simulator plans EP with TP (`test_ep_tp`); the runtime runs EP alone and with FSDP."""
    assert main([*RUN, "--nproc", "4", "--tp", "2", *ep]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'tp'" in err and "MoE layers are not tensor parallel" in err, err


def test_the_runtime_refuses_op_level_selective_checkpointing_of_expert_parallel_layers(capsys) -> None:
    flags = ["--nproc", "2", "--ep", "2", "--checkpointing", "selective", "--selective-ac-option", "op"]
    assert main([*RUN, *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'selective_ac_option'" in err and "every-k" in err, err


def test_without_it_a_configuration_reads_as_before() -> None:
    assert "ep" not in Strategy("zero").model_dump()  # unchanged files and cache keys
    s = Strategy("zero2d", degree=4, ep=2)
    assert s.model_dump()["ep"] == 2 and s.label() == "zero2d d=4 ep=2"


@pytest.mark.parametrize(
    ("kind", "degree", "world", "want"), [("zero", None, 4, (1, 2, 2)), ("zero2d", 4, 8, (2, 2, 2))]
)
def test_ep_ranks_come_from_the_sharded_ranks(kind, degree, world, want) -> None:
    """(dp_replicate, dp_shard, ep): the degree's ranks are dp_shard x ep; the batch is split over all
    the data-parallel ranks, EP ones included, and the rest of the model sharded over dp_shard x ep."""
    cfg = RunConfig(workload=TINY, strategy=Strategy(kind, degree=degree, ep=2), batch_per_device=3)
    _, res = resolve(cfg, world, TINY.layers, arch=TINY)
    d = res.dims
    assert (d.dp_replicate, d.dp_shard, d.ep) == want
    assert res.shard == d.dp_shard * d.ep and res.global_batch == 3 * world


def test_the_layouts_meshes(monkeypatch) -> None:
    """zero2d d=4 ep 2 on 8 ranks, seen from rank 5: EP groups of consecutive ranks, the experts
    sharded over the ranks 2 apart within a replica and replicated across replicas, the rest
    sharded over the replica's 4 ranks; its sample slice is its rank."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shardsim.runtime.strategies import STRATEGIES, build_layout

    cfg = RunConfig(workload=TINY, strategy=Strategy("zero2d", degree=4, ep=2))
    _, res = resolve(cfg, 8, TINY.layers, arch=TINY)
    dist.init_process_group("fake", rank=5, world_size=8, store=FakeStore())
    try:
        layout = build_layout(STRATEGIES["zero2d"].layout, res, 5, "cpu", timedelta(seconds=30))
        ranks = dist.get_process_group_ranks
        assert ranks(layout.ep_mesh.get_group()) == [4, 5]
        assert layout.expert_fsdp_mesh.mesh.tolist() == [[1, 3], [5, 7]]
        assert layout.fsdp_mesh.mesh.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert layout.replica == 5
    finally:
        dist.destroy_process_group()
