"""The runtime's model, built from the same workload spec the simulator reads.

A described model (a library name, a model YAML, a Hugging Face config.json, an inline
`Arch`; shape flags over it) builds `runtime.models.builders.build_model(arch)`;
``pkg.module:build_fn`` imports and calls the function (no arguments). The model must have ``blocks`` (an
``nn.ModuleList``), ``sample_batch(batch, generator=None) -> (inputs, targets)``, and for a
pipeline ``embed`` (or None) and ``head``; ``loss(output, target)`` defaults to
cross-entropy. `n_blocks` answers without torch for described models (the launcher checks a
configuration before anything is spawned).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardsim.core.errors import ConfigError
from shardsim.specs.model.arch import Shape
from shardsim.specs.model.importpath import first_line, resolve_import_path
from shardsim.specs.model.load import NO_SHAPE, WorkloadSpec, resolve_arch, spec_name


def resolve_builder(spec: WorkloadSpec, shape: Shape = NO_SHAPE, tp: int = 1) -> Callable[[], Any]:
    """A function that builds the workload's torch model (ConfigError if there is none); `tp`
    groups a described model's fused qkv rows for that tensor-parallel degree."""
    name, arch = resolve_arch(spec, shape)
    if arch is not None:

        def build():
            from shardsim.runtime.models.builders import build_model  # imports torch, only here

            return build_model(arch, qkv_groups=tp)

        return build
    return resolve_import_path(name)


def check_model(model: Any, name: str, *, pipeline: bool = False) -> None:
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ConfigError(f"workload {name!r}: the build function returned {type(model).__name__}, not an nn.Module")
    if not isinstance(getattr(model, "blocks", None), (nn.ModuleList, nn.ModuleDict)):
        raise ConfigError(f"workload {name!r}: the model has no `blocks` (an nn.ModuleList of its layers)")
    if not callable(getattr(model, "sample_batch", None)):
        raise ConfigError(f"workload {name!r}: the model has no sample_batch(batch, generator) -> (inputs, targets)")
    if pipeline and not isinstance(getattr(model, "head", None), nn.Module):
        raise ConfigError(f"workload {name!r}: a pipeline needs `embed` (or None), `blocks` and `head`")


def n_blocks(spec: WorkloadSpec, shape: Shape = NO_SHAPE, *, pipeline: bool = False) -> int:
    """Number of blocks of a workload: from its description, or by building it on the meta device."""
    name, arch = resolve_arch(spec, shape)
    if arch is not None:
        return arch.layers
    build = resolve_import_path(name)
    import torch

    try:
        with torch.device("meta"):
            model = build()
    except Exception as err:
        raise ConfigError(f"workload {name!r}: building the model failed: {first_line(err)}") from None
    check_model(model, name, pipeline=pipeline)
    return len(model.blocks)


def build(spec: WorkloadSpec, seed: int, shape: Shape = NO_SHAPE, tp: int = 1):
    """The model with seeded initialization: the same weights on every rank and in the
    single-process reference (built with the same `tp`: the qkv rows' grouping)."""
    import torch

    name = spec_name(spec)
    builder = resolve_builder(spec, shape, tp)
    torch.manual_seed(seed)
    model = builder()
    check_model(model, name)
    if not callable(getattr(model, "loss", None)):
        import torch.nn.functional as F

        model.loss = lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return model
