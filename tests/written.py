"""The folders the docs' writer examples wrote into in this pytest process: {example id: folder}.

A module of its own because pytest imports a test module under its file name and another test
that imports it does so under its package path: two modules, each with its own globals. This
helper is imported under one name, so every test shares it (test_validation_real predicts from
the profile the profile.md example measured for test_docs_examples_slow: one profile a run)."""

from __future__ import annotations

from pathlib import Path

WRITTEN: dict[str, Path] = {}
