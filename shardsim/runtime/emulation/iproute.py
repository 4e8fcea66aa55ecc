"""The `ip` and `tc` commands (iproute2) the emulated cluster is made with: the privileges they need,
one command bounded in time, the named network namespaces and the processes inside one."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

from shardsim.core.errors import ConfigError

_CMD_TIMEOUT_S = 30.0


class EmulationError(ConfigError):
    """The emulated cluster cannot be set up, torn down or measured (one line, CLI exit 2)."""


def check_privileges() -> None:
    """Refuse (ConfigError, one line) unless this process is root and has `ip` and `tc`."""
    if os.geteuid() != 0:
        raise EmulationError("the emulated cluster needs root (network namespaces and tc); run as root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise EmulationError(f"the emulated cluster needs `{tool}` (iproute2) on PATH; install iproute2")


def run_command(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """Run `argv` (an `ip` or `tc` command), output captured; EmulationError when it fails (with `check`) or
    takes over _CMD_TIMEOUT_S."""
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise EmulationError(f"`{' '.join(argv)}` did not finish in {_CMD_TIMEOUT_S:g} s") from None
    if check and res.returncode != 0:
        why = (res.stderr.strip() or res.stdout.strip() or f"exit status {res.returncode}").splitlines()[0]
        raise EmulationError(f"`{' '.join(argv)}` failed: {why}")
    return res


def existing_namespaces() -> set[str]:
    """Names of the named network namespaces on this machine (``ip netns list``)."""
    out = run_command(["ip", "netns", "list"]).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def namespace_pids(namespace: str) -> list[int]:
    """The pids of the processes in `namespace` (none when it does not exist)."""
    res = run_command(["ip", "netns", "pids", namespace], check=False)
    return [int(tok) for tok in res.stdout.split() if tok.isdigit()] if res.returncode == 0 else []
