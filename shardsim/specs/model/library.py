"""The model library: one YAML file a model under ``workload/library/`` (package data), each with
its shape, the source of that shape (the published config) and its published parameter count."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from shardsim.core.yamlio import Fields
from shardsim.data import MODELS
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.describe import read_model_file

LIBRARY_DIR = MODELS


@dataclass(frozen=True)
class LibraryModel:
    name: str
    arch: Arch
    source: str
    published_params: float | None  # None: not a published model
    params_source: str | None
    published_active: float | None = None  # a mixture of experts: the parameters a token uses, as published
    active_source: str | None = None


@cache
def library() -> dict[str, LibraryModel]:
    """Every library model by name (the file's stem), in file-name order."""
    out: dict[str, LibraryModel] = {}
    for path in sorted(LIBRARY_DIR.glob("*.yaml")):
        arch, info = read_model_file(path)
        f = Fields(info, str(path))
        published = f.number("params", required=False) if f.has("params") else None
        active = f.number("active_params", required=False) if f.has("active_params") else None
        out[path.stem] = LibraryModel(
            path.stem, arch, f.text("source"), published, f.source("params"), active, f.source("active_params")
        )
    return out


PRESETS: dict[str, Arch] = {name: m.arch for name, m in library().items()}
