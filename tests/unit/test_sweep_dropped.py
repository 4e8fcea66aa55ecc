"""What a sweep drops and why: a count per reason on stderr and in the JSON
output; an empty space says why it is empty."""

from __future__ import annotations

import json

import pytest

from shardsim.cli import main
from shardsim.config import RunConfig, Strategy, resolve
from shardsim.core.errors import ConfigError
from shardsim.sweep.space import SweepSpace, enumerate_configs

# 4 layers, on 8 x g4dn.12xlarge (32 T4s); the counts below are of tp 1 (`--tp 1`), its 32 data-parallel ranks
TINY = RunConfig(workload="tiny-gpt")


def _why(strategy: Strategy) -> str:
    """The reason resolve() gives for a configuration of tiny-gpt on 32 devices."""
    with pytest.raises(ConfigError) as err:
        resolve(RunConfig(workload="tiny-gpt", strategy=strategy), 32, 4)
    return err.value.message


def test_the_enumeration_counts_what_it_drops_by_reason() -> None:
    out = enumerate_configs(TINY, SweepSpace(pp=(2, 8), microbatches=(3, 4), tp_degrees=(1,)))  # 32 ranks
    too_deep = _why(Strategy("pipeline", pp=8, microbatches=4))
    odd_microbatches = _why(Strategy("pipeline", pp=2, microbatches=3))
    # pp 8: shard degrees 1, 2, 4 (of its 4 ranks per stage) x 2 microbatch counts x 2 schedules
    assert out.dropped == {too_deep: 12, odd_microbatches: 10}
    assert list(out.dropped) == [odd_microbatches, too_deep]  # in the order first met
    assert out.candidates and not out.skipped


def test_the_default_space_drops_nothing() -> None:
    assert not enumerate_configs(TINY).dropped


def test_a_sweep_reports_what_it_dropped_on_stderr_and_in_json(capsys) -> None:
    argv = ["sweep", "--workload", "tiny-gpt", "--pp", "8,2", "--tp", "1", "--workers", "1", "--no-progress"]
    argv += ["--no-cache"]  # the second sweep predicts too (a cache would add its line)
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    too_deep = _why(Strategy("pipeline", pp=8, microbatches=8))
    assert json.loads(captured.out)["dropped"] == {too_deep: 18}  # 3 degrees x 3 microbatch counts x 2 schedules
    summary = "shardsim: dropped 18 configurations: 18 invalid layout"
    assert captured.err == f"{summary} (-v lists them)\n"
    assert main(argv) == 0  # the table too (a pruned search: its line may follow)
    first, *rest = capsys.readouterr().err.splitlines()
    assert first == f"{summary} (-v lists them)"
    assert all(line.startswith("shardsim: pruned search: ") for line in rest)
    assert main([*argv, "--prune"]) == 0  # and the pruned search's line, when a bound pruned
    err = capsys.readouterr().err
    assert err.startswith(f"{summary} (-v lists them)\n")
    assert all(line.startswith("shardsim: pruned search: ") for line in err.splitlines()[1:]), err
    assert main([*argv, "-v", "--json"]) == 0  # -v: the summary, then a line per reason
    err = capsys.readouterr().err.splitlines()
    assert err[err.index(summary) + 1] == f"shardsim: dropped 18 configurations: {too_deep}", err
    assert main([*argv, "-q"]) == 0  # -q: the results alone
    assert capsys.readouterr().err == ""


def test_many_reasons_are_one_line_with_a_count_per_kind(capsys) -> None:
    # 16 microbatch counts, most of which divide no pipeline's batch: a reason for each pair
    counts = ",".join(str(m) for m in range(1, 17))
    argv = ["sweep", "--workload", "tiny-gpt", "--pp", "2,4", "--microbatches", counts, "--tp", "1"]
    argv += ["--workers", "1", "--no-progress", "--no-cache", "--json", "--precisions", "fp32,tf32"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    dropped, err = json.loads(captured.out)["dropped"], captured.err
    assert len(dropped) > 10, dropped
    no_tf32 = dropped.pop("NVIDIA T4 has no tf32 support")
    layout = sum(dropped.values())
    total = layout + no_tf32
    kinds = f"{no_tf32:,} precision the device lacks, {layout:,} invalid layout"  # in the order first met
    assert err.splitlines() == [f"shardsim: dropped {total:,} configurations: {kinds} (-v lists them)"], err


def test_an_empty_space_says_why_in_one_line(capsys) -> None:
    argv = ["sweep", "--workload", "tiny-gpt", "--strategies", "pipeline", "--pp", "8", "--tp", "1", "--workers", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    too_deep = _why(Strategy("pipeline", pp=8, microbatches=8))
    assert err.count("\n") == 1 and "no valid configuration" in err, err
    assert f"8 x g4dn.12xlarge: {too_deep} (18 configurations)" in err, err  # 3 degrees x 3 counts x 2 schedules


def test_an_empty_space_of_nothing_to_try_says_so(capsys) -> None:
    # 2 devices: zero2d has no degree between ddp (1) and zero (2)
    argv = ["sweep", "--workload", "tiny-gpt", "--topology", "emu-2x2", "--nodes", "1", "--backend", "gloo"]
    assert main([*argv, "--strategies", "zero2d", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the requested strategies have no configuration on 2 devices" in err, err
