"""Every shell example of README.md and docs/*.md (the ``shardsim`` lines of its ```bash blocks)
is run by a test, as written, from a folder of the user's (a tmp dir holding links to the
checkout's experiments/ and shardsim/, and the files the docs' ```python blocks name in their
first line, such as ``# mymodel.py``).

Three kinds, each example in exactly one (a test checks it):
- fast: run here, in-process, in the order the page gives them (a later one may read what an
  earlier one wrote), each in seconds on a 2-core machine (no wall-clock assertion: the docs
  promise none for them, and this test runs beside others);
- `INTEGRATION`: they start ranks, time a model with torch or take more than seconds:
  tests/integration/test_docs_examples_slow.py runs them (the README's runs and sweeps:
  tests/integration/test_readme_examples_timed.py);
- `SKIPPED`: not runnable by a test, each with the reason.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardsim.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# (page, the example's start) → why it is run by an integration test, not here
INTEGRATION = {
    ("README.md", "sweep --workload gpt-10b"): "README: 2 topologies x 2 node counts of a 10B model, about a minute",
    ("README.md", "run "): "README: starts ranks (tests/integration/test_readme_examples_timed.py)",
    ("configuration.md", "predict --workload mymodel:build"): "imports torch and builds the model on the meta device",
    ("profile.md", "profile "): "times the model with torch and probes the emulated cluster's links",
    ("profile.md", "predict --topology emu-2x2 --workload small-gpt"): "reads the profile the example above writes",
    ("runtime.md", "run "): "starts ranks (an emulated cluster's need root)",
    ("simulator.md", "calibrate --topology p5.48xlarge --nodes 2"): "fits the network figures: about 25 s",
    ("simulator.md", "collective --topology p5.48xlarge --nodes 2 --calibration"): "reads the fit above",
}
# (page, the example's start) → why no test runs it
SKIPPED = {
    ("README.md", "validate"): "needs root and takes minutes: emulated clusters, profiles and runs "
    "(tests/integration/test_validation_real.py runs the CI matrix)",
    ("validation.md", "validate"): "as README.md's validate examples",
    ("emulated-cluster.md", "cluster "): "needs root and owns the host's network namespaces of emu-2x2, which "
    "other runs on this machine may hold (tests/integration/test_emulation.py and test_cluster_ownership.py "
    "test the commands)",
    ("simulator.md", "sweep --workload gpt-10b --nodes 4,8,16 --executor ray --address"): "needs a running Ray "
    "cluster (tests/unit/test_sweep_ray.py runs sweeps on a local Ray instance)",
    ("simulator.md", "calibrate runs.csv"): "names the reader's own files (runs.csv, nccl-tests logs), "
    "not files of the repository; the shipped data's calibration is the example above it",
}


@dataclass(frozen=True)
class Example:
    page: str
    line: str  # as written, continuations joined
    argv: tuple[str, ...]  # after `shardsim`, up to a pipe or a redirection
    stdout_to: str | None = None  # `> FILE`: the file stdout goes to

    @property
    def id(self) -> str:
        return f"{self.page}: {self.line}"

    def kind(self) -> str:
        text = " ".join(self.argv)
        if any(p == self.page and text.startswith(s) for p, s in SKIPPED):
            return "skipped"
        if any(p == self.page and text.startswith(s) for p, s in INTEGRATION):
            return "integration"
        return "fast"


def examples(pages: list[Path] = DOCS) -> list[Example]:
    """The ``shardsim`` lines of every ```bash block, in page order (comments dropped)."""
    out = []
    for page in pages:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words[:1] != ["shardsim"]:
                    continue
                ends = [i for i, w in enumerate(words) if w in ("|", ">")]
                end = ends[0] if ends else len(words)
                target = words[end + 1] if ends and words[end] == ">" else None
                out.append(Example(page.name, " ".join(line.split()), tuple(words[1:end]), target))
    return out


def user_folder(tmp: Path) -> Path:
    """A folder of the user's: the checkout's paths the examples name, and the files the docs'
    python blocks give (a block whose first line is ``# NAME.py``)."""
    for name in ("docs", "experiments", "shardsim"):
        (tmp / name).symlink_to(ROOT / name)
    for page in DOCS:
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
            first = block.splitlines()[0] if block.strip() else ""
            if m := re.fullmatch(r"# ([\w-]+\.py)", first.strip()):
                (tmp / m[1]).write_text(block)
    return tmp


ALL = examples()
PAGES = sorted({e.page for e in ALL if e.kind() == "fast"})


def test_every_example_is_run_or_skipped_with_a_reason():
    kinds = {e.kind() for e in ALL}
    assert len(ALL) >= 30 and kinds == {"fast", "integration", "skipped"}
    used = {
        (e.page, s) for e in ALL for p, s in (*SKIPPED, *INTEGRATION) if p == e.page and " ".join(e.argv).startswith(s)
    }
    assert used == set(SKIPPED) | set(INTEGRATION), "an entry that matches no example: remove it"


@pytest.mark.parametrize("page", PAGES)
def test_the_fast_examples_of_a_page_end_well(page: str, tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(user_folder(tmp_path))
    monkeypatch.setenv("COLUMNS", "100")
    for e in (e for e in ALL if e.page == page and e.kind() == "fast"):
        code = main(list(e.argv))
        out, err = capsys.readouterr()
        assert code == 0, f"{e.id}: exit {code}: {err[-500:]}"
        if e.stdout_to:
            Path(e.stdout_to).write_text(out)


def test_the_readme_installs_torch_one_way():
    """One torch install line, the CPU build of the pinned version (what a fresh machine and CI run,
    and what a command that needs torch tells the user to run)."""
    from shardsim.core.torch_required import CPU_INDEX, TORCH_VERSION

    text = (ROOT / "README.md").read_text()
    installs = [line for line in text.splitlines() if "pip install" in line and "torch" in line]
    assert len(installs) == 1, installs
    assert re.search(
        rf"pip install -q( --[a-z-]+( \d+)?)* torch=={TORCH_VERSION} --index-url {CPU_INDEX} ", installs[0]
    )
    test_command = text.split("<!-- test-command -->")[1].split("```")[1]
    assert installs[0] in test_command
    # installed without byte-compiling (pip's compiles every file, serially), so the tests write
    # the bytecode of what they import: where PYTHONDONTWRITEBYTECODE is set (CI's runner sets
    # it) a process that finds no .pyc compiles torch again, about 2 CPU-s each of the suite's
    # hundreds of processes
    tests = test_command.split(".venv/bin/python -m tests.ci", 1)[0]
    assert "--no-compile" not in installs[0] or tests.endswith("(unset PYTHONDONTWRITEBYTECODE && ")


