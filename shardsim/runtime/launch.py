"""Launch one machine's ranks with torchrun, watch them, explain a failure.

`launch` runs ``python -m torch.distributed.run --standalone ... -m shardsim.runtime.train ...`` (a
free port on this machine), hands the ranks the configuration as JSON in the run folder
(`CONFIG_FILE`, read by each rank: nothing is parsed twice), and follows each
rank through the files of `runtime.status`. When the job fails it names the rank that
crashed, died or hung. A job whose every rank reported that it finished has succeeded, even
if a process then dies as it ends (torchrun's exit status says so; -v notes it in one line).

The job lives and dies with the launcher. As soon as one rank fails (an error, a death, a
timeout waiting for a hung peer) the others get `FAILURE_GRACE_S` to report, then torchrun and
every rank are killed at once (SIGKILL: a stopped or hung rank cannot delay it, and nothing is
left to print). Ctrl-C and SIGTERM reach the launcher only (torchrun runs in a process group of
its own) and end the job the same way. torchrun gets SIGKILL when the launcher dies, and each
rank when torchrun dies or the launcher is gone (``$SHARDSIM_LAUNCHER``, `runtime.processes`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shardsim.config import RunConfig
from shardsim.runtime.emulation.plan import EmulatedCluster
from shardsim.runtime.emulation.processes import run_in_node, torchrun_argv
from shardsim.runtime.processes import LAUNCHER_ENV, ProcessRef, alive, die_with_parent, kill_tree

log = logging.getLogger("shardsim")

MONITOR_INTERVAL_S = 0.5  # torchrun's poll of its workers (leaves time for peers to report)
SHUTDOWN_TIMEOUT_S = 2  # torchrun's own wait between SIGTERM and SIGKILL to a rank, should it end them first
TORCHRUN_FLAGS = (
    "--max-restarts=0",
    f"--monitor-interval={MONITOR_INTERVAL_S}",
    f"--shutdown-timeout={SHUTDOWN_TIMEOUT_S}",
)
CONFIG_FILE = "config.json"  # in the run folder ($SHARDSIM_RUN_DIR): the configuration every rank runs
RUN_DIR_PREFIX = "shardsim-run-"  # + the launcher's pid.start: a folder of a launcher that is gone is stale
POLL_S = 0.25  # the launcher's poll of the ranks' status files: a few wake-ups a second only
FAILURE_GRACE_S = 2.0  # once a rank failed (or a node's torchrun), the others get this long to report


@dataclass
class RankView:
    rank: int
    pid: int | None = None
    ref: ProcessRef | None = None  # the process itself (a later one may reuse its pid)
    step: int | None = None
    status: dict | None = None
    died_at: float | None = None  # when the launcher first saw the process gone


@dataclass
class LaunchResult:
    returncode: int  # torchrun's exit status
    ok: bool
    message: str  # one line: what went wrong (empty when ok)
    ranks: dict[int, RankView] = field(default_factory=dict)
    leftover_killed: list[int] = field(default_factory=list)
    wall_s: float = 0.0


def write_config(run_dir: Path, cfg: RunConfig) -> Path:
    """The resolved configuration as the ranks read it: JSON (`RunConfig.to_json`) in the run folder."""
    path = run_dir / CONFIG_FILE
    path.write_text(cfg.to_json() + "\n")
    return path


def torchrun_flags(run_dir: Path) -> list[str]:
    """`TORCHRUN_FLAGS` and torchrun's log folder (error files) inside the run folder, which
    goes when the run ends (torchrun's default, a new /tmp/torchelastic_* each time, stays)."""
    return [*TORCHRUN_FLAGS, f"--log-dir={run_dir / 'torchrun'}"]


def torchrun_command(nproc: int, worker_args: list[str], flags: Sequence[str] = TORCHRUN_FLAGS) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *flags,
        "-m",
        "shardsim.runtime.train",
        *worker_args,
    ]


def free_port() -> int:
    """A TCP port free on this machine now (for a rendezvous in fresh namespaces, any port works
    as well; a new one per run avoids waiting on sockets of the last run in TIME_WAIT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def remove_stale_run_dirs() -> list[Path]:
    """Remove the run folders (status files, torchrun's logs) of launchers that are gone: one
    killed outright (SIGKILL) had no time to. Returns them."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}*.*-*"):
        owner = ProcessRef.parse(path.name.removeprefix(RUN_DIR_PREFIX).split("-")[0].replace(".", ":"))
        if owner is not None and not owner.alive():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _read_json(path: Path) -> dict | None:

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _refresh(run_dir: Path, views: dict[int, RankView], now: float) -> None:
    for r, v in views.items():
        if v.pid is None:
            start = _read_json(run_dir / f"rank{r}.start")
            if start:
                v.pid = int(start["pid"])
                v.ref = ProcessRef(v.pid, int(start["start"])) if start.get("start") else ProcessRef.of(v.pid)
        if v.status is None:
            v.status = _read_json(run_dir / f"rank{r}.json")
        try:
            v.step = int((run_dir / f"rank{r}.step").read_text().strip() or -1)
        except (OSError, ValueError):
            pass
        if v.pid is not None and v.died_at is None and not alive(v.pid):
            v.died_at = now
            if v.status is None:  # it may have reported just before it ended
                v.status = _read_json(run_dir / f"rank{r}.json")


