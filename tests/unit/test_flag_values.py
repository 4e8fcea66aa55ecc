"""Flags read as they are given: an empty element of a comma-separated list is refused naming the
flag, not dropped; --gpus-per-node takes what its help says; a sweep's --global-batch honours a
--batch-per-device given beside it (or refuses the pair in one line); a sweep's last line names
the kinds it swept."""

from __future__ import annotations

import argparse
import json

import pytest

from shardsim.config import RunConfig
from shardsim.core.errors import ConfigError
from shardsim.core.flagtypes import CountList, SizeSweep
from tests.unit.test_flag_bounds import _commands
from tests.unit.test_strict_input import cli, refused

SWEEP = ["sweep", "--workload", "tiny-gpt", "--topology", "p4d.24xlarge", "--nodes", "1", "--workers", "1"]
LIST_PARSERS = ("parse", "str_list", "bool_list", "fraction_list")  # config.flags' list types


def _list_flags() -> list[tuple[str, str]]:
    """(command, flag) of every flag that takes a comma-separated list."""
    return [
        (command, a.option_strings[-1])
        for command, parser in sorted(_commands().items())
        for a in parser._actions
        if isinstance(a.type, CountList | SizeSweep) or getattr(a.type, "__name__", "") in LIST_PARSERS
    ]


def test_the_list_flags_are_found():
    flags = set(_list_flags())
    assert {("sweep", "--nodes"), ("sweep", "--batch-per-device"), ("sweep", "--strategy")} <= flags
    assert {("collective", "--sizes"), ("calibrate", "--params"), ("profile", "--batch")} <= flags


@pytest.mark.parametrize(("command", "flag"), _list_flags())
@pytest.mark.parametrize("text", ["1,,2", "1,", ",", " , 1"])
def test_an_empty_list_element_is_refused_not_dropped(command, flag, text):
    kind = next(a.type for a in _commands()[command]._actions if flag in a.option_strings)
    with pytest.raises(argparse.ArgumentTypeError, match="none of them empty"):
        kind(text)


@pytest.mark.parametrize(
    ("flag", "text"), [("--nodes", "1,,2"), ("--batch-per-device", "4,,8"), ("--strategies", "ddp,")]
)
def test_an_empty_list_element_is_one_line_naming_the_flag(capsys, flag, text):
    assert cli([*SWEEP, flag, text]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"shardsim sweep: error: argument {flag}"), err
    assert f"none of them empty, got {text!r}" in err, err


def test_gpus_per_node_is_1_2_or_4_of_8(capsys):
    err = refused(["predict", "--workload", "tiny-gpt", "--topology", "p4d.24xlarge", "--gpus-per-node", "3"], capsys)
    assert "field 'gpus_per_node': expected a power of two (1, 2, 4, ...), got 3" in err, err
    with pytest.raises(ConfigError, match="power of two") as exc:
        RunConfig(gpus_per_node=6)
    assert exc.value.field == "gpus_per_node"
    assert [RunConfig(gpus_per_node=n).gpus_per_node for n in (1, 2, 4, 8)] == [1, 2, 4, 8]


def _rows(capsys, argv: list[str]) -> list[dict]:
    assert cli([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["rows"]


def test_a_global_batch_with_a_batch_per_device_keeps_both(capsys):
    rows = _rows(capsys, [*SWEEP, "--strategies", "ddp", "--global-batch", "64", "--batch-per-device", "2"])
    assert rows
    for r in rows:  # 8 GPUs: 8 data-parallel ranks at tp 1, 4 at tp 2, 2 at tp 4
        dp = r["world"] // r["strategy"]["tp"]
        assert (r["batch_per_device"], r["grad_accum"], r["global_batch"]) == (2, 64 // (dp * 2), 64), r


def test_a_global_batch_with_its_accumulation_steps_keeps_both(capsys):
    rows = _rows(capsys, [*SWEEP, "--strategies", "ddp", "--tp", "1", "--global-batch", "64", "--grad-accum", "2"])
    assert [(r["batch_per_device"], r["grad_accum"]) for r in rows] == [(4, 2)]


def test_a_global_batch_a_batch_per_device_cannot_make_is_one_line(capsys):
    err = refused([*SWEEP, "--strategies", "ddp", "--global-batch", "8", "--batch-per-device", "16"], capsys)
    assert "global batch 8 does not divide over 8 devices at the listed batch sizes" in err, err


@pytest.mark.parametrize("extra", [[], ["--max-batch", "8"]])
def test_a_sweep_without_data_parallel_kinds_says_what_it_swept(capsys, extra):
    assert cli([*SWEEP, "--strategies", "pipeline", *extra]) == 0
    out = capsys.readouterr().out
    assert "No ddp/zero/zero2d configuration was swept (only pipeline)." in out, out
    assert "fits in memory; only pipelines do" not in out


@pytest.mark.parametrize("extra", [[], ["--global-batch", "64"]])
def test_a_batch_per_device_beside_a_search_is_refused_not_overridden(capsys, extra):
    err = refused([*SWEEP, "--max-batch", "8", "--batch-per-device", "2", *extra], capsys)
    assert "field 'max_batch': searches the batch: give batch sizes or the search, not both" in err, err
