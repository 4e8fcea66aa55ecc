"""The calibration data the fitted defaults come from lives in the repository, each file with its
source, and nothing reads a copy outside it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from shardsim.core.csvfile import read_table

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "experiments" / "calibration" / "data"
CSVS = sorted(p.name for p in DATA.glob("*.csv"))


def test_the_calibration_sets_are_in_the_repository():
    assert {"mpt-a100-40gb.csv", "nccl-all-reduce-p5-2node.csv"} <= set(CSVS)


@pytest.mark.parametrize("name", CSVS)
def test_every_data_file_has_its_source_in_the_readme(name):
    readme = (DATA / "README.md").read_text()
    entry = readme.split(f"`{name}` — ", 1)
    assert len(entry) == 2, f"{name} has no entry in {DATA / 'README.md'}"
    assert "transcribed from" in entry[1].split("\n---", 1)[0]  # the entry names where the figures come from


@pytest.mark.parametrize("name", CSVS)
def test_every_data_file_reads_whole(name):
    table = read_table(DATA / name)
    assert table.rows and all(all(v.strip() for v in r.cells.values()) for r in table.rows)


def test_nothing_reads_calibration_data_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    this = str(Path(__file__).resolve().relative_to(ROOT))
    offenders = [
        name
        for name in tracked.splitlines()
        if name.endswith((".py", ".md", ".yaml", ".toml"))
        and name != this
        and "shared/calibration" in (ROOT / name).read_text()
    ]
    assert offenders == []