def test_ci_runs_every_test_and_checks_the_committed_results_by_regenerating_them():
    """The README's test command (what CI runs) ends with `tests.ci`: the serial tests, the
    in-process ones beside them, and the one check of the committed results under experiments/
    (regenerated, compared, a difference fails)."""
    from tests import ci

    text = (ROOT / "README.md").read_text()
    test_command = text.split("<!-- test-command -->")[1].split("```")[1]
    assert test_command.rstrip().endswith("&& .venv/bin/python -m tests.ci)")
    assert ci.SERIAL[-2:] == ["-m", "serial"] and ci.BESIDE["in-process tests"][-4:-2] == ["-m", "not serial"]
    assert ci.BESIDE["regeneration check"] == ["experiments/check_regenerated.py"]


def test_the_readme_states_its_limitations():
    text = (ROOT / "README.md").read_text()
    limits = text.split("## Limitations")[1].split("\n## ")[0]
    for term in ("context", "expert", "interleaved", "PAT", "p3dn", "nvidia-smi", "4,096"):
        assert term in limits, term


def test_experiments_readme_gives_the_calibration_error_summary_md_gives():
    """experiments/README.md's figures for the kernel model on the calibration set are those of
    experiments/calibration/summary.md (regenerated by compare.py), not an older run's."""
    summary = (ROOT / "experiments" / "calibration" / "summary.md").read_text()
    rows = {
        m[0]: (m[1], m[2])
        for m in re.findall(r"^\| ([\w -]+?) \| ([\d.]+) \| [+-]?[\d.]+ \| ([\d.]+) \|", summary, re.M)
    }
    text = " ".join((ROOT / "experiments" / "README.md").read_text().split())
    said = re.search(
        r"calibration set is ([\d.]+) % \(calibrated to it ([\d.]+) %, 5-fold cross-validated ([\d.]+) %, "
        r"the largest row ([\d.]+) %; the roofline it replaced: ([\d.]+) %",
        text,
    )
    assert said, "the sentence on the kernel model's error"
    expected = (
        rows["kernels"][0],
        rows["calibrated"][0],
        rows["5-fold CV"][0],
        rows["kernels"][1],
        rows["roofline"][0],
    )
    assert said.groups() == expected


def test_the_readme_gives_the_committed_validations_errors():
    """The README's figures for the shipped validation matrix are those of the committed table
    (experiments/validation/validation.md), and its tensor-parallel range holds the committed
    tp/ table's mean."""
    import re

    text = (ROOT / "README.md").read_text()
    table = (ROOT / "experiments" / "validation" / "validation.md").read_text()
    mean, largest = re.search(r"Mean absolute error ([\d.]+) %, largest ([\d.]+) %", table).groups()
    assert f"within {mean} % mean, {largest} % largest" in text
    tp = (ROOT / "experiments" / "validation" / "tp" / "validation.md").read_text()
    tp_mean = float(re.search(r"Mean absolute error ([\d.]+) %", tp).group(1))
    low, high = map(float, re.search(r"tensor parallelism within ([\d.]+)–([\d.]+) % mean", text).groups())
    assert low <= tp_mean <= high
