"""The strategy registry: one set of kinds for the simulator and the runtime, and no kind named
by a string literal outside the strategies' own packages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from shardsim.config import STRATEGIES as NAMES
from shardsim.config import Strategy
from shardsim.core.errors import ConfigError
from shardsim.simulator.strategies import STRATEGIES, StrategyKind

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "shardsim"
OWNERS = (PACKAGE / "spec" / "strategies", PACKAGE / "simulator" / "strategies", PACKAGE / "runtime" / "strategies")
# SageMaker's model-parallel parameters include keys spelled `ddp` and `pipeline`: parameter
# names of its own, not shardsim's kinds (shardsim/config/smp.py reads them).
SAGEMAKER_KEYS = {("shardsim/config/smp.py", "ddp"): 2, ("shardsim/config/smp.py", "pipeline"): 6}


def kind_literals(path: Path) -> list[tuple[int, str]]:
    """(line, kind) of every string constant in `path` that is a strategy kind's name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in STRATEGIES
    ]


def test_runtime_registers_an_engine_for_every_kind():
    pytest.importorskip("torch")
    from shardsim.runtime.strategies import STRATEGIES as ENGINES

    assert list(ENGINES) == list(STRATEGIES)


def test_every_kind_implements_the_protocol():
    members = [m for m in dir(StrategyKind) if not m.startswith("_")] + list(StrategyKind.__annotations__)
    for name, kind in STRATEGIES.items():
        assert kind.name == name
        missing = [m for m in members if not hasattr(kind, m)]
        assert not missing, f"{name} lacks {missing}"


def test_the_configuration_offers_the_registered_kinds():
    assert NAMES == tuple(STRATEGIES)


def test_an_unknown_kind_is_refused_from_python():
    with pytest.raises(ConfigError, match="unknown strategy 'zero3'"):
        Strategy("zero3").label()


def test_no_kind_literal_outside_the_strategies():
    found: dict[tuple[str, str], list[int]] = {}
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if not any(p.is_relative_to(owner) for owner in OWNERS)]
    assert len(paths) > 100  # the whole package outside the strategies, not an empty folder
    for path in paths:
        for line, kind in kind_literals(path):
            found.setdefault((str(path.relative_to(ROOT)), kind), []).append(line)
    stray = {k: v for k, v in found.items() if len(v) != SAGEMAKER_KEYS.get(k, 0)}
    assert not stray, f"kind names spelled out (file, kind): lines {stray}"


def test_the_count_sees_a_literal(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('if cfg.strategy.kind == "zero2d":\n    pass\nx = "zero2d d=4"\n')
    assert kind_literals(path) == [(1, "zero2d")]
