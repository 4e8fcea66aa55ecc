"""Test support: hooks the tests install in a real run's ranks, through the environment of
``shardsim run`` (torchrun passes it on to every rank). A user's run sets none of them and gets
no observer from here.

- ``SHARDSIM_FAULT=kind@rank:step`` (kind: raise | kill | hang | stop | exit) injects a fault at
  the start of that step (`Fault`), for testing the fault handling: `hang` sleeps for ever,
  `stop` stops the process (SIGSTOP: it ignores SIGTERM too, as a rank stuck in the kernel would).
- ``SHARDSIM_SAVE_PARAMS=DIR`` saves the final parameters and the gradients of one more step's
  batches, full tensors, one file per pipeline stage (`SaveParams`; `load_saved` reads them back),
  for comparing a strategy with the single-process reference (tests/reference.py).
- ``SHARDSIM_TRACE_COLLECTIVES=DIR``: each rank writes the collectives of every measured step to
  ``DIR/rank<r>.json`` (`runtime.collective_trace.TraceCollectives`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from shardsim.runtime.collective_trace import TRACE_ENV
from shardsim.runtime.trainer import Observer, Trainer

FAULT_ENV = "SHARDSIM_FAULT"
SAVE_PARAMS_ENV = "SHARDSIM_SAVE_PARAMS"


class Fault(Observer):
    """A fault to inject before a step: ``kind@rank:step``; a rank other than `rank` does nothing."""

    def __init__(self, spec: str | None, rank: int):
        self.at: int | None = None
        self.kind = ""
        self.rank = rank
        if not spec:
            return
        kind, _, where = spec.partition("@")
        r, _, s = where.partition(":")
        if int(r) == rank:
            self.kind, self.at = kind, int(s or 0)

    def before_step(self, i: int) -> None:
        self.check(i)

    def check(self, step: int) -> None:
        if self.at != step:
            return
        if self.kind == "raise":
            raise RuntimeError(f"injected fault at step {step}")
        if self.kind == "exit":
            os._exit(3)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "hang":
            while True:
                time.sleep(3600)
        if self.kind == "stop":
            print(f"shardsim: rank {self.rank} stops itself at step {step} ({FAULT_ENV})", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)


class SaveParams(Observer):
    """After the steps: the final parameters, then the gradients of one more step's batches (not
    applied; with Adam the parameters hide a wrongly scaled gradient, the gradients do not), saved
    to ``folder/stage<s>.pt`` by the ranks that keep the full state. Every rank takes part (the
    full tensors are gathered)."""

    def __init__(self, folder: str):
        self.folder = folder

    def after_steps(self, trainer: Trainer) -> dict[str, Any]:
        import torch

        job = trainer.job
        params = job.state()
        job.forward_backward(job.make_batches(trainer.steps_taken))
        grads = job.state()
        if params is not None:
            os.makedirs(self.folder, exist_ok=True)
            saved = {"params": params["params"], "grads": grads["grads"]}
            torch.save(saved, os.path.join(self.folder, f"stage{job.notes.get('stage', 0)}.pt"))
        return {}


def load_saved(folder: str | Path) -> dict[str, dict[str, Any]]:
    """What `SaveParams` saved (one file per pipeline stage), merged: {"params": ..., "grads": ...}."""
    import torch

    out: dict[str, dict[str, Any]] = {"params": {}, "grads": {}}
    for path in sorted(Path(folder).glob("stage*.pt")):
        part = torch.load(path)
        out["params"].update(part["params"])
        out["grads"].update(part["grads"])
    return out


def observers(rank: int, warmup: int, env: dict[str, str] | None = None) -> list[Observer]:
    """The hooks `env` (this process' environment) asks for, in the order every rank installs them."""
    env = os.environ if env is None else env
    out: list[Observer] = []
    if env.get(FAULT_ENV):
        out.append(Fault(env[FAULT_ENV], rank))
    if env.get(TRACE_ENV):
        from shardsim.runtime.collective_trace import TraceCollectives

        out.append(TraceCollectives(env[TRACE_ENV], rank, warmup))
    if env.get(SAVE_PARAMS_ENV):
        out.append(SaveParams(os.path.abspath(env[SAVE_PARAMS_ENV])))
    return out
