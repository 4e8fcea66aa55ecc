"""The training figures fitted to the calibration set live once (topologies/fitted/training.yaml):
shipped GPU topologies read them with `training_figures: fitted`, a figure a topology gives itself
replaces the fitted one, and a user's file without that key reads as it always did."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shardsim.cli import main
from shardsim.core.errors import ConfigError
from shardsim.specs.hardware.topology import (
    FITTED_FILE,
    TRAINING_FIGURES,
    KernelSpec,
    builtin_topologies,
    builtin_topology_dir,
    fitted_training_figures,
    load_instance,
)
from tests.unit.test_topologies import unsourced_figures

UNSET = {n: KernelSpec.__dataclass_fields__[n].default for n in TRAINING_FIGURES}  # what a kernels mapping lacks


def _raw(name: str) -> dict:
    return yaml.safe_load((builtin_topology_dir() / name).read_text())


def _training(inst) -> dict[str, float]:
    return {n: getattr(inst.device.kernels, n) for n in TRAINING_FIGURES}


def mine(tmp_path: Path, edit, name: str = "p4d.24xlarge") -> Path:
    """A user's topology file: the shipped `name` with `edit` applied to its kernels mapping."""
    data = _raw(f"{name}.yaml")
    edit(data["device"]["kernels"])
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_fitted_file_holds_the_three_figures_each_with_its_source():
    raw = _raw(FITTED_FILE)
    assert tuple(raw) == TRAINING_FIGURES
    assert unsourced_figures(raw) == []


@pytest.mark.parametrize("name", builtin_topologies())
def test_no_shipped_topology_repeats_a_fitted_figure(name):
    kernels = _raw(f"{name}.yaml")["device"].get("kernels") or {}
    assert not set(TRAINING_FIGURES) & set(kernels)


@pytest.mark.parametrize("name", [n for n in builtin_topologies() if load_instance(n).device.kernels is not None])
def test_every_shipped_gpu_reads_the_fitted_figures_and_their_sources(name):
    values, sources = fitted_training_figures()
    inst = load_instance(name)
    assert _training(inst) == values
    assert {n: inst.sources[f"device.kernels.{n}"] for n in TRAINING_FIGURES} == sources


def test_a_copy_of_a_shipped_file_reads_as_the_shipped_one(tmp_path):
    assert load_instance(str(mine(tmp_path, lambda k: None))).device == load_instance("p4d.24xlarge").device


def test_the_figures_written_inline_read_as_the_fitted_ones(tmp_path):
    fitted = _raw(FITTED_FILE)

    def inline(k: dict) -> None:
        del k["training_figures"]
        k.update(fitted)

    assert load_instance(str(mine(tmp_path, inline))).device == load_instance("p4d.24xlarge").device


def test_a_figure_the_topology_gives_replaces_the_fitted_one(tmp_path):
    path = mine(tmp_path, lambda k: k.update(rank_time_cv={"value": 0.0, "source": "mine"}))
    inst = load_instance(str(path))
    values, _ = fitted_training_figures()
    assert _training(inst) == values | {"rank_time_cv": 0.0}
    assert inst.sources["device.kernels.rank_time_cv"] == "mine"


def test_a_user_file_without_the_key_reads_as_before(tmp_path):
    path = mine(tmp_path, lambda k: k.pop("training_figures"))
    assert _training(load_instance(str(path))) == UNSET

    def own(k: dict) -> None:
        del k["training_figures"]
        k["gemm_training_fraction"] = 0.7

    assert _training(load_instance(str(mine(tmp_path, own)))) == UNSET | {"gemm_training_fraction": 0.7}


def test_a_user_file_without_kernels_has_none(tmp_path):
    data = _raw("p4d.24xlarge.yaml")
    del data["device"]["kernels"]
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_instance(str(path)).device.kernels is None


def test_a_misspelt_reference_is_one_line(tmp_path, capsys):
    path = mine(tmp_path, lambda k: k.update(training_figures="fited"))
    with pytest.raises(ConfigError) as e:
        load_instance(str(path))
    assert (e.value.where, e.value.field) == (str(path), "device.kernels.training_figures")
    assert "expected one of fitted, got 'fited'" in str(e.value)
    assert main(["predict", "--topology", str(path), "--nodes", "1", "--workload", "tiny-gpt"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardsim: error: ") and len(err.strip().splitlines()) == 1
