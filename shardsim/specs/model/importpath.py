"""Resolve a workload given as ``pkg.module:build_fn`` (torch-free; the builder may import torch)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from shardsim.core.errors import ConfigError


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def resolve_import_path(path: str) -> Callable[[], Any]:
    mod_name, sep, attr = path.partition(":")
    if not sep or not mod_name or not attr:
        raise ConfigError(f"workload {path!r}: expected an import path 'pkg.module:build_fn'")
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)  # let a project's own modules be found, as `python -m` would
    try:
        obj: Any = importlib.import_module(mod_name)
    except ModuleNotFoundError as err:
        if err.name and mod_name.startswith(err.name):
            raise ConfigError(f"workload {path!r}: no module named {mod_name!r} (is it on PYTHONPATH?)") from None
        raise ConfigError(f"workload {path!r}: importing {mod_name!r} failed: {first_line(err)}") from None
    except Exception as err:  # the user's module raised while importing
        raise ConfigError(f"workload {path!r}: importing {mod_name!r} failed: {first_line(err)}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"workload {path!r}: module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"workload {path!r}: {attr!r} is not callable (expected a function that builds the model)")
    return obj
