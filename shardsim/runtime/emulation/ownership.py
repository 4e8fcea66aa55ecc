"""Who owns an emulated topology: one job at a time, or a cluster brought up by hand until it is
taken down.

The names of an emulated cluster's namespaces are the machine's, so whatever brings a cluster up
or down first holds its name (`plan.EmulatedCluster.prefix`):

* A holder takes an exclusive ``flock`` on ``<runtime dir>/<name>.lock`` (`runtime.lockfile`) for as
  long as it runs, and writes who it is (`Holder`) to ``<name>.json`` beside it. The kernel drops
  the lock when the process ends, however it ends.
* ``shardsim cluster up`` marks its hold as lasting until ``shardsim cluster down`` (`keep`): its
  record stays after it exits, and whoever takes the lock next finds it and treats the topology
  as held for as long as the cluster exists (`owning`'s `present`). ``cluster down`` takes it over
  (`take_kept`).
* A record found by a process that got the lock is stale unless it is a kept one whose cluster
  exists: its holder ended without letting go (killed). What it left is cleaned (`owning`'s `clean`).

When a topology is free, nothing of it is left in the runtime dir. The runtime dir is
``$SHARDSIM_RUNTIME_DIR``, else ``/run/shardsim`` (root: where ``ip netns`` keeps its names too),
else ``shardsim-<uid>`` in the temporary folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from shardsim.core import lockfile
from shardsim.core.files import atomic_write
from shardsim.runtime.emulation.iproute import EmulationError

log = logging.getLogger("shardsim")

POLL_S = 0.5  # how often a waiting process (--wait) tries again
_COMMAND_CHARS = 120  # a holder's command line is cut to this length in its record


@dataclass(frozen=True)
class Holder:
    """The process that holds a topology, as its record says."""

    pid: int
    command: str  # its command line, e.g. "shardsim run --topology emu-2x2 ..."
    since: float  # when it took the topology (seconds since the epoch)
    kept: bool = False  # brought up by `shardsim cluster up`: held until `shardsim cluster down`
    down: str = ""  # kept: the command that takes its cluster down

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} ({self.command}) since {when}"


def held_by(label: str, holder: Holder | None) -> str:
    """How `label` is held, in words: "in use by <holder>", or for a kept hold until when."""
    if holder is None:
        return "in use by another process"
    if holder.kept:
        down = holder.down or f"shardsim cluster down {shlex.quote(label)}"
        return f"up by hand, held by {holder.describe()} until `{down}`"
    return f"in use by {holder.describe()}"


class TopologyBusy(EmulationError):
    """Another job holds the topology (one line naming it; CLI exit 2)."""

    def __init__(self, label: str, holder: Holder | None):
        self.holder = holder
        super().__init__(
            f"{label} is {held_by(label, holder)}; pass --wait to wait for {'that' if holder and holder.kept else 'it'}"
        )


def runtime_dir() -> Path:
    """Where the locks and holders' records live (created when missing)."""
    given = os.environ.get("SHARDSIM_RUNTIME_DIR")
    candidates = (
        [Path(given)] if given else [Path("/run/shardsim"), Path(tempfile.gettempdir()) / f"shardsim-{os.getuid()}"]
    )
    for folder in candidates:
        try:
            folder.mkdir(mode=0o755, parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder
        except OSError:
            continue
    raise EmulationError(
        f"no writable folder for the emulated topologies' locks (tried {', '.join(map(str, candidates))})"
    )


def this_command() -> str:
    """This process's command line, as a user would have typed it."""
    argv = list(sys.argv) or ["python"]
    prog = Path(argv[0])
    entry = prog.name == "shardsim" or prog.parts[-2:] in (("cli", "__main__.py"), ("shardsim", "__main__.py"))
    argv[0] = "shardsim" if entry else prog.name
    text = shlex.join(argv)
    return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 3] + "..."


@dataclass
class _Hold:
    record: Path
    holder: Holder


_held: dict[str, _Hold] = {}  # the names this process holds (a hold is re-entrant within the process)


