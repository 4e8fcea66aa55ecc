"""A sweep's predictions as Ray tasks (`shardsim sweep --executor ray`), on a Ray instance started
here (no address) or on an existing cluster (``--address ray://head:10001``, ``auto``).

Each configuration is one task (`predict_row`, the local executor's function: the same rows);
the workload goes to the object store once. Results stream back (`ray.wait`) in the order they
finish and are placed by index, so the rows and their order are the local executor's. The
cluster must run this shardsim: each task returns its code's fingerprint, and a worker whose
code differs from the driver's stops the sweep (its rows would go into this one's cache).

Ray is started on the first prediction (a sweep served whole by the cache never starts it).
Stopping (`close`, and on Ctrl-C or any error) is fast: a local instance is disconnected from
and its processes (GCS, raylet, its workers and agents) are killed at once — Ray's own
`ray.shutdown()` gives each a grace period (1.5 s here, more after an interrupt) that the
Ctrl-C promise (exit in 2 s) cannot afford; on a cluster, the tasks still queued or running
are cancelled (`ray.cancel(force=True)`) and the driver disconnects, the cluster stays up.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shardsim.core import interrupts
from shardsim.core.errors import ConfigError
from shardsim.specs.model.workload import Workload
from shardsim.sweep.space import Candidate
from shardsim.sweep.task import default_workers, predict_row

INSTALL = "pip install 'shardsim[ray]'"
WAIT_S = 0.1  # ray.wait's timeout: how often the driver returns to Python (a Ctrl-C is seen within it)
CONNECT_TIMEOUT_S = 5.0  # how long a cluster's address has to accept a connection before Ray is handed it
INIT_TIMEOUT_S = 8.0  # how long Ray then has to join the cluster (a port that is no Ray's: Ray retries for minutes)
FORMS = "HOST:PORT, ray://HOST:PORT or auto"  # the addresses --address takes

log = logging.getLogger("shardsim.ray")


def parse_address(address: str) -> tuple[str, int] | None:
    """The host and port a cluster's `address` names (None for ``auto``: Ray finds the cluster
    this machine runs); a ConfigError naming the forms it takes when it names none."""
    text = address.strip()
    if text == "auto":
        return None
    rest = text.removeprefix("ray://")
    bad = ConfigError(f"--address {address!r} is not a Ray cluster's address ({FORMS})", field="address")
    if not rest or "://" in rest or any(ch.isspace() or ch in "/?#" for ch in rest):
        raise bad
    try:
        parts = urllib.parse.urlsplit(f"//{rest}")
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number, or out of range
        raise bad from None
    if not host or not port:
        raise bad
    return host, port


def check_reachable(address: str, host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """A ConfigError, within `timeout`, where nothing at `host`:`port` accepts a connection (Ray
    itself retries for minutes)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        why = f"no answer in {timeout:g} s" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise ConfigError(f"cannot reach a Ray cluster at {address}: {why.lower()}", field="address") from None


class _ThroughShardsim(logging.Handler):
    """Ray's log records as this program's diagnostics: one line each, prefixed ``shardsim: ray:``."""

    def emit(self, record: logging.LogRecord) -> None:
        log.log(record.levelno, "ray: %s", record.getMessage())


_RAY_RECORDS = _ThroughShardsim()
_RAY_RECORDS.addFilter(logging.Filter("ray"))


def _quiet_ray() -> None:
    """Ray's log records reach stderr only through this program's logger (`_ThroughShardsim`),
    errors and worse (no "Started a local Ray instance" and the like): Ray's own handler goes,
    and its records go up to the root logger, where this handler takes them (``ray.init``
    clears the handlers of Ray's logger itself)."""
    ray_log = logging.getLogger("ray")
    ray_log.handlers.clear()
    ray_log.propagate = True
    ray_log.setLevel(logging.ERROR)
    root = logging.getLogger()
    if _RAY_RECORDS not in root.handlers:
        root.addHandler(_RAY_RECORDS)


def require_ray() -> None:
    """ConfigError (one line, exit 2) naming the extra to install where Ray is not installed."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(f"--executor ray needs Ray: {INSTALL}", field="executor") from None


def _init_within(ray: Any, kw: dict[str, Any], timeout: float, address: str) -> None:
    """`ray.init(**kw)` bounded by `timeout`: on a thread of its own, whose exception is raised
    here; a ConfigError where it has not joined the cluster in time (the thread is left to the
    process's end, a daemon)."""
    failure: list[BaseException] = []

    def init() -> None:
        try:
            ray.init(**kw)
        except BaseException as exc:  # raised in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=init, name="ray-init", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ConfigError(
            f"no Ray cluster answered at {address} in {timeout:g} s (the port accepts connections, but not as "
            "a Ray head's)",
            field="address",
        )
    if failure:
        raise failure[0]


def _remote_task(c: Candidate, w: Workload, algo: str) -> tuple[dict[str, Any], str]:
    """In a Ray worker: the row, and the fingerprint of the code that predicted it."""
    from shardsim.sweep.cache import code_fingerprint

    return predict_row(c, w, algo), code_fingerprint()


