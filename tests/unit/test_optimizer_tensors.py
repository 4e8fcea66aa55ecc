"""Per-parameter Adam launches its kernels once per parameter tensor: the plan counts the tensors
the runtime's own model holds, family by family (not one figure for every family)."""

from __future__ import annotations

import pytest

from shardsim.config import RunConfig, Strategy, resolve
from shardsim.simulator.compute import ADAM_OPS_PER_TENSOR, KERNEL_LAUNCH_S, ComputeModel
from shardsim.simulator.strategies.build import build_plan
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import from_arch

ARCHS = {
    "gpt": Arch("gpt", hidden=64, layers=3, heads=4, seq_len=32, vocab=128),
    "llama": Arch("llama", hidden=64, layers=3, heads=4, kv_heads=2, seq_len=32, vocab=128),
    "mpt": Arch("mpt", hidden=64, layers=3, heads=4, seq_len=32, vocab=128),
    "vit": Arch("vit", hidden=64, layers=3, heads=4, image=32, patch=8, classes=10),
    "mlp": Arch("mlp", hidden=64, layers=3, ffn=128, classes=10),
}


def optimizer_time(arch: Arch, impl: str) -> float:
    cfg = RunConfig(workload="t", topology="p4d.24xlarge", nodes=1, strategy=Strategy("ddp"), optimizer_impl=impl)
    cluster = make_cluster("p4d.24xlarge", 1)
    w = from_arch("t", arch)
    cfg, res = resolve(cfg, cluster.world, len(w.layers))
    plan = build_plan(cfg, res, w, ComputeModel(cluster.instance.device, cfg.precision, optimizer_impl=impl))
    (op,) = [op for op in plan.ops if op.name == "optimizer step"]
    return op.duration


@pytest.mark.parametrize("family", ARCHS)
def test_per_parameter_adam_pays_a_launch_per_tensor_of_the_real_model(family: str):
    torch = pytest.importorskip("torch")
    from shardsim.runtime.models.builders import build_model

    arch = ARCHS[family]
    with torch.device("meta"):
        tensors = len(list(build_model(arch).parameters()))
    extra = optimizer_time(arch, "per-parameter") - optimizer_time(arch, "foreach")
    assert extra == pytest.approx(tensors * ADAM_OPS_PER_TENSOR * KERNEL_LAUNCH_S, rel=1e-9)
