"""The `Workload` a description names: a described model costed analytically (`specs.model.blocks`),
a model given as ``pkg.module:build_fn`` measured on the meta device (`workload.measure`, torch)."""

from __future__ import annotations

from shardsim.core.torch_required import require_torch
from shardsim.specs.model.arch import Shape
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.load import NO_SHAPE, WorkloadSpec, resolve_arch
from shardsim.specs.model.workload import Workload


def load_workload(spec: WorkloadSpec, shape: Shape = NO_SHAPE, where: str | None = None) -> Workload:
    """The workload a description names: costed analytically, or measured on the meta device."""
    name, arch = resolve_arch(spec, shape, where)
    if arch is not None:
        return from_arch(name, arch)
    require_torch(f"the workload {name!r} (a model built by Python)")
    from shardsim.simulator.workload.measure import measure_import_path  # imports torch, only here

    return measure_import_path(name)
