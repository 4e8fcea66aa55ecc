"""Every input is bounded before any work, and refused in one line naming what is wrong: a
model's shape before it is built into blocks, a configuration's sizes, the ranks of a collective
and of a run, a sweep's workers and size; and the commands a message suggests run as written."""

from __future__ import annotations

import io
import os
import shlex
import subprocess

import pytest

import shardsim.runtime.plan as rcli
from shardsim.cli import sweep as sweep_cli
from shardsim.cli.cluster import down_command
from shardsim.config import RunConfig, Strategy
from shardsim.core.errors import ConfigError
from shardsim.runtime.emulation.ownership import Holder, TopologyBusy, held_by, keep, owning, runtime_dir
from shardsim.simulator.collective import simulate_collective
from shardsim.simulator.scale import (
    MAX_PLAN_OPS,
    MAX_SWEEP_SPACE,
    SWEEP_CONFIRM_ABOVE,
    plan_refusal,
)
from shardsim.specs.bounds import MAX_LAYERS
from shardsim.specs.model import blocks
from shardsim.sweep import search, task
from shardsim.sweep.space import SweepSpace, _strategies_for, strategies_count
from tests.helpers import one_tier
from tests.unit.test_flag_bounds import exit_status, refused
from tests.unit.test_readme_examples import examples_of

# the settings lists of the sweep's docs, in full: with `--tp 1`, 2,304 configurations of the seed scenario
# (DDP and replicated pipeline stages reduce fp16 too, by the compression hook)
MANY = ["--checkpointing", "none,full,selective", "--selective-ac-options", "op,2", "--reduce-dtypes", "fp32,fp16",
        "--optimizer-impls", "foreach,fused,per-parameter"]  # fmt: skip


@pytest.fixture
def nothing_built(monkeypatch):
    """Building a model into blocks fails the test, wherever `from_arch` is looked up (the modules
    that import it by name are imported first, so that none keeps this test's stand-in for good)."""
    import shardsim.simulator.predict as predict
    import shardsim.simulator.workload.resolve as load

    for module in (blocks, load, predict):
        monkeypatch.setattr(module, "from_arch", lambda *a, **k: pytest.fail("the model was built into blocks"))


@pytest.fixture
def nothing_predicted(monkeypatch):
    """Predicting a sweep's configurations fails the test."""
    monkeypatch.setattr(search, "predict_all", lambda *a, **k: pytest.fail("the sweep started predicting"))


# --- a model's shape and a configuration's sizes -----------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["predict", "--workload", "{family: gpt, hidden: 64, layers: 10000000, heads: 1, seq_len: 8, vocab: 8}"],
         "workload.layers"),
        (["predict", "--workload", "{family: gpt, hidden: 4194304, layers: 2, heads: 1, seq_len: 8, vocab: 8}"],
         "workload.hidden"),
        (["predict", "--workload", "{family: vit, hidden: 64, layers: 2, heads: 1, image: 1048576, patch: 1}"],
         "workload.image"),
    ],
    ids=["layers", "hidden", "vit-patches"],
)  # fmt: skip
def test_a_model_beyond_the_bounds_is_refused_before_it_is_built(capsys, nothing_built, argv, field) -> None:
    err = refused(capsys, argv)
    assert f"field '{field}'" in err and "beyond the simulator's bound" in err, err


def test_a_model_file_beyond_the_bounds_is_refused_before_it_is_built(capsys, nothing_built, tmp_path) -> None:
    model = tmp_path / "deep.yaml"
    model.write_text("family: gpt\nhidden: 64\nlayers: 10000000\nheads: 1\nseq_len: 8\nvocab: 8\n")
    err = refused(capsys, ["predict", "--workload", str(model)])
    assert str(model) in err and "field 'layers'" in err and f"{MAX_LAYERS:,}" in err, err


@pytest.mark.parametrize(
    ("text", "field"),
    [("batch_per_device: 100000000\n", "batch_per_device"), ("seed: 100000000000000000000000\n", "seed"),
     ("grad_accum: 1000000000\n", "grad_accum"), ("workload: tiny-gpt\nlayers: 100000000\n", "layers")],
    ids=["batch", "seed", "grad_accum", "layers"],
)  # fmt: skip
def test_a_configuration_file_beyond_the_bounds_names_the_file_and_field(capsys, nothing_built, tmp_path, text, field):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    err = refused(capsys, ["predict", str(cfg)])
    assert str(cfg) in err and f"field '{field}'" in err and "beyond the simulator's bound" in err, err


