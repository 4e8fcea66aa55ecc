"""The runtime's device mesh of each kind is built from the run's ParallelDims: its shape and
dimension names, the FSDP and DDP (sub)meshes, a rank's stage and replica (no process group:
a stand-in mesh records what `init_device_mesh` would get)."""

from __future__ import annotations

import numpy as np
import pytest

from shardsim.config import RunConfig, Strategy, resolve
from shardsim.runtime.strategies import STRATEGIES
from shardsim.specs.model.library import PRESETS
from shardsim.specs.parallel_dims import DATA


class FakeMesh:
    def __init__(self, shape: tuple[int, ...], names: tuple[str, ...]):
        self.shape, self.names = shape, names

    def __getitem__(self, names):
        return ("sub", names)

    def get_group(self, name: str):
        return ("group", name)


def layouts(strategy: Strategy, world: int) -> tuple[list, list[FakeMesh]]:
    cfg = RunConfig(workload=PRESETS["tiny-gpt"], strategy=strategy, batch_per_device=8, backend="gloo")
    cfg, res = resolve(cfg, world, 4, arch=PRESETS["tiny-gpt"], devices_per_node=world)
    made: list[FakeMesh] = []

    def mesh(shape, names):
        made.append(FakeMesh(shape, names))
        return made[-1]

    return [STRATEGIES[cfg.strategy.kind].layout(mesh, res, r) for r in range(world)], made


@pytest.mark.parametrize(
    ("strategy", "world", "shape", "names", "fsdp"),
    [
        (Strategy("ddp"), 4, None, None, None),
        (Strategy("zero"), 4, (4,), ("dp_shard",), "mesh"),
        (Strategy("zero2d", degree=2), 8, (4, 2), DATA, "mesh"),
        (Strategy("pipeline", pp=2, microbatches=2), 8, (2, 4), ("pp", "dp_replicate"), None),
        (Strategy("pipeline", pp=2, degree=2, microbatches=2), 8, (2, 2, 2), ("pp", *DATA), 2),
        (Strategy("pipeline", pp=2, degree=4, microbatches=2), 8, (2, 1, 4), ("pp", *DATA), 1),
        (Strategy("ddp", tp=2), 4, (2, 2), ("dp_replicate", "tp"), None),
        (Strategy("zero", tp=2), 8, (4, 2), ("dp_shard", "tp"), 1),
        (
            Strategy("zero2d", degree=2, tp=2, mesh_order="pp,tp,dp"),
            8,
            (2, 2, 2),
            ("tp", "dp_replicate", "dp_shard"),
            2,
        ),
        (Strategy("pipeline", pp=2, microbatches=2, tp=2), 8, (2, 2, 2), ("pp", "dp_replicate", "tp"), None),
    ],
)
def test_the_mesh_of_each_kind(strategy, world, shape, names, fsdp):
    out, made = layouts(strategy, world)
    if shape is None:  # plain DDP over the world group
        assert not made and all(o.mesh is None and o.dp_group is None for o in out)
        assert [o.replica for o in out] == list(range(world))
        return
    assert {(m.shape, m.names) for m in made} == {(shape, names)}
    grid = np.arange(world).reshape(shape)
    data = [names.index(n) for n in DATA if n in names]
    for rank, o in enumerate(out):
        at = np.argwhere(grid == rank)[0]
        assert o.stage == (at[names.index("pp")] if "pp" in names else 0)
        assert o.replica == int(np.ravel_multi_index([at[i] for i in data], [shape[i] for i in data]))
        assert (o.pp_group is not None) == ("pp" in names)
        assert (o.tp_mesh is not None) == ("tp" in names)
        if fsdp == "mesh":
            assert o.fsdp_mesh is o.mesh
        elif fsdp == 1:
            assert o.fsdp_mesh == ("sub", "dp_shard")
        elif fsdp == 2:
            assert o.fsdp_mesh == ("sub", ("dp_replicate", "dp_shard"))
        else:
            assert o.fsdp_mesh is None
            assert o.dp_group == ("group", "dp_replicate")
