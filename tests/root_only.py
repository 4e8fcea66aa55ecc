"""End-to-end tests that bring up an emulated cluster need root and iproute2 (`ip`, `tc`). Where
this machine lacks them such a test is skipped; under CI (`CI` set) it fails instead, in one
line, so that a CI without root never silently loses the end-to-end validation.

    from tests.root_only import needs_root

    @needs_root
    def test_...(): ...        # or `pytestmark = needs_root` for a whole module
"""

from __future__ import annotations

import os
import shutil

import pytest


def cannot_emulate() -> str | None:
    """Why this machine cannot bring up an emulated cluster, or None where it can."""
    if os.geteuid() != 0:
        return "the emulated cluster needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the emulated cluster needs iproute2 (ip, tc)"
    return None


def require_emulation() -> None:
    """Skip the calling test where the machine cannot emulate a cluster; fail it under CI."""
    reason = cannot_emulate()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: CI must run this end-to-end test (run CI as root with iproute2)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def emulation_host() -> None:
    """A test that takes this fixture runs only where an emulated cluster can come up (see the module)."""
    require_emulation()


needs_root = pytest.mark.usefixtures("emulation_host")
