"""How fast this host's cores are right now: a small fixed probe, timed in CPU seconds.

The probe is one transformer layer's forward and backward (attention, MLP, layer norm: the op mix
of the workloads; 512 wide, 3.1 M parameters, so that, like a model, its weights and activations
do not sit in a core's cache), timed by the calling thread's CPU clock: waiting for a core does not
count, what sharing the caches costs does, as a rank's compute pays it.

`shardsim profile` times it before every timed pass and states all figures at the mean probe; the
runtime times it on every rank before every step (outside the timed span); `validate` scales a
run's prediction by the run's probe over the profile's. Why a probe, and how well it tracks a
model: experiments/validation/README.md ("The host-speed probe").
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

# A step (or a measurement) in which the hypervisor took more than this part of the host's
# cores' time is set aside by `validate` and the profile: it measured the other guests as much as
# the work. The threshold was chosen before the validations that use it, from the steal the
# committed validation measured (experiments/validation/README.md, "The host-speed probe").
QUIET_STEAL_SHARE = 0.10
WIDTH, HEADS, TOKENS = 512, 8, 32  # the probe layer: 3.1 M parameters, a short sequence
ITERS = 1  # forward + backward passes per probe (its time: experiments/readings/emulated-nics.md)


@dataclass
class Probe:
    """A fixed little transformer layer; calling the probe returns the CPU seconds (this
    thread's clock) of ITERS forward and backward passes through it."""

    layer: object = field(init=False, repr=False)
    x: object = field(init=False, repr=False)

    def __post_init__(self) -> None:
        import torch

        with torch.random.fork_rng(devices=[]):  # the caller's random stream stays as it was
            torch.manual_seed(0)
            self.layer = torch.nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True)
            self.x = torch.randn(1, TOKENS, WIDTH)
        self()  # the first pass allocates

    def __call__(self) -> float:
        t0 = time.thread_time()
        for _ in range(ITERS):
            self.layer(self.x).sum().backward()
        self.layer.zero_grad(set_to_none=True)
        return time.thread_time() - t0


@dataclass
class SpeedLog:
    """Readings of `probe` (none: every reading is 1, figures stay in seconds), kept so that
    figures divided by the reading next to them can be stated at their mean, `ref`."""

    probe: Probe | None = None
    readings: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        if self.probe is None:
            return 1.0
        r = self.probe()
        self.readings.append(r)
        return r

    @property
    def ref(self) -> float:
        return statistics.fmean(self.readings) if self.readings else 1.0


# -- the hypervisor's share ------------------------------------------------------------------

_STAT = "/proc/stat"


def _cpu_ticks(path: str = _STAT) -> tuple[int, int] | None:
    """(steal, all) ticks of the host's cores together since boot, None where there is no
    /proc/stat. all: user, nice, system, idle, iowait, irq, softirq and steal (the guest
    times are inside user already)."""
    try:
        with open(path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]
    return ticks[7], sum(ticks)


@dataclass(frozen=True)
class Steal:
    """The hypervisor's part of a span: `cores`, the mean cores' worth of time it ran other
    guests on ours, and `share`, that over all the host's cores (the part of their capacity
    it took)."""

    cores: float
    share: float


@dataclass
class StealClock:
    """Time the hypervisor gave other guests while we ran (/proc/stat's steal): no process of
    ours is charged for it (this kernel subtracts it from their clocks) and no probe sees it,
    but cores computing for us lose it (most in steps that leave the cores idle between
    collectives: a core woken from idle waits for the hypervisor).

    `start()`, then `stop()` returns the Steal of the span between them (None where
    /proc/stat is missing)."""

    path: str = _STAT
    _t0: float = 0.0
    _ticks0: tuple[int, int] | None = None

    def start(self) -> None:
        self._t0, self._ticks0 = time.perf_counter(), _cpu_ticks(self.path)

    def stop(self) -> Steal | None:
        ticks, wall = _cpu_ticks(self.path), time.perf_counter() - self._t0
        if ticks is None or self._ticks0 is None or wall <= 0:
            return None
        steal, total = ticks[0] - self._ticks0[0], ticks[1] - self._ticks0[1]
        return Steal(steal / os.sysconf("SC_CLK_TCK") / wall, steal / total if total > 0 else 0.0)
