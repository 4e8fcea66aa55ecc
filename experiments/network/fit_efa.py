"""Fit EFA's network figures (NCCL's `latencyInter` and the NIC's achieved fraction by the bytes
it carries per call) to the calibration file, and write them into
`shardsim/data/topologies/fitted/network.yaml` (``--check``: compare instead).

The shipped defaults are the coarse fit (three size points, rounded); `shardsim calibrate` with
an nccl-tests file fits finer ones for one cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from shardsim.simulator.calibration.collectives import collective_rows
from shardsim.simulator.calibration.fit import fit, ratios
from shardsim.simulator.hardware.topology import load_instance
from shardsim.simulator.network.nccl_tests import read_nccl_tests

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "experiments/calibration/data/nccl-all-reduce-p5-2node.csv"
TOPOLOGY, NODES = "p5.48xlarge", 2
# the shipped default: three points of the NIC's achieved fraction (bytes a NIC carries per call)
DEFAULT_POINTS = ("4KiB", "256KiB", "16MiB")
# a finer fit, as `shardsim calibrate --params` would take it
FINE_POINTS = ("1KiB", "16KiB", "128KiB", "1MiB", "8MiB", "64MiB", "512MiB")


def names(points: tuple[str, ...]) -> tuple[str, ...]:
    return ("latency_inter_us", *(f"nic_size_factor.{p}" for p in points))


def bands(inst, rows, values) -> dict[str, float]:
    r = ratios(inst, rows, values)
    err = np.abs(1 / r - 1) * 100  # |predicted / measured time − 1| = |measured / predicted busbw − 1|·…
    big = np.array([m.size_bytes >= 1 << 20 for m in rows])
    busbw_err = np.abs(r - 1) * 100  # predicted / measured busbw − 1 = measured / predicted time − 1
    return {
        "max_busbw_err_from_1MiB": float(busbw_err[big].max()),
        "mean_busbw_err_from_1MiB": float(busbw_err[big].mean()),
        "max_time_err_below_1MiB": float(err[~big].max()),
        "mean_time_err_below_1MiB": float(err[~big].mean()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fine", action="store_true", help="fit the finer points too, and print both")
    args = ap.parse_args()
    inst = load_instance(TOPOLOGY)
    rows = collective_rows(read_nccl_tests(DATA), inst, NODES)
    print(f"{len(rows)} sizes of {DATA.name} on {NODES} x {TOPOLOGY}")
    print("before:", bands(inst, rows, {}))
    for label, pts in (("default", DEFAULT_POINTS), *((("fine", FINE_POINTS),) if args.fine else ())):
        f = fit(inst, rows, names(pts))
        print(label, {k: round(v, 4) for k, v in f.values.items()}, f"({f.evaluations} evaluations)")
        print(" after:", bands(inst, rows, f.values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
