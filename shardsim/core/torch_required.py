"""Whether PyTorch can be imported here, and the one line that says how to install it when not.

torch is not a dependency in pyproject.toml (an unpinned torch on a CPU machine pulls gigabytes
of CUDA packages), so a command that needs it checks first: `run`, `profile`, `validate`, and
any command given a model built by Python (``pkg.module:build_fn``)."""

from __future__ import annotations

import importlib.util
import shlex
import sys

from shardsim.core.errors import ConfigError

TORCH_VERSION = "2.13.0"  # the version the tests run against (the README's test command pins it)
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def install_command() -> str:
    """The pip command that installs the CPU build of the tested torch into this Python."""
    return shlex.join([sys.executable, "-m", "pip", "install", f"torch=={TORCH_VERSION}", "--index-url", CPU_INDEX])


def require_torch(what: str) -> None:
    """ConfigError (one line, exit status 2) naming the install command when torch cannot be
    found; `what` is what needs it, e.g. ``shardsim run``."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(
            f"{what} needs PyTorch, which is not installed here; install it with: {install_command()} "
            "(the CPU build; on a GPU machine the CUDA build of your choice, see https://pytorch.org/get-started/locally/)"
        )
