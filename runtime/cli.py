"""The `shardsim` command: one parser, one error handler, logging.

Each command registers itself beside its feature (a `register(subparsers)` function); this module
sits in the runtime because it reaches both halves — the simulator never imports the runtime.
No command module imports torch at import time: `shardsim sweep` runs without it.

Streams: a command's result goes to stdout (``--json`` output stays clean); diagnostics go through
`logging` to stderr (``-v`` for more, ``-q`` for warnings and errors only).
Exit status: 0 done, 1 a run or check failed or something unexpected happened (one line names a
log file with the traceback), 2 bad input (one line saying what and where), 130 interrupted (Ctrl-C),
141 stdout closed early, 143 terminated (SIGTERM). Both signals raise inside the command (see
`runtime.interrupts`), so everything it started is stopped before it exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
import traceback
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from shardsim.runtime import run_cli
from shardsim.runtime.emulation import cli as cluster_cli
from shardsim.runtime.interrupts import Terminated, exit_status, raise_interrupt
from shardsim.runtime.profile import cli as profile_cli
from shardsim.runtime.validation import cli as validation_cli
from shardsim.simulator import collective_cli, predict_cli
from shardsim.simulator.calibration import cli as calibration_cli
from shardsim.simulator.errors import ConfigError
from shardsim.simulator.hardware import cli as topologies_cli
from shardsim.simulator.sweep import cli as sweep_cli
from shardsim.simulator.workload import cli as workloads_cli

COMMANDS = (
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
log = logging.getLogger("shardsim")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _version() -> str:
    try:
        return version("shardsim")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _add_verbosity(p: argparse.ArgumentParser, default) -> None:
    p.add_argument("-v", "--verbose", action="count", default=default, help="more diagnostics on stderr")
    p.add_argument("-q", "--quiet", action="count", default=default, help="only warnings and errors on stderr")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="shardsim",
        description="Predict, sweep, run and validate distributed training configurations "
        "(DDP, ZeRO, ZeRO-2D / MiCS, pipelines) on described GPU clusters.",
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
    for command in COMMANDS:
        command.register(sub)
    for sp in sub.choices.values():
        _add_verbosity(sp, argparse.SUPPRESS)  # also after the command: `shardsim sweep -q`
    return p


def setup_logging(level: int) -> None:
    """Diagnostics on stderr, prefixed ``shardsim:``; `level` 0 is INFO, < 0 WARNING, > 0 DEBUG."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("shardsim: %(message)s"))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.DEBUG if level > 0 else logging.INFO if level == 0 else logging.WARNING)


def crash_log(text: str) -> Path:
    """Write a traceback to a log file (``$SHARDSIM_LOG_DIR``, else the user's cache folder, else
    the temporary folder) and return its path."""
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
    Called as the program (no `argv`), an interrupted command exits at once, without freeing
    every object first (seconds, after a profile)."""
    code = _main(argv)
    if argv is None and code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    ns.command_line = shlex.join(["shardsim", *(sys.argv[1:] if argv is None else argv)])
    setup_logging(ns.verbose - ns.quiet)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, raise_interrupt) if main_thread else None
    try:
        return int(ns.func(ns) or 0)
    except ConfigError as exc:
        log.error("error: %s", exc)
        return 2
    except KeyboardInterrupt as exc:
        log.error("terminated" if isinstance(exc, Terminated) else "interrupted")
        return exit_status(exc)
    except BrokenPipeError:  # stdout closed early (`shardsim sweep | head`): stop quietly, as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes one line
        first = (str(exc).splitlines() or [""])[0]
        try:
            where = f"; the traceback is in {crash_log(traceback.format_exc())}"
        except OSError:
            where = ""
        log.error("unexpected %s: %s%s", type(exc).__name__, first, where)
        return 1
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
