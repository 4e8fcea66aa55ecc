"""The `shardsim` command: one parser, one error handler, logging.

Each command registers itself beside its feature (a `register(subparsers)` function); this module
sits in the runtime because it reaches both halves — the simulator never imports the runtime.
No command module imports torch at import time: `shardsim sweep` runs without it. The command
modules load inside `main`, after its signal handlers are in place, so that a Ctrl-C however
early is one line.

Streams: a command's result goes to stdout (``--json`` output stays clean); diagnostics go through
`logging` to stderr (``-v`` for more, ``-q`` for errors only), one line each, control
characters escaped. A character stdout's encoding cannot hold is escaped (``\\u2717``), never an error.
Exit status: 0 done, 1 a run or check failed, a file could not be written (one line naming what
was written and what not) or something unexpected happened (one line names a log file with the
traceback), 2 bad input (one line saying what and where), 130 interrupted (Ctrl-C), 141 stdout
closed early (a closed stdout, a broken pipe: no word), 143 terminated (SIGTERM), 129 and 131
for SIGHUP and SIGQUIT. Each signal raises inside the command (see `core.interrupts`), so
everything it started is stopped before it exits; one swallowed on its way still ends it, and a
command that has not stopped 1.2 s after the signal is ended here (`_deadline`: every process
it started killed).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import io
import logging
import os
import re
import shlex
import signal
import sys
import threading
from pathlib import Path

from shardsim.core import interrupts, notes
from shardsim.core.errors import ConfigError, WriteError
from shardsim.core.files import named_stdout

log = logging.getLogger("shardsim")
_said: list[KeyboardInterrupt] = []  # the interrupt whose line this process has written


def _commands() -> tuple:
    """The command modules, in the order `--help` lists them (imported on first use)."""
    from shardsim.cli import calibrate as calibration_cli
    from shardsim.cli import cluster as cluster_cli
    from shardsim.cli import collective as collective_cli
    from shardsim.cli import predict as predict_cli
    from shardsim.cli import profile as profile_cli
    from shardsim.cli import run as run_cli
    from shardsim.cli import sweep as sweep_cli
    from shardsim.cli import topologies as topologies_cli
    from shardsim.cli import validate as validation_cli
    from shardsim.cli import workloads as workloads_cli

    return (
        predict_cli,
        sweep_cli,
        collective_cli,
        topologies_cli,
        workloads_cli,
        run_cli,
        profile_cli,
        validation_cli,
        cluster_cli,
        calibration_cli,
    )


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardsim")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _add_verbosity(p: argparse.ArgumentParser, default) -> None:
    p.add_argument("-v", "--verbose", action="count", default=default, help="more diagnostics on stderr")
    p.add_argument(
        "-q", "--quiet", action="count", default=default, help="only errors on stderr: no notes, warnings or progress"
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="shardsim",
        description="Predict, sweep, run and validate distributed training configurations on described GPU "
        "clusters: data parallel (DDP), ZeRO / FSDP, ZeRO-2D / HSDP / MiCS, pipeline, tensor and sequence "
        "parallel, and their compositions.",
    )
    p.add_argument("--version", action="version", version=f"shardsim {_version()}")
    _add_verbosity(p, 0)
    sub = p.add_subparsers(
        dest="command",
        required=True,
        parser_class=_Parser,
        metavar="COMMAND",
        help="`shardsim COMMAND --help` for more",
    )
    for command in _commands():
        command.register(sub)
    for sp in sub.choices.values():
        _add_verbosity(sp, argparse.SUPPRESS)  # also after the command: `shardsim sweep -q`
    return p


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` with its control characters (newlines, carriage returns, terminal escapes) written
    as escapes (``\\n``, ``\\x1b``), so that a message quoting a path stays the one line it is."""
    return _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return one_line(super().format(record))


def setup_logging(level: int) -> None:
    """Diagnostics on stderr, prefixed ``shardsim:``, one line each; `level` 0 is INFO, < 0
    ERROR (``-q``: the results and errors only), > 0 DEBUG."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine("shardsim: %(message)s"))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.DEBUG if level > 0 else logging.INFO if level == 0 else logging.ERROR)


def crash_log(text: str) -> Path:
    """Write a traceback to a log file (``$SHARDSIM_LOG_DIR``, else the user's cache folder, else
    the temporary folder) and return its path."""
    import tempfile
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidates = [os.environ.get("SHARDSIM_LOG_DIR"), Path.home() / ".cache" / "shardsim", tempfile.gettempdir()]
    for folder in filter(None, candidates):
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            path = Path(folder) / f"shardsim-{stamp}-{os.getpid()}.log"
            path.write_text(text)
            return path
        except OSError:
            continue
    raise OSError("no writable folder for the log")


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv` (default: the program's arguments) and return its exit status.
    Called as the program (no `argv`): its standard streams are made safe first (`_safe_streams`),
    and the process exits as soon as the command ends (`_exit_now`)."""
    if argv is not None:
        interrupts.forget()  # in-process: a signal recorded before was an earlier command's
    try:
        with interrupts.raising(deadline=None if argv is not None else _deadline):
            early = interrupts.received()  # a signal while the program loaded (`interrupts.recording`)
            if early is not None:
                raise early
            code = _main(argv)
    except KeyboardInterrupt as exc:  # as the handlers were set or restored, around the command
        code = _interrupted(exc)
    late = interrupts.received()
    if late is not None and code not in interrupts.STATUSES:  # swallowed on its way (a finalizer, a library)
        code = _interrupted(late)
    if argv is None:
        interrupted = code in interrupts.STATUSES
        if interrupted or threading.active_count() == 1:
            _exit_now(code, handlers=not interrupted)
    return code


