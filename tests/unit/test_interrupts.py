"""A signal ends the command it reaches with the signal's one line and status however the code
it lands in treats the KeyboardInterrupt: raised inside a finalizer (where Python can only print
it), turned into a library's own error, or swallowed for good (the deadline ends the command)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shardsim.cli import app
from shardsim.core import interrupts
from tests.unit.test_sweep_interrupt import CTRL_C_PROMISE_S


def _command(monkeypatch: pytest.MonkeyPatch, func) -> None:
    """`shardsim x` runs `func(ns)`."""
    parser = argparse.ArgumentParser(prog="shardsim")
    parser.add_argument("-v", dest="verbose", default=0)
    parser.add_argument("-q", dest="quiet", default=0)
    parser.add_subparsers().add_parser("x").set_defaults(func=func)
    monkeypatch.setattr(app, "build_parser", lambda: parser)


class _SignalsWhenCollected:
    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)  # its KeyboardInterrupt is raised inside this finalizer


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.001)


def test_an_interrupt_raised_inside_a_finalizer_still_ends_the_command(monkeypatch, capsys) -> None:
    def command(ns) -> int:
        _SignalsWhenCollected()  # collected at once
        _spin(2.0)  # where the interrupt is raised again
        return 0

    _command(monkeypatch, command)
    assert app.main(["x"]) == 130
    assert capsys.readouterr().err == "shardsim: interrupted\n"


@pytest.mark.parametrize(("sig", "status", "line"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")])
def test_an_interrupt_a_library_turns_into_its_own_error_still_ends_the_command(
    monkeypatch, capsys, sig, status, line
) -> None:
    def command(ns) -> int:
        try:
            signal.raise_signal(signal.Signals[sig])
        except KeyboardInterrupt as exc:  # as pydantic's serializer reports an error in a callback
            raise ValueError(f"Error calling function: {exc!r}") from None
        return 0

    _command(monkeypatch, command)
    assert app.main(["x"]) == status
    assert capsys.readouterr().err == f"shardsim: {line}\n"


def test_an_interrupt_swallowed_where_the_command_goes_on_still_ends_it(monkeypatch, capsys) -> None:
    def command(ns) -> int:
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        return 0

    _command(monkeypatch, command)
    assert app.main(["x"]) == 130
    assert capsys.readouterr().err == "shardsim: interrupted\n"
    assert app.main(["x"]) == 130  # a later command in this process: its own signal, not the first one's
    assert capsys.readouterr().err == "shardsim: interrupted\n"
    _command(monkeypatch, lambda ns: 0)
    assert app.main(["x"]) == 0  # and without one: the first one's is forgotten


def test_an_ordinary_error_after_no_signal_is_still_unexpected(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setenv("SHARDSIM_LOG_DIR", str(tmp_path))
    _command(monkeypatch, lambda ns: 1 / 0)
    assert app.main(["x"]) == 1
    assert "unexpected ZeroDivisionError" in capsys.readouterr().err


STUBBORN = textwrap.dedent(
    """
    import subprocess, sys, time
    from shardsim.cli import app

    def stubborn(argv):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL)
        told = False
        while True:
            try:
                if not told:
                    told = True
                    print(child.pid, flush=True)  # the signal comes after this
                time.sleep(60)
            except KeyboardInterrupt:
                pass  # swallowed, every time

    app._main = stubborn
    app.main()
    """
)


@pytest.mark.serial
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_a_command_that_swallows_every_interrupt_is_ended_after_its_grace() -> None:
    """docs/configuration.md (exit status 130): a command not stopped 1.2 s after the signal is
    ended, its processes killed, within the 2 s every interrupt is promised."""
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(proc.stdout.readline())
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stat = Path(f"/proc/{child}/stat")

    def state() -> str:
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return "gone"

    dies = time.monotonic() + 1  # a process SIGKILL reached ends once it is scheduled
    while child and state() not in ("Z", "gone") and time.monotonic() < dies:
        time.sleep(0.01)
    end = state() if child else "never started"
    if end not in ("Z", "gone", "never started"):
        os.kill(child, signal.SIGKILL)
    print(f"ended {took:.2f} s after Ctrl-C")
    assert proc.returncode == 130
    assert err == "shardsim: interrupted\n", err
    assert interrupts.GRACE_S <= took < CTRL_C_PROMISE_S
    assert end in ("Z", "gone"), "its child outlived it"


GUARDED = textwrap.dedent(
    """
    import sys, time
    from shardsim.cli import app
    from shardsim.core import interrupts

    def tearing_down(argv):
        with interrupts.guarded("emulated cluster"):
            try:
                print("up", flush=True)  # the signal comes after this
                time.sleep(60)
            except KeyboardInterrupt:
                time.sleep(2.5)  # a teardown longer than the grace: the deadline waits for it
                print("torn down", flush=True)
                raise

    app._main = tearing_down
    app.main()
    """
)


@pytest.mark.serial
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_the_deadline_waits_for_a_guarded_teardown() -> None:
    """An emulated cluster's teardown outlasts the grace after a signal: the deadline waits for it
    (the command then ends through its own path, 129 for SIGHUP), instead of leaving the cluster up."""
    proc = subprocess.Popen([sys.executable, "-c", GUARDED], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"
        proc.send_signal(signal.SIGHUP)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out == "torn down\n", (out, err)
    assert proc.returncode == 129, err
