"""The Trainer in one process (gloo, world 1, tiny-mlp): its steps, the observers it calls around
them and the fields they give; the lab's observer only on CPU; the test hooks only when the
environment asks; a GPU run's record without the lab's fields."""

from __future__ import annotations

import argparse
import json
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from shardsim.config import RunConfig, Strategy
from shardsim.runtime import testing
from shardsim.runtime.collective_trace import TRACE_ENV, TraceCollectives, load_rank_trace
from shardsim.runtime.emulation.readings import HostReadings, lab_observers
from shardsim.runtime.launch import free_port
from shardsim.runtime.records import LAB_KEYS, LabReadings, RunRecord, load_run, write_run
from shardsim.runtime.train import StatusSteps, _record
from shardsim.runtime.trainer import CpuTimes, Observer, PeakMemory, Trainer

WARMUP, STEPS = 1, 2


class Log(Observer):
    """Every hook call, in order."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    def begin(self, trainer):
        self.calls.append(("begin", trainer.steps_taken))

    def before_step(self, i):
        self.calls.append(("before", i))

    def step_started(self, i):
        self.calls.append(("started", i))

    def step_computed(self, i):
        self.calls.append(("computed", i))

    def step_ended(self, i):
        self.calls.append(("ended", i))

    def after_steps(self, trainer):
        self.calls.append(("after", trainer.steps_taken))
        return {"logged": len(self.calls)}


@pytest.fixture
def group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _trainer(strategy: str = "ddp") -> Trainer:
    cfg = RunConfig(workload="tiny-mlp", topology="emu-2x2", strategy=Strategy(strategy), checkpointing="none")
    return Trainer.build(cfg, 0, 1, torch.device("cpu"), "gloo", timedelta(seconds=30))


def test_the_trainer_steps_and_calls_its_observers_around_each_step(group):
    trainer, log = _trainer(), Log()
    got = trainer.measure(WARMUP, STEPS, [log, PeakMemory(torch.device("cpu")), CpuTimes(WARMUP)])
    per_step = [[("before", i), ("started", i), ("computed", i), ("ended", i)] for i in range(WARMUP + STEPS)]
    assert log.calls == [("begin", 0), *sum(per_step, []), ("after", WARMUP + STEPS)]
    assert trainer.steps_taken == WARMUP + STEPS
    assert len(got.step_times) == len(got.losses) == WARMUP + STEPS
    assert got.warmup_times_s == got.step_times[:WARMUP] and got.step_times_s == got.step_times[WARMUP:]
    assert all(t > 0 for t in got.step_times)
    f = got.fields
    assert f["logged"] == len(log.calls)  # the observers' fields are the record's
    assert f["memory_measure"] == "cpu_peak_rss" and f["memory_allocated_by_rank_gib"] == [
        f["memory_allocated_gib"]
    ] > [0]
    assert len(f["step_cpu_times_s"]) == STEPS and f["step_cpu_times_by_rank_s"] == [f["step_cpu_times_s"]]
    # the same seeded model and batches: the same losses again
    again = _trainer().measure(WARMUP, STEPS, [])
    assert again.losses == got.losses and again.fields == {}


def test_the_lab_observes_cpu_runs_only(group):
    assert lab_observers(torch.device("cuda", 0), WARMUP, STEPS) == []
    (lab,) = lab_observers(torch.device("cpu"), WARMUP, STEPS)
    assert isinstance(lab, HostReadings)
    got = _trainer().measure(WARMUP, STEPS, [lab])
    readings = got.fields["lab"]
    assert readings.threads_per_rank == torch.get_num_threads()
    assert len(readings.host_probe_by_step_s) == STEPS and readings.host_probe_s > 0
    assert len(lab.probes) == WARMUP + STEPS  # one before every step, warm-up too


def test_test_hooks_come_only_from_the_environment(tmp_path, group):
    assert testing.observers(0, WARMUP, env={}) == []
    hooks = testing.observers(
        0,
        WARMUP,
        env={testing.FAULT_ENV: "raise@1:0", TRACE_ENV: str(tmp_path / "t"), testing.SAVE_PARAMS_ENV: str(tmp_path)},
    )
    assert [type(h) for h in hooks] == [testing.Fault, TraceCollectives, testing.SaveParams]
    assert hooks[0].at is None  # a fault for rank 1: rank 0 runs on
    _trainer().measure(WARMUP, STEPS, hooks)
    saved = testing.load_saved(tmp_path)
    assert saved["params"] and set(saved["grads"]) == set(saved["params"])
    assert len(load_rank_trace(tmp_path / "t", 0)) == STEPS  # the measured steps' collectives
    with pytest.raises(RuntimeError, match="injected fault at step 1"):
        _trainer().measure(WARMUP, STEPS, [testing.Fault("raise@0:1", 0)])


def _ns(run_id: str) -> argparse.Namespace:
    return argparse.Namespace(run_id=run_id, steps=STEPS, warmup=WARMUP)


class Status:
    def __init__(self):
        self.steps: list[int] = []

    def step(self, i):
        self.steps.append(i)


def test_a_gpu_style_record_has_no_lab_fields(tmp_path, group):
    """A run's record as `train.run` builds it, with the observers a GPU run has (no lab's): no
    `lab`, and none of its fields, in the object, the file, or the record read back; a CPU run's
    record holds them under `lab`."""
    status = Status()
    trainer = _trainer()
    measured = trainer.measure(WARMUP, STEPS, [StatusSteps(status), PeakMemory(trainer.device), CpuTimes(WARMUP)])
    assert status.steps == [*range(WARMUP + STEPS), WARMUP + STEPS]
    gpu = _record(_ns("g"), trainer, measured)
    assert gpu.lab is None
    doc = json.loads(gpu.to_json())
    assert "lab" not in doc and not set(LAB_KEYS) & set(doc)
    path = write_run(gpu, tmp_path)
    assert "lab" not in json.loads(path.read_text()) and load_run(path) == gpu

    cpu_observers = [PeakMemory(trainer.device), CpuTimes(WARMUP), *lab_observers(trainer.device, WARMUP, STEPS)]
    cpu = _record(_ns("c"), trainer, _trainer().measure(WARMUP, STEPS, cpu_observers))
    assert isinstance(cpu.lab, LabReadings) and json.loads(cpu.to_json())["lab"]["threads_per_rank"] >= 1


def test_a_record_with_the_lab_readings_at_the_top_level_loads_them_under_lab():
    from tests.helpers import run_record

    doc = run_record(host_probe_s=0.01, host_steal_share=0.2).to_dict()
    flat = {k: v for k, v in doc.items() if k != "lab"} | doc["lab"]
    r = RunRecord.from_dict(flat)
    assert r.lab == LabReadings(threads_per_rank=1, host_probe_s=0.01, host_steal_share=0.2)
    none = {k: v for k, v in doc.items() if k != "lab"} | dict.fromkeys(LAB_KEYS)
    assert RunRecord.from_dict(none).lab is None
    with pytest.raises(ValueError, match="unknown key 'host_probe_s'"):
        RunRecord.from_dict(doc | {"host_probe_s": 0.01})  # both spellings at once: not a record


def test_the_run_flags_have_no_test_hook(capsys):
    from shardsim import cli
    from shardsim.runtime.train import build_parser

    for parse in (lambda a: cli.main(["run", *a]), build_parser().parse_args):
        with pytest.raises(SystemExit) as exc:
            parse(["--save-params", "x"])
        assert exc.value.code == 2
    assert "unrecognized arguments: --save-params" in capsys.readouterr().err


def test_zero1_steps_with_zero_redundancy_and_ddp_with_plain_adam(group):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    zero1, plain = _trainer("zero1"), _trainer("ddp")
    assert isinstance(zero1.job.optimizer, ZeroRedundancyOptimizer)
    assert isinstance(plain.job.optimizer, torch.optim.Adam)
    zero1.measure(WARMUP, STEPS, [])
    plain.measure(WARMUP, STEPS, [])
    # one rank owns every partition: the same parameters as plain Adam's after the same steps
    for a, b in zip(zero1.job.model.parameters(), plain.job.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)