def _deadline(signum: int) -> None:
    """A signal's deadline (`interrupts.raising`): the command has not stopped within its grace,
    so every process it started is killed and it exits with the signal's status, one line said
    (written directly: the main thread may hold logging's lock)."""
    try:
        from shardsim.runtime.processes import descendants

        for pid in descendants(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    except OSError:  # no /proc: the workers die with this process (`interrupts.worker_signals`)
        pass
    exc = interrupts.interrupt(signum)
    if not _said:
        with contextlib.suppress(OSError):
            os.write(2, f"shardsim: {interrupts.describe(exc)}\n".encode())
    os._exit(interrupts.exit_status(exc))


def _exit_now(code: int, handlers: bool = False) -> None:
    """Exit with `code` without Python's teardown of every module and object first (0.1-0.2 s
    once pandas is loaded, seconds after a profile): the streams flushed, and with `handlers`
    the exit handlers run first (logging's, multiprocessing's, Ray's: as at a normal exit;
    only once no other thread runs). What a command writes is closed before it returns, and the
    result cache commits every row as it is stored."""
    if handlers:
        try:
            with interrupts.raising(deadline=_deadline):
                atexit._run_exitfuncs()
        except KeyboardInterrupt as exc:
            code = _interrupted(exc)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class _ClosedStdout(io.TextIOBase):
    """stdout when it was closed before the command started: writing to it is a broken pipe, as
    on a pipe whose reader is gone (its descriptor holds /dev/null, so that no file opened later
    takes its number)."""

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "stdout is closed")

    def fileno(self) -> int:
        return 1

    def isatty(self) -> bool:
        return False


def _safe_streams() -> None:
    """stdin, stdout and stderr as a command can rely on: one closed before the start gets
    /dev/null on its descriptor (stdout then reads as closed: `_ClosedStdout`); text that
    stdout's or stderr's encoding cannot hold is escaped, never an error."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            is_open = True
        except OSError:
            is_open = False
        if not is_open:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if name == "stdout":
                sys.stdout = _ClosedStdout()
            elif name == "stderr":
                sys.stderr = open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
            continue
        stream = getattr(sys, name)
        if name != "stdin" and isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def _stdout_gone() -> int:
    """A closed stdout or a broken pipe (`shardsim sweep | head`): stop quietly, with the status
    SIGPIPE would give; what is still buffered goes to /dev/null, not into an error at exit."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    return 128 + signal.SIGPIPE


def _interrupted(exc: KeyboardInterrupt) -> int:
    """One line for the signal that raised `exc`, and its exit status."""
    if not log.handlers:
        setup_logging(0)
    _said.append(exc)
    log.error(interrupts.describe(exc))
    return interrupts.exit_status(exc)


def _main(argv: list[str] | None) -> int:
    try:
        if argv is None:
            _safe_streams()
        setup_logging(0)  # one line for an interrupt while the commands load
        ns = build_parser().parse_args(argv)
        ns.command_line = shlex.join(["shardsim", *(sys.argv[1:] if argv is None else argv)])
        setup_logging(ns.verbose - ns.quiet)
        with notes.held(), named_stdout():  # a refused input: its one line alone; a failed stdout write named
            code = int(ns.func(ns) or 0)
            if sys.stdout is not None:
                sys.stdout.flush()  # a broken pipe is this command's, not an error at exit
        return code
    except ConfigError as exc:
        log.error("error: %s", exc)
        return 2
    except WriteError as exc:  # the disk full, a device that refuses: what was written is named
        log.error("error: %s", exc)
        return 1
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    except BrokenPipeError:  # stdout closed early (`shardsim sweep | head`)
        return _stdout_gone()
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes one line
        if (signalled := interrupts.received()) is not None:  # an interrupt a library turned into its own error
            return _interrupted(signalled)
        first = (str(exc).splitlines() or [""])[0]
        import traceback

        try:
            where = f"; the traceback is in {crash_log(traceback.format_exc())}"
        except OSError:
            where = ""
        log.error("unexpected %s: %s%s", type(exc).__name__, first, where)
        return 1


if __name__ == "__main__":
    sys.exit(main())
