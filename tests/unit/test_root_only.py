"""tests/root_only.py: an end-to-end test that needs root skips without it, and fails under CI."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.root_only import cannot_emulate, require_emulation


def test_without_root_it_skips_and_under_ci_it_fails_in_one_line(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        require_emulation()
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="needs root: CI must run this end-to-end test") as err:
        require_emulation()
    assert "\n" not in str(err.value)


def test_without_tc_it_names_iproute2(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else "/usr/sbin/ip")
    assert cannot_emulate() == "the emulated cluster needs iproute2 (ip, tc)"
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="iproute2"):
        require_emulation()


def test_where_it_can_emulate_it_runs(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    monkeypatch.setenv("CI", "1")
    assert cannot_emulate() is None
    require_emulation()
