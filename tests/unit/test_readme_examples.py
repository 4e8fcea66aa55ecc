"""The README's examples are quick on a 2-core CPU: its runs name small models on few ranks, its
predict example shows what predict prints, and (tests/integration/test_readme_examples_timed.py)
every predict, sweep and run example ends within a minute."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from shardsim.cli import build_parser, main
from shardsim.config import config_from_args
from shardsim.simulator.workload.resolve import load_workload

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SMALL_PARAMS = 10e6  # a model this size trains in seconds on a CPU
MAX_CPU_RANKS = 4
README_PREDICT = r"`shardsim predict` prints.*?```\n(.*?)```"  # the predict example's output block
LONG = {"validate"}  # by nature minutes (profile + runs on emulated clusters): the README says how long


def readme_examples() -> list[list[str]]:
    """Every `shardsim ...` command of the README's bash blocks, as argv (continuations joined,
    comments dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["shardsim"]:
                out.append(words[1:])
    return out


def examples_of(command: str) -> list[list[str]]:
    return [argv for argv in readme_examples() if argv[0] == command]


def test_the_readme_has_examples_of_every_main_command():
    assert {argv[0] for argv in readme_examples()} == {"predict", "sweep", "run", "validate"}


@pytest.mark.parametrize("argv", examples_of("run"), ids=" ".join)
def test_a_readme_run_names_a_small_model_on_few_cpu_ranks(argv, monkeypatch):
    monkeypatch.chdir(ROOT)
    ns = build_parser().parse_args(argv)
    cfg = config_from_args(ns)
    assert load_workload(cfg.workload, cfg.shape).params < SMALL_PARAMS, cfg.workload
    from shardsim.runtime.plan import plan_run

    plan = plan_run(cfg, ns.nproc, ns.emulate)
    assert plan.nproc <= MAX_CPU_RANKS and ns.steps + ns.warmup <= 10


def test_the_long_examples_say_how_long_they_take():
    text = README.read_text()
    for command in LONG:
        assert examples_of(command)
        block_end = text.index("```", text.index(f"```bash\nshardsim {command}") + 8)
        assert "these take minutes" in text[block_end : block_end + 200], command


def _figures_masked(text: str) -> str:
    return re.sub(r"\d[\d,.]*", "#", text)


def test_the_readme_shows_what_predict_prints(capsys, monkeypatch):
    """Line for line as predict lays it out at 80 columns (the figures themselves are compared
    by experiments/check_regenerated.py, which CI runs)."""
    monkeypatch.setenv("COLUMNS", "80")
    shown = re.search(README_PREDICT, README.read_text(), re.S)
    assert shown, "the README's predict example output"
    assert main(["predict"]) == 0
    assert _figures_masked(capsys.readouterr().out) == _figures_masked(shown.group(1))
