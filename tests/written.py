"""What the docs' slow examples did in this pytest process: the folders the writers wrote into
({example id: folder}) and how each example that ran ended ({example id: its completed process}).

A module of its own because pytest imports a test module under its file name and another test
that imports it does so under its package path: two modules, each with its own globals. This
helper is imported under one name, so every test shares it (test_validation_real predicts from
the profile the profile.md example measured for test_docs_examples_slow, and checks the emulated
run of runtime.md's example: each run once)."""

from __future__ import annotations

import subprocess
from pathlib import Path

WRITTEN: dict[str, Path] = {}
RAN: dict[str, subprocess.CompletedProcess] = {}