def failed_ranks(views: dict[int, RankView]) -> list[int]:
    """Ranks that reported a failure or ended without reporting: the job cannot finish."""
    return [
        v.rank
        for v in views.values()
        if (v.status and v.status.get("status") != "ok") or (v.status is None and v.died_at is not None)
    ]


def _names(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, sorted(ranks)))


def diagnose(views: dict[int, RankView], returncode: int, timeout_s: float) -> str:
    """One line naming the rank that crashed, died or hung (see module docstring)."""
    errors = [v for v in views.values() if v.status and v.status.get("status") == "error"]
    if errors:
        v = min(errors, key=lambda v: v.status["time"])
        s = v.status
        if s.get("type") == "WriteError":  # every step ran and was measured: the result is what is missing
            return f"rank {v.rank} ran every step but could not write the result: {s.get('message')}"
        return f"rank {v.rank} failed at step {s.get('step')}: {s.get('type')}: {s.get('message')}"
    reported = sorted(
        (v for v in views.values() if v.status and v.status.get("status") in ("timeout", "peer")),
        key=lambda v: v.status["time"],
    )
    silent = [v for v in views.values() if not v.status]
    if silent and all(v.pid is None for v in views.values()):
        return f"torchrun exited with status {returncode} before any rank started (see its output above)"
    started = [v for v in silent if v.pid is not None]
    # A rank that dies closes its connections: its peers fail at once ("peer"). A rank that
    # hangs keeps them open: its peers wait for the timeout first ("timeout").
    first = reported[0].status["status"] if reported else None
    if first != "timeout":
        died = sorted((v for v in started if v.died_at is not None), key=lambda v: v.died_at)
        if died:
            v = died[0]
            also = f" (and {_names([d.rank for d in died[1:]])})" if len(died) > 1 else ""
            lost = f"; {_names([r.rank for r in reported])} then lost it" if reported else ""
            return (
                f"rank {v.rank} (pid {v.pid}) died at step {v.step} without reporting an error "
                f"(killed by a signal, or exited abruptly){also}{lost}"
            )
    timeouts = [v.rank for v in reported if v.status["status"] == "timeout"]
    if timeouts and started:
        steps = sorted({v.step for v in started if v.step is not None})
        at = f" at step {steps[0]}" if len(steps) == 1 else ""
        return (
            f"{_names([v.rank for v in started])} stopped responding{at}: {_names(timeouts)} timed out after "
            f"{timeout_s:g} s waiting for it in a collective"
        )
    if timeouts:
        return f"{_names(timeouts)} timed out after {timeout_s:g} s waiting in a collective"
    if reported:
        return f"{_names([v.rank for v in reported])} lost a peer: {reported[0].status.get('message')}"
    return f"torchrun exited with status {returncode} (see its output above)"


