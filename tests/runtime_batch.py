"""Several runtime configurations in one torchrun launch: each rank imports torch once, joins one
gloo process group and trains every configuration of the batch in turn, as a ``shardsim run``
rank trains one (`runtime.trainer.Trainer` with the same observers, rank 0's `RunRecord` written
to the configuration's own folder), with the test hooks a case asks for (`runtime.testing`:
saved parameters, traced collectives). Each configuration's record (or how it failed) comes
back under its own name, so a test asserts on its configuration alone. ::

    results = run_batch(tmp_path, world=2, cases={"ddp": ["--workload", "tiny-gpt", ...]})
    results["ddp"].record, results["ddp"].folder   # folder: out/, params/, trace/ of that case

A test module registers its cases when it is imported (`register`); the session's
`SessionBatches` (the ``runtime_batches`` fixture of tests/conftest.py) launches every
registered case of a world size, of every module collected, the first time a test asks for
one of them: one launch per world size for the whole session. ::

    register("strategies", CASES, trace={"zero-ep2"})             # at import
    batches = runtime_batches.module("strategies")                 # a module's view
    batches["zero-ep2"].record

A rank that fails writes its error under the case's name and ends the launch (torchrun stops
the others): that case reports the error, the cases after it that they did not run.

The rank side: ``python -m tests.runtime_batch BATCH.json`` under torchrun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from shardsim.runtime.launch import TORCHRUN_FLAGS

ROOT = Path(__file__).resolve().parents[1]
STEPS, WARMUP = 2, 1  # as `tests.integration.test_runtime_strategies.shardsim_run`
RUN_FLAGS = ["--steps", str(STEPS), "--warmup", str(WARMUP), "--timeout", "30", "--data-batches", "1"]
LAUNCH_TIMEOUT_S = 900


@dataclass
class CaseResult:
    """One configuration's outcome: its record (rank 0's), or why there is none."""

    name: str
    folder: Path  # out/ (record and runs.csv), params/ (SaveParams), trace/ (collective traces)
    record: dict | None
    error: str

    def ok(self) -> dict:
        """The record; fails the calling test with this configuration's error when there is none."""
        assert self.record is not None, f"{self.name}: {self.error}"
        return self.record


def _chosen(option: bool | Collection[str], name: str) -> bool:
    """`option` for case `name`: every case's (True), none's (False), or the cases named."""
    return option if isinstance(option, bool) else name in option


def run_batch(
    tmp_path: Path,
    world: int,
    cases: dict[str, list[str]],
    *,
    save_params: bool | Collection[str] = True,
    trace: bool | Collection[str] = False,
) -> dict[str, CaseResult]:
    """Run every case (``shardsim run`` flags: configuration, --steps etc.; never --nproc) in one
    torchrun launch of `world` ranks on this machine (``--standalone``: a free rendezvous port
    of its own); {case name: CaseResult}. `save_params`, `trace`: every case's parameters saved
    (collectives traced), or those of the cases named."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    folders = {name: tmp_path / name for name in cases}
    spec = {
        "cases": [
            {
                "name": name,
                "argv": [*RUN_FLAGS, *argv, "--out", str(folders[name] / "out")],
                "params": str(folders[name] / "params") if _chosen(save_params, name) else None,
                "trace": str(folders[name] / "trace") if _chosen(trace, name) else None,
                "result": str(folders[name] / "record.json"),
                "error": str(folders[name] / "error.txt"),
            }
            for name, argv in cases.items()
        ]
    }
    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           *TORCHRUN_FLAGS, f"--log-dir={tmp_path / 'torchrun'}", "-m", "tests.runtime_batch", str(batch)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "TMPDIR": str(tmp_path)}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S, env=env)
    out: dict[str, CaseResult] = {}
    failed = ""
    for case in spec["cases"]:
        name, result, error = case["name"], Path(case["result"]), Path(case["error"])
        if result.exists():
            out[name] = CaseResult(name, folders[name], json.loads(result.read_text()), "")
            continue
        if error.exists():
            failed = failed or name
            why = error.read_text()
        elif failed:
            why = f"not run: the launch ended at {failed!r}"
        else:
            why = f"no result (torchrun exited {proc.returncode}):\n{proc.stderr[-3000:]}"
        out[name] = CaseResult(name, folders[name], None, why)
    return out


Cases = dict[str, tuple[int, list[str]]]  # {name: (world, `shardsim run` flags)}


@dataclass
class _Module:
    """A test module's cases; `cases` may be a function of the module's folder (for a case that
    reads a file the module writes there)."""

    cases: Cases | Callable[[Path], Cases]
    save_params: bool | Collection[str]
    trace: bool | Collection[str]


_MODULES: dict[str, _Module] = {}
SEP = "."  # between a module's name and its case's in a launch


def register(
    module: str,
    cases: Cases | Callable[[Path], Cases],
    *,
    save_params: bool | Collection[str] = True,
    trace: bool | Collection[str] = False,
) -> None:
    """A test module's cases, launched with every other registered module's of their world size."""
    _MODULES[module] = _Module(cases, save_params, trace)


class ModuleBatches:
    """A module's view of the session's launches: ``batches[name]`` is its case's result."""

    def __init__(self, session: SessionBatches, module: str):
        self.session, self.module = session, module
        self.folder = session.folder / module  # what the module's cases read (files it writes)
        self.folder.mkdir(parents=True, exist_ok=True)
        entry = _MODULES[module]
        self.cases: Cases = entry.cases(self.folder) if callable(entry.cases) else entry.cases

    def __getitem__(self, name: str) -> CaseResult:
        return self.session.result(self.module, name)


