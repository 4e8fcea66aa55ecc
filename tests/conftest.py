"""Tests under tests/integration/ start real processes (torchrun ranks, the CLI, network
namespaces) and are marked `integration`; tests/unit/ runs in-process.

    python -m pytest -q -m "not integration"     # the fast subset, for development
"""

import hashlib
import os
from pathlib import Path

import pytest

INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)


# Each test its own result cache (`shardsim sweep` caches rows by default): never the user's
# ~/.cache, and no test served the rows another predicted (a folder under pytest's temporary
# one, made only when a sweep uses it).
@pytest.fixture(autouse=True)
def _own_result_cache(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    name = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    monkeypatch.setenv("SHARDSIM_CACHE_DIR", os.fspath(tmp_path_factory.getbasetemp() / "result-cache" / name))
