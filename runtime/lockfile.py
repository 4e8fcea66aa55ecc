"""The lock the runtime's holders take (runs.csv, a topology's emulated cluster): the
simulator's `simulator.lockfile`, which the sweep's output folders use too."""

from shardsim.simulator.lockfile import acquire, locked, release

__all__ = ["acquire", "locked", "release"]
