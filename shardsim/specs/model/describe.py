"""A model described without Python: a mapping of shape fields (inline in a run configuration,
or a model YAML file such as those of the library) read into a checked `Arch`; and `summary`, what
`shardsim workloads` says of a model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import Fields, load_yaml
from shardsim.specs.model.arch import Arch, check_arch, check_used
from shardsim.specs.model.registry import FAMILIES
from shardsim.specs.model.workload import Workload

ARCH_FIELDS = tuple(f.name for f in fields(Arch))
# Keys a model file may hold besides the shape: its name, where its shape comes from, and its
# published parameter counts ({value, source}): all of them, and (a mixture of experts) those a
# token uses.
INFO_KEYS = ("name", "source", "params", "active_params", "description")


def arch_from_mapping(data: Mapping[str, Any], where: str | None, prefix: str = "") -> Arch:
    """The `Arch` a mapping describes; ConfigError naming the field (with `prefix`) and `where`: a key
    that is neither a field nor an `INFO_KEYS` one is refused, and so is a field the family does not
    use given a value other than its default (as `Arch` written out whole holds)."""
    f = Fields(dict(data), where or "", prefix).closed((*ARCH_FIELDS, *INFO_KEYS))
    for name in ("params", "active_params"):
        if f.has(name):
            f.number(name)  # the published count: a figure, finite, as every figure is
    family = f.text("family", choices=FAMILIES)
    base = Arch(family, hidden=1, layers=1)
    check_used(family, (k for k in ARCH_FIELDS[1:] if f.has(k) and f.raw(k) != getattr(base, k)), where, prefix)
    values: dict[str, Any] = {"family": family}
    for name in ARCH_FIELDS[1:]:
        default = getattr(base, name)
        if name in ("hidden", "layers"):
            values[name] = f.integer(name)
        elif isinstance(default, bool):
            values[name] = f.boolean(name, default=default)
        elif isinstance(default, str):
            values[name] = f.text(name, default=default)
        else:
            values[name] = f.integer(name, default=default, minimum=0)
    try:
        return check_arch(Arch(**values), where)
    except ConfigError as err:
        if prefix and err.field:
            raise ConfigError(err.message, where=err.where, field=prefix + err.field) from None
        raise


def read_model_file(path: str | Path) -> tuple[Arch, dict[str, Any]]:
    """A model YAML file: its `Arch` and its other keys (name, source, params)."""
    data = load_yaml(Path(path))
    return arch_from_mapping(data, str(path)), {k: data[k] for k in INFO_KEYS if k in data}


def summary(
    w: Workload,
    *,
    published: float | None = None,
    source: str | None = None,
    published_active: float | None = None,
    active_source: str | None = None,
) -> dict[str, Any]:
    """What `shardsim workloads` says of a workload: its shape and counts, per sample (JSON-ready);
    a mixture of experts also its active parameters (those a token uses), its experts and their
    published active count."""
    a = w.arch
    out: dict[str, Any] = {"model": w.name, "family": a.family if a else None, "params": w.params}
    if w.moe:
        out["active_params"] = w.active_params
    out["layers"] = len(w.layers) if w.layers else len(w.blocks)
    out["other_blocks"] = [{"embed": "embedding", "head": "head"}[b.kind] for b in w.blocks if b.kind != "layer"]
    if a is not None:
        shape = {"hidden": a.hidden, "heads": a.heads, "kv_heads": a.kv, "ffn": a.ffn_size}
        if a.traits.tokens == "text":
            shape |= {"vocab": a.vocab, "seq_len": a.seq_len, "tied_embeddings": a.tied_embeddings}
        elif a.spec.embed == "patches":
            shape |= {"image": a.image, "patch": a.patch, "classes": a.classes}
        out |= shape | {"positions": a.position_kind}
    out |= {"tokens_per_sample": w.tokens_per_sample, "train_flops_per_sample": w.train_flops}
    out |= {"published_params": published, "source": source}
    if a is not None and a.spec.moe:
        out |= {"experts": a.experts, "top_k": a.top_k, "expert_ffn": a.expert_ffn_size, "shared_ffn": a.shared_ffn}
        out |= {"moe_layers": a.moe_layers, "published_active_params": published_active, "active_source": active_source}
    return out
