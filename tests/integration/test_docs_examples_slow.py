"""The docs' examples that start ranks, time a model with torch or take more than a fast test
may (tests/unit/test_docs_examples.py lists them in `INTEGRATION`, with the reason), run as
written from a folder of the user's. The README's runs and its long sweep (and a page's example
that is one of them, word for word): tests/integration/test_readme_examples_timed.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.root_only import require_emulation
from tests.unit.test_docs_examples import ALL, Example, user_folder
from tests.unit.test_readme_examples import readme_examples
from tests.written import RAN, WRITTEN

SHARDSIM = str(Path(sys.executable).parent / "shardsim")
LIMIT_S = 600
# An example that reads what another writes: (page, its start) → the writer's start
NEEDS = {
    ("profile.md", "predict --topology emu-2x2"): "profile ",
    ("simulator.md", "collective --topology p5.48xlarge --nodes 2 --calibration"): "calibrate --topology",
}
README_EXAMPLES = readme_examples()
EXAMPLES = [
    e for e in ALL if e.kind() == "integration" and e.page != "README.md" and list(e.argv) not in README_EXAMPLES
]


def _writers(example: Example) -> list[Example]:
    """The examples of its page whose files `example` reads (`NEEDS`), in page order."""
    text = " ".join(example.argv)
    writer = next((w for (p, s), w in NEEDS.items() if p == example.page and text.startswith(s)), None)
    return [e for e in ALL if writer and e.page == example.page and " ".join(e.argv).startswith(writer)]


# the writers' ids; the folder each wrote into when it ran in this process (as its own test, or
# for another test: `written_by`) is in `tests.written.WRITTEN`: a reader after it starts from a
# copy of that folder instead of running its writer again (the profile example measures for a minute)
WRITERS = {w.id for e in EXAMPLES for w in _writers(e)}


def _emulates(e: Example) -> bool:
    """A run or profile of an emulated topology without --no-emulate / --no-links: root's."""
    text = " ".join(e.argv)
    return (
        "emu-" in text and e.argv[0] in ("run", "profile") and "--no-emulate" not in text and "--no-links" not in text
    )


def _gpu_only(e: Example) -> bool:
    """The seed's vit-630m on one node's ranks: a GPU machine's example (hours on CPU ranks)."""
    return e.argv[0] == "run" and "experiments/seed/zero2d-4.yaml" in e.argv and "--workload" not in e.argv


def _run(e: Example, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([SHARDSIM, *e.argv], cwd=cwd, capture_output=True, text=True, timeout=LIMIT_S)
    RAN[e.id] = proc
    return proc


def _copy_written(src: Path, dst: Path) -> None:
    """What a writer's folder holds beyond the user folder's links to the checkout."""
    for path in src.iterdir():
        if path.is_symlink() or (dst / path.name).is_symlink():
            continue
        if path.is_dir():
            shutil.copytree(path, dst / path.name, dirs_exist_ok=True)
        else:
            shutil.copy2(path, dst / path.name)


def written_by(page: str, start: str, tmp_factory: pytest.TempPathFactory) -> Path:
    """The folder the example of `page` that starts with `start` wrote into, run now unless it
    already ran in this process (test_validation_real predicts from the profile.md example's
    profile: one profile measured, not two)."""
    e = _example(page, start)
    if e.id not in WRITTEN:
        cwd = user_folder(tmp_factory.mktemp("docs-example"))
        proc = _run(e, cwd)
        assert proc.returncode == 0, f"{e.id}: exit {proc.returncode}: {proc.stderr[-2000:]}"
        WRITTEN[e.id] = cwd
    return WRITTEN[e.id]


def ran(page: str, start: str, tmp_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """How the example of `page` that starts with `start` ended, run now unless it already ran in
    this process (test_validation_real checks runtime.md's emulated run: one run, not two)."""
    e = _example(page, start)
    if e.id not in RAN:
        _run(e, user_folder(tmp_factory.mktemp("docs-example")))
    return RAN[e.id]


def _example(page: str, start: str) -> Example:
    return next(e for e in EXAMPLES if e.page == page and " ".join(e.argv).startswith(start))


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.id)
def test_a_slow_docs_example_ends_well(example: Example, tmp_path: Path):
    if _gpu_only(example):
        import torch

        if not torch.cuda.is_available():
            pytest.skip("a GPU machine's example: the seed's 630M-parameter ViT on one node")
    chain = _writers(example)
    if any(_emulates(e) for e in [*chain, example]):
        require_emulation()
    cwd = user_folder(tmp_path)
    for e in [*chain, example]:
        if e.id in WRITTEN:  # it ran in this process (its own test, or for another's): its files
            _copy_written(WRITTEN[e.id], cwd)
            continue
        proc = RAN[e.id] if e.id in RAN and e.id not in WRITERS else _run(e, cwd)
        assert proc.returncode == 0, f"{e.id}: exit {proc.returncode}: {proc.stderr[-2000:]}"
        if e.stdout_to:
            (cwd / e.stdout_to).write_text(proc.stdout)
    if example.id in WRITERS:
        WRITTEN[example.id] = cwd
