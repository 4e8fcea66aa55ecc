"""PyTorch's names of two kinds, fsdp (zero) and hsdp (zero2d), are taken wherever a kind's name
is: a flag, the sweep's list, a configuration file, a validation matrix, Python; every output
names the kind."""

from __future__ import annotations

import json

import pytest

from shardsim.cli import main
from shardsim.config import STRATEGIES, RunConfig, Strategy, load_config
from shardsim.runtime.validation.matrix import load_matrix
from shardsim.specs.strategies import ALIASES
from shardsim.sweep.space import SweepSpace

TINY = ["--workload", "tiny-gpt", "--json"]


def _predicted(capsys, *argv: str) -> dict:
    assert main(["predict", *TINY, *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("alias", "kind", "more"), [("fsdp", "zero", ()), ("hsdp", "zero2d", ("--degree", "4"))])
def test_the_strategy_flag_takes_an_alias_and_prints_the_kind(capsys, alias, kind, more) -> None:
    by_alias = _predicted(capsys, "--strategy", alias, *more)
    by_kind = _predicted(capsys, "--strategy", kind, *more)
    assert by_alias["strategy"]["kind"] == kind and by_alias == by_kind


def test_a_file_takes_an_alias_flat_or_in_a_mapping(tmp_path) -> None:
    flat, mapping = tmp_path / "flat.yaml", tmp_path / "mapping.yaml"
    flat.write_text("workload: tiny-gpt\nstrategy: fsdp\n")
    mapping.write_text("workload: tiny-gpt\nstrategy: {kind: hsdp, degree: 4}\n")
    assert load_config(flat).strategy == load_config(None, {"workload": "tiny-gpt", "strategy": "zero"}).strategy
    assert load_config(mapping).strategy.label() == "zero2d d=4"
    assert load_config(flat, {"strategy": "hsdp", "degree": 8}).strategy.label() == "zero2d d=8"  # a flag's value


def test_python_takes_an_alias() -> None:
    assert SweepSpace(strategies=("fsdp", "hsdp", "ddp")).strategies == ("zero", "zero2d", "ddp")
    assert Strategy("hsdp", degree=4) == Strategy("zero2d", degree=4)
    assert RunConfig(strategy="fsdp").strategy.kind == "zero"
    assert RunConfig(strategy={"kind": "hsdp", "degree": 2}).strategy.label() == "zero2d d=2"


def test_the_sweep_list_takes_aliases_and_its_rows_name_the_kinds(capsys) -> None:
    argv = ["sweep", *TINY, "--tp", "1", "--degrees", "4", "--no-cache", "--workers", "1", "--no-progress"]
    assert main([*argv, "--strategies", "fsdp,hsdp"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert sorted(r["label"] for r in rows) == ["zero", "zero2d d=4"]
    assert {r["strategy"]["kind"] for r in rows} == {"zero", "zero2d"}
    assert main([*argv, "--strategies", "zero,zero2d"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == rows


def test_a_validation_matrix_takes_an_alias(tmp_path) -> None:
    def labels(strategies: str) -> list[str]:
        path = tmp_path / f"{strategies}.yaml"
        path.write_text(f"workload: tiny-gpt\ntopologies:\n  emu-2x2: [{strategies}]\n")
        return [c.strategy.label() for c in load_matrix(str(path)).configs]

    assert labels("fsdp, hsdp") == labels("zero, zero2d") and labels("fsdp")


def test_an_unknown_name_is_still_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["predict", "--strategy", "fsdp2"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "invalid choice: 'fsdp2'" in err, err


def test_an_alias_is_no_kind_of_its_own() -> None:
    assert ALIASES == {"fsdp": "zero", "hsdp": "zero2d"} and not set(ALIASES) & set(STRATEGIES)
