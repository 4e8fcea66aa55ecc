"""A workload's description resolved to its name and `Arch`: a library name, a model YAML file, a
Hugging Face ``config.json`` (named after its model, with the sequence length it is read at), an
inline `Arch`, or ``pkg.module:build_fn`` (no `Arch`: `simulator.workload.resolve` measures it);
shape fields given as flags (`Shape`) apply over any description but the last."""

from __future__ import annotations

from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import suggest
from shardsim.specs.model.arch import Arch, Shape
from shardsim.specs.model.describe import read_model_file
from shardsim.specs.model.hf_config import read_hf_model
from shardsim.specs.model.library import PRESETS

WorkloadSpec = str | Arch  # what `RunConfig.workload` holds
NO_SHAPE = Shape()


def spec_name(spec: WorkloadSpec) -> str:
    return spec.label() if isinstance(spec, Arch) else spec


def display_name(spec: WorkloadSpec, shape: Shape = NO_SHAPE) -> str:
    """What a workload is called in a header: a config.json by its model's name and sequence length
    (`spec_name` stays the key results are filed under: the path)."""
    return resolve_arch(spec, shape)[0]


def resolve_arch(spec: WorkloadSpec, shape: Shape = NO_SHAPE, where: str | None = None) -> tuple[str, Arch | None]:
    """The name and `Arch` of a description; None for an import path (a model built by Python)."""
    if isinstance(spec, Arch):
        name, arch = spec.label(), spec
    elif spec in PRESETS:
        name, arch = spec, PRESETS[spec]
    elif spec.endswith((".yaml", ".yml")):
        name, arch = spec, read_model_file(spec)[0]
    elif spec.endswith(".json"):
        name, arch = read_hf_model(spec)  # named after the model, its sequence length stated
    elif ":" in spec:
        if shape.given():
            field = next(iter(shape.given()))
            raise ConfigError(f"applies to described models, not to the import path {spec!r}", where=where, field=field)
        return spec, None
    else:
        others = "(or a model .yaml, a config.json, pkg.module:build_fn)"
        raise ConfigError(
            f"unknown workload {spec!r}; {suggest(spec, PRESETS)} {others}", where=where, field="workload"
        )
    shaped = shape.apply(arch, where)
    changed = [f"{k}={v}" for k, v in shape.given().items() if getattr(arch, k) != v]
    if isinstance(spec, str) and spec.endswith(".json") and arch.traits.tokens == "text":
        changed = [c for c in changed if not c.startswith("seq_len=")] + [f"seq_len={shaped.seq_len}"]
    if changed and not isinstance(spec, Arch):
        name = f"{name} {' '.join(changed)}"
    return (shaped.label() if isinstance(spec, Arch) else name), shaped
