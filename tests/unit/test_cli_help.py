"""Every command and every flag of `shardsim` says what it does, and every flag that takes a
value says its default."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from shardsim.cli import build_parser


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _shown(default) -> str:
    return ",".join(map(str, default)) if isinstance(default, (tuple, list)) else str(default)


def _problems(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for a in parser._actions:
        if a.help == argparse.SUPPRESS or isinstance(a, (argparse._HelpAction, argparse._VersionAction)):
            continue
        name = "/".join(a.option_strings) or a.dest
        help_text = (a.help or "").strip()
        if not help_text:
            out.append(f"{name}: no help")
            continue
        rendered = help_text % {"default": a.default} if "%(default)" in help_text else help_text
        takes_value = a.option_strings and a.nargs != 0 and not a.required
        if takes_value and "default" not in rendered:
            out.append(f"{name}: the default is not said")
        if takes_value and a.default not in (None, argparse.SUPPRESS) and _shown(a.default) not in rendered:
            out.append(f"{name}: the default {_shown(a.default)!r} is not shown")
    return out


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_command_and_flag_has_help_and_shows_its_default(command: str):
    parser = _commands()[command]
    assert parser.description, f"{command} has no description"
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert any(c.dest == command and c.help for c in sub._choices_actions), f"{command} has no summary line"
    assert _problems(parser) == []


def test_the_top_level_flags_have_help():
    assert _problems(build_parser()) == []


def test_version_prints_the_version():
    proc = subprocess.run(
        [sys.executable, "-m", "shardsim.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout.startswith("shardsim ") and proc.stdout.split()[1][0].isdigit()


def test_the_top_level_help_names_every_parallel_dimension():
    text = " ".join(build_parser().format_help().split())
    for dimension in ("data parallel", "ZeRO / FSDP", "ZeRO-2D / HSDP", "pipeline", "tensor", "sequence parallel"):
        assert dimension in text, dimension


def test_choices_holding_commas_are_shown_as_they_are_typed():
    text = " ".join(_commands()["predict"].format_help().split())
    assert "--mesh-order {pp,dp,tp | pp,tp,dp}" in text
    assert "{pp,dp,tp,pp,tp,dp}" not in text


def test_the_strategy_flags_name_their_aliases():
    predict = " ".join(_commands()["predict"].format_help().split())
    sweep = " ".join(_commands()["sweep"].format_help().split())
    assert "also fsdp (= zero), hsdp (= zero2d)" in predict and "also fsdp (= zero), hsdp (= zero2d)" in sweep