def read_holder(path: Path) -> Holder | None:
    """The record at `path`; None when there is none. An unreadable record counts as its holder's
    leftover (a holder killed mid-write cannot leave one: records are written atomically)."""
    try:
        data = json.loads(path.read_text())
        kept, down = bool(data.get("kept", False)), str(data.get("down", ""))
        return Holder(int(data["pid"]), str(data["command"]), float(data["since"]), kept, down)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return Holder(0, f"its record {path} is unreadable", path.stat().st_mtime if path.exists() else 0.0)


def holder_of(name: str) -> Holder | None:
    """Who holds `name` now, as far as its record says (None: nobody recorded)."""
    return read_holder(runtime_dir() / f"{name}.json")


@contextlib.contextmanager
def owning(
    name: str,
    *,
    label: str | None = None,
    wait: bool = False,
    present: Callable[[], bool] = lambda: False,
    clean: Callable[[Holder], None] = lambda stale: None,
    take_kept: bool = False,
) -> Iterator[Holder]:
    """Hold `name` for the block; yields this process's record.

    Refuses (`TopologyBusy`, naming the holder) when another process holds it, or when a kept
    hold's cluster still exists (`present()`), unless `take_kept` (``cluster down``); with `wait`
    it waits for them instead. A stale record is passed to `clean` first. Re-entrant within one
    process. `label` names the topology in messages (default `name`)."""
    if name in _held:  # held by an enclosing block of this process, which lets go of it
        yield _held[name].holder
        return
    label = label or name
    folder = runtime_dir()
    lock, record = folder / f"{name}.lock", folder / f"{name}.json"
    told, unnamed_since = False, None
    while True:
        taken = None  # the kept hold this process takes over (cluster down)
        fd = lockfile.acquire(lock, blocking=False)
        if fd is None:
            holder = read_holder(record)
            if holder is None:  # it holds the lock and has not written its record yet
                unnamed_since = unnamed_since or time.monotonic()
                if time.monotonic() - unnamed_since < 2.0:
                    time.sleep(0.05)
                    continue
        else:
            try:
                holder = read_holder(record)
                if holder is not None and holder.kept and take_kept:
                    taken, holder = holder, None
                elif holder is not None and not (holder.kept and present()):
                    clean(holder)  # stale: its holder ended without letting go (or its kept cluster is gone)
                    holder = None
            except BaseException:
                lockfile.release(lock, fd)
                raise
            if holder is None:
                break
            lockfile.release(lock, fd)  # a kept hold: its record stays as it is
        if not wait:
            raise TopologyBusy(label, holder)
        if not told:
            log.info("%s is %s; waiting (--wait)", label, held_by(label, holder))
            told = True
        time.sleep(POLL_S)
    me = Holder(os.getpid(), this_command(), time.time())
    hold = _Hold(record, me)
    try:
        _write(record, me)
        _held[name] = hold
        yield me
    finally:
        _held.pop(name, None)
        try:
            if hold.holder.kept:
                pass  # the record stays: it holds the topology after this process
            elif taken is not None and present():
                _write(record, taken)  # the kept cluster is still there (down refused or failed): still held
            else:
                with contextlib.suppress(FileNotFoundError):
                    record.unlink()
        finally:
            lockfile.release(lock, fd)


def _write(record: Path, holder: Holder) -> None:
    atomic_write(record, json.dumps(asdict(holder)) + "\n", durable=False)


def keep(name: str, down: str = "") -> None:
    """Make this process's hold of `name` outlast it: the record stays, and holds the topology
    while its cluster exists, until a ``cluster down`` takes it over; `down` is that command, as
    messages suggest it."""
    hold = _held.get(name)
    if hold is None:
        raise RuntimeError(f"{name} is not held by this process")
    hold.holder = replace(hold.holder, kept=True, down=down)
    _write(hold.record, hold.holder)


def holds(name: str) -> bool:
    """Whether this process holds `name`."""
    return name in _held
