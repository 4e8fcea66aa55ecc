"""`shardsim sweep --executor ray`: the same rows as the local executor, the cache consulted before
anything goes to Ray, Ctrl-C ends the sweep and every Ray process at once, and without Ray one
line naming the extra. Ray takes seconds to start: the tests that start it are few and marked
`ray` (CI runs them; `-m "not ray"` leaves them out locally)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.cli import main
from shardsim.config import RunConfig
from shardsim.core.errors import ConfigError
from shardsim.sweep.cache import ResultCache
from shardsim.sweep.ray_executor import CONNECT_TIMEOUT_S
from shardsim.sweep.search import sweep
from shardsim.sweep.space import SweepSpace
from tests.unit.test_sweep_interrupt import CTRL_C_PROMISE_S, _cpu_ticks

NO_RAY_REFUSAL_S = 15.0  # docs/simulator.md: a port that is no Ray head's is refused within 15 s of the start

TINY = RunConfig(workload="tiny-gpt", topology="g4dn.12xlarge", nodes=2)
SPACE = SweepSpace(strategies=("ddp", "zero", "zero2d", "pipeline"), pp=(2,))


def _need_ray() -> None:
    """Skip where Ray is not installed, but not in CI: its test command installs shardsim[ray]."""
    try:
        import ray  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("ray is not installed (pip install 'shardsim[ray]')")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_ray_rows_are_the_local_executors_and_no_ray_process_outlives_them(tmp_path) -> None:
    """On one local Ray instance (each start costs 5-20 s here): the rows are the local pool's,
    only the cache's misses go to Ray, the pruned search simulates there and answers the same;
    then every process of the instance (GCS, raylet, its dashboard agent and workers) is gone,
    reaped: none left as a zombie (where the system's first process reaps none, one whose parent
    was killed would stay)."""
    _need_ray()
    from shardsim.sweep.ray_executor import RayExecutor

    local = sweep(TINY, SPACE, workers=1).table
    wider = replace(SPACE, checkpointing=("full", "none"))
    before = set(_tree(os.getpid()))
    with RayExecutor(workers=2) as ex:
        with ResultCache(tmp_path) as cache:
            on_ray = sweep(TINY, SPACE, executor=ex, cache=cache).table
            assert (cache.hits, cache.simulated) == (0, len(local))
        pd.testing.assert_frame_equal(on_ray, local, check_exact=True)
        with ResultCache(tmp_path) as cache:
            both = sweep(TINY, wider, executor=ex, cache=cache).table
            assert (cache.hits, cache.simulated) == (len(local), len(both) - len(local))
        pruned = sweep(TINY, wider, executor=ex, prune=True, keep=3).table  # its simulations on Ray
        ray_procs = {p: _title(p) for p in _tree(os.getpid()) if p not in before}
    assert any(t.startswith("ray::") for t in ray_procs.values()), ray_procs
    time.sleep(0.5)
    left = {p: t for p, t in ray_procs.items() if Path(f"/proc/{p}").exists()}
    assert not left, f"Ray processes left (running or defunct): {left}"
    pd.testing.assert_frame_equal(both, sweep(TINY, wider, workers=1).table, check_exact=True)
    pd.testing.assert_frame_equal(pruned, sweep(TINY, wider, workers=1, prune=True, keep=3).table, check_exact=True)


def _tree(pid: int) -> list[int]:
    try:
        kids = [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return [p for k in kids for p in (k, *_tree(k))]


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (one whose parent has not reaped it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_ctrl_c_ends_a_ray_sweep_and_every_ray_process_at_once(tmp_path) -> None:
    _need_ray()
    # eight ZeRO-2D configurations of 220 micro-steps (seconds per prediction), as the local pool's test
    sweep_args = "sweep --strategies zero2d --degrees 2,4,8,16 --grad-accum 220 --checkpointing none,full"
    argv = [sys.executable, "-m", "shardsim.cli", *sweep_args.split(), "--executor", "ray", "--workers", "2"]
    argv += ["--no-progress", "--no-cache"]
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180  # Ray starts in 5-20 s on a loaded 2-core machine
        busy: list[int] = []
        while time.monotonic() < deadline and proc.poll() is None:
            tasks = [p for p in _tree(proc.pid) if _title(p).startswith("ray::_remote_task")]
            if len(tasks) >= 2 and all(_cpu_ticks(p) > 20 for p in tasks):
                busy = tasks
                break
            time.sleep(0.1)
        assert len(busy) >= 2, "Ray did not start predicting on two workers"
        ray_procs = _tree(proc.pid)  # GCS, raylet, agents, workers
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(f"Ctrl-C -> exit {took:.2f} s; {len(ray_procs)} Ray processes")
    assert proc.returncode == 130
    assert err == "shardsim: interrupted\n", err
    assert took < CTRL_C_PROMISE_S, f"exited {took:.1f} s after Ctrl-C"
    gone = time.monotonic() + 2
    while any(_running(p) for p in ray_procs) and time.monotonic() < gone:
        time.sleep(0.05)
    left = [f"{p} {_title(p)}" for p in ray_procs if _running(p)]
    assert not left, f"Ray processes outlived the sweep: {left}"


def test_without_ray_one_line_names_the_extra(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    assert main(["sweep", "--executor", "ray", "--workload", "tiny-gpt", "--nodes", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'shardsim[ray]'" in err, err


def test_address_needs_the_ray_executor(capsys) -> None:
    assert main(["sweep", "--address", "auto", "--workload", "tiny-gpt", "--nodes", "2"]) == 2
    assert "--executor ray" in capsys.readouterr().err


def test_a_ray_client_address_without_a_cluster_is_one_line(capsys) -> None:
    """`ray://` needs Ray Client (`ray[client]`) and a cluster there: without either, one line naming
    the address, exit 2, and no traceback."""
    argv = ["sweep", "--executor", "ray", "--address", "ray://127.0.0.1:1", "--workload", "tiny-gpt", "--no-cache"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ray://127.0.0.1:1" in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "address", ["not a url", "", "  ", "127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1", "http://127.0.0.1:1", "ray://"]
)
def test_a_bad_address_is_one_line_naming_it(capsys, address) -> None:
    _need_ray()
    argv = ["sweep", "--executor", "ray", "--address", address, "--workload", "tiny-gpt", "--nodes", "2", "--no-cache"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--address {address!r} is not a Ray cluster's address" in err, err


@given(
    host=st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True),
    port=st.integers(1, 65535),
    client=st.booleans(),
)
@settings(derandomize=True, database=None)
def test_host_and_port_are_read_from_an_address(host, port, client) -> None:
    _need_ray()
    from shardsim.sweep.ray_executor import parse_address

    assert parse_address(f"{'ray://' if client else ''}{host}:{port}") == (host, port)


@given(port=st.integers(65536, 10**9) | st.integers(-(10**6), 0))
@settings(derandomize=True, database=None, max_examples=30)
def test_a_port_out_of_range_is_bad_input(port) -> None:
    _need_ray()
    from shardsim.sweep.ray_executor import parse_address

    with pytest.raises(ConfigError, match="not a Ray cluster's address"):
        parse_address(f"127.0.0.1:{port}")


@pytest.mark.parametrize("address", ["127.0.0.1:1", "ray://127.0.0.1:1"])
def test_an_unreachable_address_is_one_line_within_the_connect_timeout(capsys, address) -> None:
    """Nothing listens on port 1: one line, exit 2, within the 5 s docs/simulator.md gives an
    address to accept a connection (Ray itself retried for minutes, printing its own lines)."""
    _need_ray()
    argv = ["sweep", "--executor", "ray", "--address", address, "--workload", "tiny-gpt", "--nodes", "2", "--no-cache"]
    t0 = time.monotonic()
    assert main(argv) == 2
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot reach a Ray cluster at {address}" in err, err
    assert took < CONNECT_TIMEOUT_S, f"{took:.1f} s"


@pytest.mark.slow
def test_a_port_that_is_no_rays_is_refused_within_15_s() -> None:
    """Something accepts connections there, but is not a Ray head (Ray itself retried for
    minutes): exit 2 and the refusal's line within 15 s of the command's start (docs/simulator.md:
    Ray's 8 s to join after the command and Ray have started), in a process of its own (the
    joining thread is left to that process's end)."""
    _need_ray()
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # the kernel completes the handshakes; nothing answers
        address = f"127.0.0.1:{server.getsockname()[1]}"
        argv = [sys.executable, "-m", "shardsim.cli", "sweep", "--executor", "ray", "--address", address]
        t0 = time.monotonic()
        done = subprocess.run(
            [*argv, "--workload", "tiny-gpt", "--nodes", "1", "--no-cache"], capture_output=True, text=True, timeout=60
        )
        took = time.monotonic() - t0
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        f"shardsim: error: field 'address': no Ray cluster answered at {address}"
    )
    assert took < NO_RAY_REFUSAL_S, f"{took:.1f} s"


def test_an_address_that_never_answers_is_one_line_after_the_connect_timeout(monkeypatch) -> None:
    _need_ray()
    from shardsim.sweep import ray_executor

    def silent(address, timeout):
        raise TimeoutError("timed out")

    monkeypatch.setattr(ray_executor.socket, "create_connection", silent)
    with pytest.raises(ConfigError, match=r"cannot reach a Ray cluster at 10\.0\.0\.1:6379: no answer in 5 s"):
        ray_executor.check_reachable("10.0.0.1:6379", "10.0.0.1", 6379)


def test_rays_log_records_are_this_programs_prefixed_lines(capsys) -> None:
    _need_ray()
    import logging

    from shardsim.cli.app import setup_logging
    from shardsim.sweep.ray_executor import _quiet_ray

    setup_logging(0)
    _quiet_ray()
    logging.getLogger("ray._private.worker").error("Failed to connect to GCS\nretrying")
    logging.getLogger("ray._private.worker").warning("Started a local Ray instance")  # below errors: not shown
    assert capsys.readouterr().err == "shardsim: ray: Failed to connect to GCS\\nretrying\n"