def test_a_plan_too_big_for_its_layers_names_the_layers_not_grad_accum() -> None:
    # grad_accum 1 and one microbatch: a pipeline of tensor-parallel sharded stages of 8,192 layers each is
    # beyond the op bound
    stage = Strategy("pipeline", degree=2, pp=2, microbatches=1, tp=2, sequence_parallel=True)
    big = RunConfig(workload="tiny-gpt", grad_accum=1, strategy=stage)
    why = plan_refusal(big, MAX_LAYERS)
    assert why is not None and why.field == "layers" and "fewer layers" in why.message, why
    many = RunConfig(workload="tiny-gpt", grad_accum=1, strategy=Strategy("pipeline", degree=2, pp=2, microbatches=512))
    assert plan_refusal(many, 100).field == "microbatches"
    accum = RunConfig(workload="tiny-gpt", grad_accum=10_000, strategy=Strategy("zero", degree=8))
    refusal = plan_refusal(accum, 4)
    assert refusal.field == "grad_accum" and f"{MAX_PLAN_OPS:,}" in refusal.message


def test_predict_names_the_layers_when_they_make_the_step_too_big(capsys) -> None:
    argv = ["predict", "--workload", "tiny-gpt", "--layers", str(MAX_LAYERS), "--topology", "p4d.24xlarge",
            "--nodes", "1", "--strategy", "pipeline", "--pp", "2", "--degree", "2", "--tp", "2",
            "--sequence-parallel"]  # fmt: skip
    err = refused(capsys, argv)
    assert "field 'layers'" in err and "grad_accum'" not in err and "microbatches'" not in err, err


# --- ranks: a collective's, a run's -------------------------------------------------------------------------


def test_a_collective_over_more_ranks_than_the_cluster_or_one_is_refused(capsys) -> None:
    err = refused(capsys, ["collective", "--topology", "p4d.24xlarge", "--ranks", "9"])
    assert "field 'ranks'" in err and "2 to the 8 devices of 1 x p4d.24xlarge" in err and "--nodes" in err, err
    assert "--ranks" in refused(capsys, ["collective", "--ranks", "1"])
    with pytest.raises(ConfigError, match="not 1 ranks"):  # a cluster of one device has no collective
        simulate_collective(one_tier(1), "all_reduce", 2**20)


def test_the_ranks_of_a_collective_within_the_cluster_run(capsys) -> None:
    assert main_json(capsys, ["collective", "--topology", "p4d.24xlarge", "--ranks", "3"])["ranks"] == 3


