"""The README and docs/ name files that exist and imports that work."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"`((?:simulator|runtime|topologies|experiments|tests|docs)/[A-Za-z0-9_./-]*)`")
LINK = re.compile(r"\]\(((?!https?:|#)[^)#\s(]+)(?:#[^)]*)?\)")
IMPORT = re.compile(r"^from (shardsim\.[\w.]+) import ([\w, ]+)$", re.M)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_named_files_exist(doc: Path):
    text = doc.read_text()
    named = {m for m in PATH.findall(text) if "*" not in m}
    linked = {(doc.parent / m).resolve() for m in LINK.findall(text)}
    missing = [p for p in named if not (ROOT / p).exists()] + [str(p) for p in linked if not p.exists()]
    assert not missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_imports_in_examples_work(doc: Path):
    for module, names in IMPORT.findall(doc.read_text()):
        mod = importlib.import_module(module)
        for name in (n.strip() for n in names.split(",")):
            assert hasattr(mod, name), f"{module} has no {name}"