def _kill_leftovers(views: dict[int, RankView], wait_s: float = 5.0) -> list[int]:
    """SIGKILL every rank of `views` still running; returns their ranks once they are gone (or
    `wait_s` passed: one stuck in the kernel goes when it can)."""
    killed = {v.rank: v.ref for v in views.values() if v.ref is not None and v.ref.kill()}
    deadline = time.monotonic() + wait_s
    while any(ref.alive() for ref in killed.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return sorted(killed)


def launch(
    nproc: int,
    worker_args: list[str],
    *,
    timeout_s: float,
    threads: int = 1,
    stdout=None,
    extra_env: dict[str, str] | None = None,
    straggler_grace_s: float | None = None,
    cluster: EmulatedCluster | None = None,
    config: RunConfig | None = None,
) -> LaunchResult:
    """Run torchrun with `nproc` ranks of runtime.train and wait for it.

    With `cluster` (an emulated cluster that is up) `nproc` is the world size: one torchrun per
    emulated node starts in that node's namespace (``ip netns exec``), its ranks numbered
    node-major, the rendezvous on node 0's address, gloo bound to the node's shaped NIC.
    A rank that is still running `straggler_grace_s` (default 2 x timeout + 10 s) after
    another finished cleanly is taken as hung outside any collective: the job is ended. `config`
    goes to the ranks as `CONFIG_FILE` in the run folder (``$SHARDSIM_RUN_DIR``)."""
    me = ProcessRef.of(os.getpid())
    remove_stale_run_dirs()
    run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{me.pid}.{me.start}-" if me else RUN_DIR_PREFIX))
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    if cluster is None:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this machine
    else:
        # the namespaces have no name service: c10d warns once per connection that it cannot
        # look up the peer's host name (harmless); keep errors only, unless the user says otherwise
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    env["SHARDSIM_RUN_DIR"] = str(run_dir)
    if config is not None:
        write_config(run_dir, config)
    env["TMPDIR"] = str(run_dir)  # torchrun's torchelastic_* folders (and the ranks' temporaries) go with it
    env.update(extra_env or {})
    env[LAUNCHER_ENV] = str(me)  # the ranks end when this process is gone
    grace = straggler_grace_s if straggler_grace_s is not None else 2 * timeout_s + 10
    views = {r: RankView(r) for r in range(nproc)}
    t0 = time.monotonic()
    procs: list[subprocess.Popen] = []
    forced = ""
    failing_since: float | None = None
    ended = False  # the launcher killed the job (its ranks are gone already)
    try:
        procs = _start(nproc, worker_args, env, stdout, cluster, torchrun_flags(run_dir))
        while True:
            # sleep, then poll: Popen.wait(timeout) would wake up every few milliseconds
            time.sleep(POLL_S)
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                rc = next((c for c in codes if c), 0)
                break
            now = time.time()
            _refresh(run_dir, views, now)
            if failing_since is None and (any(codes) or failed_ranks(views)):
                failing_since = now
            if failing_since is not None and now - failing_since > FAILURE_GRACE_S:
                # the others had their time to report; a hung rank (one a peer timed out waiting
                # for, or one stopped) would keep torchrun waiting: end the job now
                _end(procs, views)
                rc = next((c for c in codes if c), None) or next((p.returncode for p in procs if p.returncode), 0)
                ended = True
                break
            done = [v.status["time"] for v in views.values() if v.status and v.status.get("status") == "ok"]
            if done and now - min(done) > grace:
                late = [v.rank for v in views.values() if not v.status]
                forced = f"{_names(late)} did not finish within {grace:g} s after the others (hung?)"
                rc, ended = _end(procs, views), True
                break
    except BaseException:  # Ctrl-C, SIGTERM, an error starting torchrun: nothing may outlive the launcher
        _refresh(run_dir, views, time.time())
        _end(procs, views)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    _refresh(run_dir, views, time.time())
    leftovers = [] if ended else _kill_leftovers(views)
    ok = not forced and all(v.status and v.status.get("status") == "ok" for v in views.values())
    if ok and rc:
        log.debug("every rank finished; torchrun then exited with status %d (a process died as it ended)", rc)
    message = "" if ok else (forced or diagnose(views, rc, timeout_s))
    if leftovers:
        message += f" ({_names(leftovers)} outlived torchrun and were killed)"
    shutil.rmtree(run_dir, ignore_errors=True)
    return LaunchResult(rc, ok, message, views, leftovers, time.monotonic() - t0)


def _torchrun_setup(launcher_pid: int):
    """What torchrun's process does before exec (a ``preexec_fn``): a process group of its own, so
    that Ctrl-C at the terminal reaches the launcher only (which ends the job, quietly); SIGKILL
    when the launcher dies; writing to the terminal never stops it (SIGTTOU ignored: its group
    is not the terminal's foreground one)."""

    def setup() -> None:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        die_with_parent()
        if os.getppid() != launcher_pid:  # the launcher died before the line above
            os._exit(1)

    return setup


def _start(
    nproc: int,
    worker_args: list[str],
    env: dict[str, str],
    stdout,
    cluster: EmulatedCluster | None,
    flags: Sequence[str] = TORCHRUN_FLAGS,
) -> list[subprocess.Popen]:
    # torchrun stays in our session: a new session is a new scheduler autogroup on Linux, which
    # measurably slowed the ranks on a loaded machine; only its process group is its own
    popen = dict(stdin=subprocess.DEVNULL, stdout=stdout, preexec_fn=_torchrun_setup(os.getpid()))
    if cluster is None:
        return [subprocess.Popen(torchrun_command(nproc, worker_args, flags), env=env, **popen)]
    if nproc != cluster.world:
        raise ValueError(f"an emulated run has {cluster.world} ranks, not {nproc}")
    port = free_port()
    procs = []
    try:
        for i in range(len(cluster.nodes)):
            argv = torchrun_argv(
                cluster, i, ["-m", "shardsim.runtime.train", *worker_args], master_port=port, extra=flags
            )
            # `ip netns exec` execs torchrun in place: the process group and parent-death signal carry over
            procs.append(run_in_node(cluster, i, argv, env=env, start_new_session=False, **popen))
    except BaseException:
        _end(procs, {})
        raise
    return procs


def _end(procs: list[subprocess.Popen], views: dict[int, RankView]) -> int:
    """Kill every torchrun still running, its ranks and any rank of `views` that outlived it, at
    once (SIGKILL: nothing waits on a hung rank, nothing prints). Returns the first non-zero exit
    status of a torchrun."""
    ranks = tuple(v.ref for v in views.values() if v.ref is not None)
    for p in procs:
        if p.poll() is None:
            kill_tree(p.pid, ranks)
    _kill_leftovers(views)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:  # a process stuck in the kernel: it goes when it can
            pass
    return next((p.returncode for p in procs if p.returncode), 0)
