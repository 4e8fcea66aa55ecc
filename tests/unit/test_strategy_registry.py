"""The strategy registries: one registry per concern (the configuration's spec, the simulator's
planner, the sweep's face, the validation matrix's shorthand, the runtime's engine), all under the
same kinds in the same order, and no kind named by a string literal outside the strategies' own
packages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from shardsim.config import STRATEGIES as NAMES
from shardsim.config import Strategy
from shardsim.core.errors import ConfigError
from shardsim.runtime.validation.shorthand import SHORTHANDS
from shardsim.simulator.strategies.planners import PLANNERS, Planner
from shardsim.specs.strategies import STRATEGIES, StrategySpec
from shardsim.sweep.faces import FACES, Face

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "shardsim"
OWNERS = (PACKAGE / "specs" / "strategies", PACKAGE / "simulator" / "strategies", PACKAGE / "runtime" / "strategies")
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


def test_every_concern_registers_the_same_kinds_in_the_same_order():
    pytest.importorskip("torch")
    from shardsim.runtime.strategies import STRATEGIES as ENGINES

    registries = {"planner": PLANNERS, "sweep face": FACES, "matrix shorthand": SHORTHANDS, "engine": ENGINES}
    assert len(STRATEGIES) == 5
    for concern, registry in registries.items():
        assert list(registry) == list(STRATEGIES), concern


@pytest.mark.parametrize(
    "registry, protocol",
    [(STRATEGIES, StrategySpec), (PLANNERS, Planner), (FACES, Face)],
    ids=["spec", "planner", "face"],
)
def test_every_kind_implements_its_concerns_protocol(registry, protocol):
    members = [m for m in dir(protocol) if not m.startswith("_")] + list(protocol.__annotations__)
    assert members
    for name, entry in registry.items():
        missing = [m for m in members if not hasattr(entry, m)]
        assert not missing, f"{name} lacks {missing}"


def test_every_spec_is_registered_under_its_name():
    assert all(spec.name == name for name, spec in STRATEGIES.items())


def test_each_concern_answers_only_its_own_questions():
    """The spec holds no planning, sweeping or plotting; the planner and the face no spec."""
    spec_members = {m for m in dir(StrategySpec) if not m.startswith("_")} | set(StrategySpec.__annotations__)
    for spec in STRATEGIES.values():
        assert not any(hasattr(spec, m) for m in ("plan", "ops_estimate", "sweep", "color", "matrix_entries"))
    for entry in (*PLANNERS.values(), *FACES.values()):
        assert not any(hasattr(entry, m) for m in spec_members)


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


def test_the_sweeps_strategies_flag_says_its_default_from_the_faces(capsys):
    """The sweep's `--strategies` help names the kinds a sweep tries by default, and those it tries only when named."""
    from shardsim.cli import main

    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "kinds to include (default: ddp,zero,zero2d,pipeline; zero1 only when named)" in text
    assert [k for k, face in FACES.items() if not face.in_default_sweep] == ["zero1"]