class SessionBatches:
    """Every registered case, launched one batch per world size (all modules' cases of that size)
    when a test first asks for one of them."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.views: dict[str, ModuleBatches] = {}
        self.results: dict[str, CaseResult] = {}

    def module(self, module: str) -> ModuleBatches:
        if module not in self.views:
            self.views[module] = ModuleBatches(self, module)
        return self.views[module]

    def result(self, module: str, name: str) -> CaseResult:
        key = f"{module}{SEP}{name}"
        if key not in self.results:
            self.launch(self.module(module).cases[name][0])
        return self.results[key]

    def launch(self, world: int) -> None:
        """Every registered module's cases of `world` ranks that have not run, in one launch."""
        cases: dict[str, list[str]] = {}
        params: set[str] = set()
        traced: set[str] = set()
        for module, entry in _MODULES.items():
            for name, (w, argv) in self.module(module).cases.items():
                key = f"{module}{SEP}{name}"
                if w != world or key in self.results:
                    continue
                cases[key] = argv
                if _chosen(entry.save_params, name):
                    params.add(key)
                if _chosen(entry.trace, name):
                    traced.add(key)
        launched = self.folder / f"world{world}-{len(self.results)}"
        self.results.update(run_batch(launched, world, cases, save_params=params, trace=traced))


def _run_case(case: dict, rank: int, world: int, device, timeout: timedelta) -> None:
    import torch.distributed as dist

    from shardsim.runtime import train
    from shardsim.runtime.collective_trace import TraceCollectives
    from shardsim.runtime.emulation.readings import lab_observers
    from shardsim.runtime.records import write_run
    from shardsim.runtime.testing import SaveParams
    from shardsim.runtime.trainer import CpuTimes, ExpertTokens, PeakMemory, Trainer

    ns = train.build_parser().parse_args(case["argv"])
    cfg = train.rank_config(ns)
    trainer = Trainer.build(cfg, rank, world, device, "gloo", timeout, ns.data_batches)
    observers = [PeakMemory(device), CpuTimes(ns.warmup), ExpertTokens(ns.warmup)]
    observers += lab_observers(device, ns.warmup, ns.steps)
    if case["trace"]:
        observers.append(TraceCollectives(case["trace"], rank, ns.warmup))
    if case["params"]:
        observers.append(SaveParams(case["params"]))
    measured = trainer.measure(ns.warmup, ns.steps, observers)
    if rank == 0:
        record = train._record(ns, trainer, measured)
        write_run(record, ns.out)
        Path(case["result"]).write_text(record.to_json())
    dist.barrier()


def main(path: str) -> int:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    timeout = timedelta(seconds=30)
    dist.init_process_group("gloo", timeout=timeout)
    device = torch.device("cpu")
    for case in json.loads(Path(path).read_text())["cases"]:
        try:
            _run_case(case, rank, world, device, timeout)
        except BaseException:
            Path(case["error"]).parent.mkdir(parents=True, exist_ok=True)
            with open(case["error"], "a") as f:
                f.write(f"rank {rank}: {traceback.format_exc()}")
            return 1
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from shardsim.runtime.processes import exit_now

    exit_now(main(sys.argv[1]))  # gloo's threads may outlive the process group: no finalization