def _descendants(pid: int) -> list[int]:
    """`pid`'s child processes and theirs (Linux: /proc), children before their own."""
    try:
        kids = [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    out: list[int] = []
    for kid in kids:
        out += [kid, *_descendants(kid)]
    return out


class RayExecutor:
    """Runs `predict_all`'s predictions as Ray tasks; a context manager that stops Ray at its end.

    address: None starts a local instance of `workers` CPUs (default: this machine's cores);
    "auto", "ray://head:10001", ...: an existing cluster, its CPUs being the workers."""

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        require_ray()
        self._target = None if address is None else parse_address(address)
        self.address = address
        self.workers = workers or default_workers()
        self._started = False
        self._local_node: Any = None  # the Ray node this process started (None on a cluster)

    def _start(self) -> None:
        import ray

        _quiet_ray()
        kw: dict[str, Any] = {
            "include_dashboard": False,
            "configure_logging": False,  # Ray's logger stays routed through this program's
            "log_to_driver": False,  # the tasks print nothing; an error comes back as the task's
        }
        if self.address is None:
            kw |= {"address": "local", "num_cpus": self.workers}
        else:
            if self._target is not None:
                check_reachable(self.address, *self._target)
            kw["address"] = self.address.strip()
        from ray._private import worker as ray_worker  # the node this process starts (a local instance)

        try:
            if self.address is None:
                ray.init(**kw)
            else:
                _init_within(ray, kw, INIT_TIMEOUT_S, self.address)
        except BaseException as exc:  # Ctrl-C while it starts, or no cluster there: nothing left running
            node = getattr(ray_worker, "_global_node", None)
            if self.address is None and node is not None and hasattr(node, "all_processes"):
                self._kill_local(node)
            if isinstance(exc, ConnectionError):
                raise ConfigError(f"cannot reach a Ray cluster at {self.address}: {exc}", field="address") from None
            if isinstance(exc, ValueError) and str(self.address).startswith("ray://"):  # Ray Client not installed
                raise ConfigError(
                    f"--address {self.address} needs Ray Client: pip install 'ray[client]'", field="address"
                ) from None
            raise
        self._started = True
        if self.address is None:
            self._local_node = getattr(ray_worker, "_global_node", None)

    def predict(
        self,
        cands: Sequence[Candidate],
        index: Sequence[int],
        workload: Workload,
        algo: str,
        done: Callable[[int, dict[str, Any]], None],
        progress: Callable[[int, int, float], None] | None,
        meanwhile: Callable[[], object] | None,
    ) -> None:
        """`done(index[i], row)` for each of `cands`, as their tasks finish (the most expensive submitted first)."""
        import ray

        from shardsim.sweep.cache import code_fingerprint

        if not self._started:
            self._start()
        n = len(cands)
        total = sum(c.cost_estimate for c in cands)
        task = ray.remote(num_cpus=1, max_retries=0)(_remote_task)
        refs: dict[Any, int] = {}
        try:
            w = ray.put(workload)
            for i in sorted(range(n), key=lambda i: (-cands[i].cost_estimate, i)):
                refs[task.remote(cands[i], w, algo)] = i
            if progress:
                progress(0, n, 0.0)
            if meanwhile:
                meanwhile()
            mine = code_fingerprint()
            pending, finished, spent = list(refs), 0, 0.0
            while pending:
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=WAIT_S, fetch_local=True)
                for ref in ready:
                    try:
                        row, theirs = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:  # the task's own error, as the local executor raises it
                        cause = getattr(exc, "cause", None)
                        if isinstance(cause, Exception):
                            raise cause from None
                        raise
                    if theirs != mine:
                        raise ConfigError(
                            "the Ray cluster runs other shardsim code than this one (install this version there)",
                            field="address",
                        )
                    i = refs[ref]
                    done(index[i], row)
                    finished += 1
                    spent += cands[i].cost_estimate
                    if progress:
                        progress(finished, n, spent / total if total > 0 else finished / n)
        except BaseException:  # Ctrl-C or an error: stop the tasks (and a local Ray) now
            self._abort(list(refs))
            raise

    def _abort(self, refs: list[Any]) -> None:
        import ray

        if self._local_node is None:
            for ref in refs:  # on a cluster: its workers stop these tasks; done ones ignore it
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - a task already gone: nothing to cancel
                    pass
        self.close()

    def close(self) -> None:
        """Stop: disconnect, and kill the processes of a local instance (`_kill_local`)."""
        if not self._started:
            return
        self._started = False
        import ray

        node, self._local_node = self._local_node, None
        if node is None or not hasattr(node, "all_processes") or not Path("/proc/self/task").exists():
            ray.shutdown()  # a cluster (disconnect only), or no way to find the processes: Ray's own
            return
        self._kill_local(node)

    @staticmethod
    def _kill_local(node: Any) -> None:
        """Disconnect from the local node, then SIGKILL its processes and theirs (found before:
        once the raylet is gone, its workers belong to init). What bends Ray's way: `ray.shutdown`
        is told there is no node to stop (`_global_node` None) so that it only disconnects."""
        import ray
        from ray._private import worker as ray_worker

        procs = [info.process for infos in node.all_processes.values() for info in infos]
        tree = [pid for p in procs for pid in (p.pid, *_descendants(p.pid))]
        ray_worker._global_node = None
        adopting = interrupts.adopt_orphans(True)  # the raylet's agents and workers are reaped here
        try:
            ray.shutdown()
        finally:
            for pid in tree:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for p in procs:
                p.wait()
            for pid in tree:  # parents before their children: each is this process's once its parent is gone
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:  # reaped already, or never this process's
                    pass
            if adopting:
                interrupts.adopt_orphans(False)

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
