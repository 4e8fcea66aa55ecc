"""The emulated CPU lab's readings of a run: how fast the host it shares was and what the
hypervisor took, step by step (`hostspeed`), with the torch threads of each rank. A run on CPU
attaches `HostReadings` to its Trainer (`lab_observers`); a run on GPUs reads none of it, and
its record has no `lab`."""

from __future__ import annotations

from typing import Any

from shardsim.runtime.emulation.hostspeed import Probe, StealClock
from shardsim.runtime.records import LabReadings
from shardsim.runtime.trainer import Observer, Trainer


class HostReadings(Observer):
    """The host-speed probe on this rank before every step (outside its timed span; the probe's
    12 MB of weights stay resident: about 2 % of a small-gpt rank's peak resident set), and the
    hypervisor's share of the host's cores in each step; after the steps, both over every rank
    as the record's `lab`."""

    def __init__(self, warmup: int, steps: int):
        self.warmup, self.steps = warmup, steps
        self.probe = Probe()
        self.probes: list[float] = []
        self.clock = StealClock()
        self.steals: list = []

    def before_step(self, i: int) -> None:
        self.probes.append(self.probe())

    def step_started(self, i: int) -> None:
        self.clock.start()

    def step_ended(self, i: int) -> None:
        self.steals.append(self.clock.stop())

    def after_steps(self, trainer: Trainer) -> dict[str, Any]:
        import torch

        n, w = self.steps, self.warmup
        probe_all = trainer.every_rank(self.probes[w:] or None, n)
        measured = self.steals[w:]
        has_steal = all(v is not None for v in measured)
        cores = trainer.every_rank([v.cores for v in measured] if has_steal else None, n)
        share = trainer.every_rank([v.share for v in measured] if has_steal else None, n)
        probed = bool(self.probes)
        return {
            "lab": LabReadings(
                threads_per_rank=torch.get_num_threads(),
                host_probe_s=float(probe_all.mean()) if probed else None,
                host_probe_by_step_s=probe_all.mean(0).tolist() if probed else None,
                host_steal_cores_by_step=cores.mean(0).tolist() if has_steal else None,
                host_steal_share_by_step=share.mean(0).tolist() if has_steal else None,
                host_steal_cores=float(cores.mean()) if has_steal else None,
                host_steal_share=float(share.mean()) if has_steal else None,
            )
        }


def lab_observers(device, warmup: int, steps: int) -> list[Observer]:
    """The lab's observers of a run on `device`: the host readings on CPU, none on a GPU."""
    return [] if device.type == "cuda" else [HostReadings(warmup, steps)]