def main_json(capsys, argv: list[str]) -> dict:
    import json

    assert exit_status([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def no_spawn(monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a process was started for bad input"))
    monkeypatch.setattr(rcli, "gpu_count", lambda: 0)


def test_a_cpu_run_takes_at_most_its_ranks_per_core(capsys, monkeypatch, no_spawn) -> None:
    monkeypatch.setattr(task, "default_workers", lambda: 2)
    assert rcli.cpu_rank_limit() == max(rcli.MAX_CPU_RANKS, 2 * rcli.CPU_RANKS_PER_CORE)
    argv = ["run", "--topology", "emu-2x2", "--workload", "tiny-gpt", "--no-emulate", "--nproc", "200"]
    err = refused(capsys, argv)
    assert "200 CPU ranks" in err and f"at most {rcli.cpu_rank_limit()}" in err and "--nproc" in err, err
    monkeypatch.setattr(task, "default_workers", lambda: 64)  # a bigger machine runs more
    cfg = RunConfig(workload="tiny-gpt", topology="emu-2x2", strategy=Strategy("ddp"))
    assert rcli.plan_run(cfg, 200, emulate=False).nproc == 200


def test_profile_on_cuda_without_a_cuda_device_is_refused_before_timing(capsys, monkeypatch, tmp_path) -> None:
    import torch

    from shardsim.cli import profile as profile_cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(profile_cli, "build_profile", lambda *a, **k: pytest.fail("profiling started"))
    argv = ["profile", "--workload", "tiny-mlp", "--topology", "emu-2x2", "--no-links", "--no-sharing",
            "--device", "cuda", "--out", str(tmp_path / "profile.json")]  # fmt: skip
    err = refused(capsys, argv)
    assert "field 'device'" in err and "no CUDA device" in err, err
    assert not (tmp_path / "profile.json").exists()


# --- a sweep's workers and size -----------------------------------------------------------------------------


def test_sweep_workers_are_capped_at_the_cores_with_a_note(capsys, monkeypatch) -> None:
    monkeypatch.setattr(task, "default_workers", lambda: 2)
    asked = []
    real = search.predict_all
    monkeypatch.setattr(search, "predict_all", lambda *a, **k: asked.append(k["workers"]) or real(*a, **k))
    argv = [
        "sweep",
        "--workload",
        "tiny-gpt",
        "--nodes",
        "1",
        "--strategies",
        "ddp,zero",
        "--no-progress",
        "--exhaustive",
    ]
    assert exit_status([*argv, "--workers", "96"]) == 0
    assert asked == [2]
    assert "--workers 96: this machine has 2 cores; the sweep runs 2 processes" in capsys.readouterr().err
    assert exit_status([*argv, "--workers", "1"]) == 0 and asked == [2, 1]


def test_the_readme_sweeps_start_without_asking() -> None:
    from shardsim.cli import build_parser
    from shardsim.sweep.space import enumerate_configs

    examples = examples_of("sweep")
    assert examples
    for argv in examples:
        base, space = sweep_cli._build(build_parser().parse_args(argv))
        assert len(enumerate_configs(base, space).candidates) <= SWEEP_CONFIRM_ABOVE, argv


def test_a_big_sweep_says_its_size_and_needs_yes_off_a_terminal(capsys, monkeypatch, nothing_predicted) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    err = refused(capsys, ["sweep", *MANY, "--tp", "1"])
    assert "2,304 configurations" in err and "about" in err and "--yes" in err, err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_big_sweep_on_a_terminal_asks_first(capsys, monkeypatch, nothing_predicted) -> None:
    monkeypatch.setattr("sys.stdin", _Terminal("n\n"))
    assert exit_status(["sweep", *MANY, "--tp", "1"]) == 2
    err = capsys.readouterr().err
    assert "2,304 configurations" in err and "start it? [y/N]" in err and "was not started" in err, err


def test_a_big_sweep_starts_on_a_yes_typed_or_given(capsys, monkeypatch) -> None:
    monkeypatch.setattr(sweep_cli, "SWEEP_CONFIRM_ABOVE", 1)  # so that a sweep of two configurations is big
    small = "sweep --workload tiny-gpt --nodes 1 --strategies ddp,zero --tp 1 --workers 1".split()
    monkeypatch.setattr("sys.stdin", _Terminal("y\n"))
    assert exit_status(small) == 0
    out, err = capsys.readouterr()
    assert "start it? [y/N]" in err and "zero" in out
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert exit_status([*small, "--yes"]) == 0
    assert "sweeping 2 configurations" in capsys.readouterr().err


def test_a_sweep_beyond_the_space_bound_is_refused_before_it_is_enumerated(capsys, nothing_predicted) -> None:
    nodes = ",".join(str(2**k) for k in range(12))
    err = refused(capsys, ["sweep", "--nodes", nodes, *MANY, "--yes"])
    assert f"beyond the sweep's bound of {MAX_SWEEP_SPACE:,}" in err, err


@pytest.mark.parametrize(
    "space",
    [SweepSpace(), SweepSpace(degrees=(4, 2, 4, 64)), SweepSpace(pp=(1, 2, 3), microbatches=(2, 8)),
     SweepSpace(strategies=("zero2d", "pipeline"), schedules=("gpipe",))],
    ids=["default", "degrees", "pp-microbatches", "kinds"],
)  # fmt: skip
@pytest.mark.parametrize("world", [1, 12, 64])
def test_the_strategies_are_counted_as_they_are_enumerated(space, world) -> None:
    for reshard in ((True,), (True, False)):
        made = list(_strategies_for(world, 24, 4, space, reshard))
        assert strategies_count(world, 24, 4, space, reshard) == len(made)


# --- commands a message suggests ----------------------------------------------------------------------------


def test_cluster_down_is_suggested_as_it_runs_from_any_folder(tmp_path, monkeypatch) -> None:
    shipped = down_command("emu-2x2", None)
    assert shipped == "shardsim cluster down emu-2x2"
    folder = tmp_path / "my topologies"
    folder.mkdir()
    monkeypatch.chdir(folder)
    words = shlex.split(down_command("my emu.yaml", 3))
    assert words == ["shardsim", "cluster", "down", str(folder / "my emu.yaml"), "--nodes", "3"]


def test_a_kept_cluster_names_the_command_that_takes_it_down(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SHARDSIM_RUNTIME_DIR", str(tmp_path / "run"))
    assert runtime_dir() == tmp_path / "run"
    down = down_command(str(tmp_path / "my emu.yaml"), None)
    with owning("ss-my-emu", present=lambda: True):
        keep("ss-my-emu", down)
    with pytest.raises(TopologyBusy) as exc:
        with owning("ss-my-emu", label="my-emu", present=lambda: True):
            pass
    assert f"until `{down}`" in str(exc.value)
    assert shlex.split(down)[3] == str(tmp_path / "my emu.yaml")
    os.remove(tmp_path / "run" / "ss-my-emu.json")
    older = Holder(1, "shardsim cluster up x", 0.0, kept=True)  # a record without its command
    assert "until `shardsim cluster down 'my emu'`" in held_by("my emu", older)


def test_the_install_command_runs_from_a_python_in_a_folder_with_spaces(monkeypatch) -> None:
    from shardsim.core import torch_required

    monkeypatch.setattr(torch_required.sys, "executable", "/opt/my python/bin/python3")
    words = shlex.split(torch_required.install_command())
    assert words[:4] == ["/opt/my python/bin/python3", "-m", "pip", "install"]
