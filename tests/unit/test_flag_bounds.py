"""Every numeric flag of every command is read by a bounded type (`simulator.flagtypes`): a value
that is not a number, not finite, negative, zero where it must be positive, or beyond its bound
is refused as the flags are parsed, in one line with exit status 2, before any work."""

from __future__ import annotations

import argparse
import time

import pytest

from shardsim.cli import build_parser, main
from shardsim.core.flagtypes import Count, CountList, Real, Size, SizeSweep

BOUNDED = (Count, CountList, Real, Size, SizeSweep)
VALUES = ("nan", "inf", "-1", "0", "1e23", "1" + "0" * 23)
# what a command needs besides the flag under test for its arguments to parse
RUN = ["run", "--topology", "emu-2x2", "--workload", "tiny-gpt", "--no-emulate"]  # a run that would start
REFUSAL_S = 1.0  # "in well under a second" (docs/simulator.md, "How far it goes")
REQUIRED = {"calibrate": ["runs.csv", "--topology", "p4d.24xlarge"], "cluster": ["status", "emu-2x2"]}


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _numeric_flags() -> list[tuple[str, str]]:
    return [
        (command, a.option_strings[-1])
        for command, parser in sorted(_commands().items())
        for a in parser._actions
        if isinstance(a.type, BOUNDED)
    ]


def _type_of(command: str, flag: str):
    return next(a.type for a in _commands()[command]._actions if flag in a.option_strings)


def exit_status(argv: list[str]) -> int:
    """`shardsim ARGV` in process: the status it returns, or the one argparse exits with."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def refused(capsys, argv: list[str]) -> str:
    """Run `argv`, require a refusal (exit 2, one line on stderr); its line. How soon: `REFUSAL_S`."""
    code = exit_status(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    assert err.count("\n") == 1 and "error: " in err, err
    return err


def test_no_flag_reads_a_number_without_a_bound() -> None:
    bare = [
        f"{command} {a.option_strings[-1]}"
        for command, parser in _commands().items()
        for a in parser._actions
        if a.type in (int, float)
    ]
    assert bare == []
    assert len(_numeric_flags()) > 40  # every command's counts, sizes and times


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize(("command", "flag"), _numeric_flags(), ids=" ".join)
def test_a_numeric_flag_refuses_what_is_not_in_its_range_as_it_is_parsed(capsys, command, flag, value) -> None:
    kind = _type_of(command, flag)
    argv = [command, *REQUIRED.get(command, []), flag, value]
    if value == "0" and getattr(kind, "minimum", 1) == 0 and getattr(kind, "inclusive", True):
        ns = build_parser().parse_args(argv)  # 0 is in the range of this flag (--warmup 0, --top 0: all)
        assert getattr(ns, next(a.dest for a in _commands()[command]._actions if flag in a.option_strings)) in (0, (0,))
        return
    err = refused(capsys, argv)
    assert f"argument {flag}" in err or flag in err, err


def test_the_types_say_what_they_expect() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected an integer from 1 to 16, got '17'"):
        Count(16)("17")
    assert Count(16)("16") == 16 and Count(16, 0)("0") == 0
    assert CountList(8)("4,2,4") == (4, 2)
    with pytest.raises(argparse.ArgumentTypeError, match="from 1 to 8"):
        CountList(8)("2,9")
    assert Real(0.0, 1.0)("0.5") == 0.5 and Real(inclusive=True)("0") == 0.0
    for text in ("nan", "inf", "-inf", "1e309", "0", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="finite number > 0 and <= 1"):
            Real(0.0, 1.0)(text)
    assert Size(2**30)("1GiB") == 2**30
    for text in ("1e309", "1e308TiB", "2GiB", "0", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="at most 1.00 GiB"):
            Size(2**30)(text)
    long = "9" * 5000  # beyond what int() reads by default: refused as any other, in a short line
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        Count(16)(long)
    assert len(str(exc.value)) < 120


REPORTED = [
    ["collective", "--ranks", "-1"],
    ["collective", "--ranks", "1e23"],
    ["collective", "--size", "1e309"],
    [*RUN, "--nproc", "2", "--timeout", "inf"],
    [*RUN, "--nproc", "2", "--seed", "1" + "0" * 23],
    [*RUN, "--nproc", "2", "--threads", "1" + "0" * 23],
    [*RUN, "--nproc", "99999999999999999999999"],
    ["profile", "--threads", "0"],
    ["validate", "--max-mape", "nan"],
    ["predict", "--layers", "1000000"],
    ["sweep", "--workers", "0"],
]


@pytest.mark.parametrize("argv", REPORTED, ids=" ".join)
def test_the_reported_flags_are_refused_before_any_work(capsys, monkeypatch, argv) -> None:
    import subprocess

    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a process was started for bad input"))
    refused(capsys, argv)


@pytest.mark.serial  # a wall-clock promise: the machine to itself
def test_a_bad_value_is_refused_well_under_a_second(capsys) -> None:
    """docs/simulator.md ("How far it goes"): a value beyond its bound is one line, exit status 2,
    "in well under a second": every numeric flag's value out of range, and the reported ones."""
    cases = [[command, *REQUIRED.get(command, []), flag, "1e23"] for command, flag in _numeric_flags()]
    for argv in [*cases, *REPORTED]:
        t0 = time.monotonic()
        refused(capsys, argv)
        took = time.monotonic() - t0
        assert took < REFUSAL_S, f"{argv}: refused after {took:.2f} s"
