"""Today's network model against the calibration file: 2 x p5.48xlarge (16 ranks), NCCL all-reduce,
8 B to 16 GiB. Writes `baseline.csv` (one row a size: predicted and measured time and busbw, the
errors) and `baseline.png` (busbw against size) beside this script, and prints the summary.

    python experiments/network/baseline.py [--out DIR]

The same as ``shardsim collective --topology p5.48xlarge --nodes 2 --compare
experiments/calibration/data/nccl-all-reduce-p5-2node.csv --plot baseline.png --json``, with the
rows written as CSV.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

from shardsim.cli.collective import plot_comparison
from shardsim.core.files import atomic_write
from shardsim.simulator.collective import compare_collective
from shardsim.simulator.network.nccl_tests import read_nccl_tests
from shardsim.specs.hardware.topology import make_cluster

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "calibration" / "data" / "nccl-all-reduce-p5-2node.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="folder for baseline.csv and baseline.png")
    args = ap.parse_args()
    measured = read_nccl_tests(DATA.relative_to(HERE.parent.parent))  # a path relative to the repository
    doc = compare_collective(make_cluster("p5.48xlarge", 2), measured)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(doc["rows"][0]), lineterminator="\n")
    w.writeheader()
    w.writerows(doc["rows"])
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "baseline.csv", buf.getvalue())
    plot_comparison(doc, str(args.out / "baseline.png"))
    print(json.dumps(doc["summary"], indent=2))


if __name__ == "__main__":
    main()
