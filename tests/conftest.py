"""Tests under tests/integration/ start real processes (torchrun ranks, the CLI, network
namespaces) and are marked `integration`; tests/unit/ runs in-process.

    python -m pytest -q -m "not integration"     # the fast subset, for development

CI (the README's test command, `tests.ci`) runs the `serial` tests one at a time: every
integration test (their ranks take the cores), those in `SERIAL` (they hold the machine to a
wall-clock promise or tear down emulated clusters) and those marked in place; beside them, at
the idle scheduling class (only on a core they leave idle), the others on every core
(pytest-xdist, ``-n auto``). A test that asserts a wall-clock time is therefore `serial`. Under
xdist each worker takes the emulated topologies' locks in a runtime folder of its own (the
tests that run beside each other only take them: none brings a cluster up).
"""

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

from tests.root_only import emulation_host  # noqa: F401  (the fixture behind `needs_root`)
from tests.runtime_batch import SessionBatches

INTEGRATION = Path(__file__).parent / "integration"
RUNTIME_DIR = pytest.StashKey[str]()  # an xdist worker's own runtime folder

# No wall-clock limit on a hypothesis example: CI runs the tests not marked `serial` at the idle
# scheduling class beside the serial ones (`tests.ci`), where an example can wait seconds for a core.
settings.register_profile("shardsim", deadline=None)
settings.load_profile("shardsim")


# unit modules that must have the machine to themselves (marker `serial`)
SERIAL = {
    "test_lifecycle.py",  # a process tree killed within seconds; emulated clusters torn down on signals
    "test_sweep_interrupt.py",  # a sweep and its workers gone within 2 s of Ctrl-C
    "test_interrupt_anytime.py",  # a signal at any moment: the command and its tree gone within 2 s
    "test_sweep_ray.py",  # starts Ray instances; Ctrl-C ends one within 2 s
    "test_ownership.py",  # holders in processes of their own, each awaited within a minute
}


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        config.stash[RUNTIME_DIR] = os.environ["SHARDSIM_RUNTIME_DIR"] = tempfile.mkdtemp(prefix=f"shardsim-{worker}-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if RUNTIME_DIR in config.stash:
        shutil.rmtree(config.stash[RUNTIME_DIR], ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(item.fspath)
        if INTEGRATION in path.parents:
            item.add_marker(pytest.mark.integration)
        if INTEGRATION in path.parents or path.name in SERIAL:
            item.add_marker(pytest.mark.serial)


# The width every test's output is laid out for is the one CI's has (stdout not a terminal, no
# COLUMNS: no limit) whatever runs the tests (pytest-xdist's workers set COLUMNS=80); a test
# that wants a width sets COLUMNS itself.
@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)


# Each test its own result cache (`shardsim sweep` caches rows by default): never the user's
# ~/.cache, and no test served the rows another predicted (a folder under pytest's temporary
# one, made only when a sweep uses it).
@pytest.fixture(autouse=True)
def _own_result_cache(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    name = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    monkeypatch.setenv("SHARDSIM_CACHE_DIR", os.fspath(tmp_path_factory.getbasetemp() / "result-cache" / name))


# The runtime's reference configurations of every module collected: one torchrun launch per
# world size for the session (`tests.runtime_batch`; a module registers its cases at import).
@pytest.fixture(scope="session")
def runtime_batches(tmp_path_factory: pytest.TempPathFactory) -> SessionBatches:
    return SessionBatches(tmp_path_factory.mktemp("runtime"))
