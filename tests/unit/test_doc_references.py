"""The docs, the README, the code, the tests and the experiments say what is true now: no
internal tracker reference, numbered ("issue 17", "#17") or not ("the issue's targets", "(issue
..."; a reference to an issue of another project names that project), no path into the
workspace outside the repository, and every markdown link to a local file resolves. The
experiments' readings (experiments/readings/), where dated notes belong, are left out of the
reference check."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()
SCANNED = ("README.md", "docs/", "shardsim/", "tests/", "experiments/", ".ci/")
READINGS = "experiments/readings/"
SUFFIXES = (".md", ".py", ".yaml", ".toml", ".txt")

# a colour code, as the plots' palettes write them, or a short one closing a CSS declaration
COLOUR = re.compile(r"#[0-9A-Fa-f]{6}\b|#[0-9A-Fa-f]{3}\b(?=\s*[;}])")
REFERENCE = re.compile(
    r"\b(?:issue|stop)s? #?\d+|(?<![\w&])#\d+\b"  # numbered
    r"|\bthe issues?\b|\bissue's|\(issue\b",  # the tracker's issue as the text's subject
    re.IGNORECASE,
)
PROJECT = re.compile(r"\b[A-Za-z0-9-]+/[A-Za-z0-9_.-]+")  # owner/name: another project's tracker
LINK = re.compile(r"\]\(((?!https?:|mailto:|#)[^)#\s(]+)(?:#[^)]*)?\)")
OUTSIDE = re.compile(r"(?:\.\./)+shared\b|\bshared/seeds\b")  # the workspace around the repository


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [name for name in out.splitlines() if name != THIS and (ROOT / name).is_file()]


def internal_references(line: str) -> list[str]:
    """The tracker references of `line` that name no other project before them."""
    line = COLOUR.sub("", line)
    return [m[0] for m in REFERENCE.finditer(line) if not PROJECT.search(line, 0, m.start())]


def test_the_check_tells_an_internal_reference_from_another_projects() -> None:
    assert internal_references("fixed in " + "issue 26") == ["issue 26"]
    assert internal_references("see " + "#26 and " + "stop 37") == ["#26", "stop 37"]
    assert internal_references("NVIDIA/nccl issue #1442; pytorch/pytorch#86509") == []
    assert internal_references('palette = ["#937860", "#4C72B0"]; &#8212;') == []
    assert internal_references("td { color: #888; } .note { color: #555 }") == []
    assert internal_references("against the issue's targets; (issue 5)") == ["the issue", "(issue"]
    assert internal_references("every strategy the issues name") == ["the issues"]
    assert internal_references("the collectives this issues, in issue order") == []


def test_no_internal_numbering_in_docs_code_or_tests() -> None:
    found = [
        f"{name}:{n}: {ref}"
        for name in _tracked()
        if name.startswith(SCANNED) and not name.startswith(READINGS) and name.endswith(SUFFIXES)
        for n, line in enumerate((ROOT / name).read_text().splitlines(), 1)
        for ref in internal_references(line)
    ]
    assert found == []


def test_no_path_into_the_workspace_outside_the_repository() -> None:
    found = [name for name in _tracked() if name.endswith(SUFFIXES) and OUTSIDE.search((ROOT / name).read_text())]
    assert found == []


def test_every_markdown_link_to_a_local_file_resolves() -> None:
    pages = [name for name in _tracked() if name.endswith(".md")]
    assert "README.md" in pages and any(p.startswith("experiments/") for p in pages)
    dead = [
        f"{name}: {target}"
        for name in pages
        for target in LINK.findall((ROOT / name).read_text())
        if not ((ROOT / name).parent / target).exists()
    ]
    assert dead == []
