"""Tests under tests/integration/ start real processes (torchrun ranks, the CLI, network
namespaces) and are marked `integration`; tests/unit/ runs in-process.

    python -m pytest -q -m "not integration"     # the fast subset, for development
"""

from pathlib import Path

import pytest

INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)
