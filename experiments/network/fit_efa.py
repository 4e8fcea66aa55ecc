"""Fit EFA's network figures (NCCL's `latencyInter` and the NIC's achieved fraction by the bytes
it carries per call) to the calibration file, and write them into
`shardsim/data/topologies/fitted/network.yaml` (``--check``: compare instead).

The shipped defaults are the coarse fit (three size points, rounded); `shardsim calibrate` with
an nccl-tests file fits finer ones for one cluster.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

from shardsim.core.units import parse_size
from shardsim.simulator.calibration.collectives import collective_rows
from shardsim.simulator.calibration.fit import fit, ratios
from shardsim.simulator.network.nccl_tests import read_nccl_tests
from shardsim.specs.hardware.topology import load_instance

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "experiments/calibration/data/nccl-all-reduce-p5-2node.csv"
TOPOLOGY, NODES = "p5.48xlarge", 2
# the shipped default: three points of the NIC's achieved fraction (bytes a NIC carries per call)
DEFAULT_POINTS = ("4KiB", "256KiB", "16MiB")
# a finer fit, as `shardsim calibrate --params` would take it
FINE_POINTS = ("1KiB", "16KiB", "128KiB", "1MiB", "8MiB", "64MiB")


def names(points: tuple[str, ...]) -> tuple[str, ...]:
    return ("latency_inter_us", *(f"nic_size_factor.{p}" for p in points))


def bands(inst, rows, values) -> dict[str, float]:
    """The two target bands: |busbw error| from 1 MiB, |time error| below (in %)."""
    r = ratios(inst, rows, values)  # measured / predicted time = predicted / measured busbw
    err = np.abs(1 / r - 1) * 100
    big = np.array([m.size_bytes >= 1 << 20 for m in rows])
    busbw_err = np.abs(r - 1) * 100
    return {
        "max_busbw_err_from_1MiB": float(busbw_err[big].max()),
        "mean_busbw_err_from_1MiB": float(busbw_err[big].mean()),
        "max_time_err_below_1MiB": float(err[~big].max()),
        "mean_time_err_below_1MiB": float(err[~big].mean()),
    }


NETWORK_YAML = ROOT / "shardsim/data/topologies/fitted/network.yaml"


def rounded(values: dict[str, float]) -> dict[str, float]:
    """Two significant digits: the shipped figures claim no more than that."""
    return {k: float(f"{v:.2g}") for k, v in values.items()}


def efa_block(values: dict[str, float], errs: dict[str, float]) -> str:
    pts = [[int(parse_size(n.split(".", 1)[1])), v] for n, v in values.items() if n.startswith("nic_size_factor.")]
    how = (
        f"fitted, not measured, by experiments/network/fit_efa.py (scipy least squares on log time) to the 32 sizes of "
        f"experiments/calibration/data/nccl-all-reduce-p5-2node.csv (nccl-tests all_reduce_perf, 2 x p5.48xlarge, "
        f"16 ranks, 32 x 100 Gbps EFA), rounded to two digits; with them that file is predicted within "
        f"{errs['max_busbw_err_from_1MiB']:.1f} % busbw from 1 MiB (mean {errs['mean_busbw_err_from_1MiB']:.1f} %) "
        f"and {errs['max_time_err_below_1MiB']:.1f} % time below (mean {errs['mean_time_err_below_1MiB']:.1f} %). "
        f"Fitted on one instance type and node count; assumed the same for every EFA instance"
    )
    return (
        "efa:\n"
        f'  latency_inter_us: {{value: {values["latency_inter_us"]}, source: "{how} (what the aws-ofi-nccl plugin '
        f'would report as latencyInter; NCCL adds it to its InfiniBand per-hop figures)"}}\n'
        f"  size_factor: {{value: {pts}, source: \"{how} (the NIC's achieved fraction of nic.rate x nic.efficiency by "
        f"the bytes it carries per call: EFA's per-message costs)\"}}\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fine", action="store_true", help="fit the finer points too, and print both")
    ap.add_argument("--check", action="store_true", help="compare with the shipped figures instead of writing")
    args = ap.parse_args()
    inst = load_instance(TOPOLOGY)
    rows = collective_rows(read_nccl_tests(DATA), inst, NODES)
    print(f"{len(rows)} sizes of {DATA.name} on {NODES} x {TOPOLOGY}")
    print("shipped:", bands(inst, rows, {}))
    f = fit(inst, rows, names(DEFAULT_POINTS))
    values = rounded(f.values)
    errs = bands(inst, rows, values)
    print("default fit:", values, f"({f.evaluations} evaluations)")
    print("  after:", errs)
    if args.fine:
        fine = fit(inst, rows, names(FINE_POINTS))
        print("fine fit:", rounded(fine.values))
        print("  after:", bands(inst, rows, fine.values))
    text = NETWORK_YAML.read_text()
    new = re.sub(r"^efa:\n(?:  .*\n)+", efa_block(values, errs), text, flags=re.M)
    if args.check:
        same = new == text
        print("shipped EFA figures:", "identical" if same else "DIFFER from the fit")
        return 0 if same else 1
    NETWORK_YAML.write_text(new)
    print(f"written {NETWORK_YAML.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
