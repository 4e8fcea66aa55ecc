"""The NCCL network model against the calibration file (2 x p5.48xlarge, 16 ranks, NCCL
all-reduce, 8 B to 16 GiB): the shipped defaults, and a calibration with the finer size points
(what ``shardsim calibrate --nccl-tests FILE --params ...`` fits), beside the "before" of
`baseline.csv`. Writes `after.csv` (one row a size: measured, before, defaults, calibrated) and
`after.png` (busbw and error against size) here, and prints each band's errors.

    python experiments/network/after.py [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from shardsim.core.files import atomic_write  # noqa: E402
from shardsim.simulator.calibration.collectives import collective_rows  # noqa: E402
from shardsim.simulator.calibration.fit import fit  # noqa: E402
from shardsim.simulator.calibration.parameters import applied  # noqa: E402
from shardsim.simulator.collective import compare_collective  # noqa: E402
from shardsim.simulator.network.nccl_tests import read_nccl_tests  # noqa: E402
from shardsim.specs.hardware.topology import Cluster, load_instance  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DATA = (HERE.parent / "calibration" / "data" / "nccl-all-reduce-p5-2node.csv").relative_to(ROOT)
FINE = ("1KiB", "16KiB", "128KiB", "1MiB", "8MiB", "64MiB")
PARAMS = ("latency_inter_us", *(f"nic_size_factor.{p}" for p in FINE))


def bands(rows: list[dict], key: str) -> dict[str, float]:
    big = [abs(r[f"{key}_busbw_error_pct"]) for r in rows if r["size_bytes"] >= 1 << 20]
    small = [abs(r[f"{key}_time_error_pct"]) for r in rows if r["size_bytes"] < 1 << 20]
    return {
        "busbw_from_1MiB_mean": sum(big) / len(big),
        "busbw_from_1MiB_max": max(big),
        "time_below_1MiB_mean": sum(small) / len(small),
        "time_below_1MiB_max": max(small),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="folder for after.csv and after.png")
    args = ap.parse_args()
    measured = read_nccl_tests(ROOT / DATA)
    inst = load_instance("p5.48xlarge")
    f = fit(inst, collective_rows(measured, inst, 2), PARAMS)
    default = compare_collective(Cluster(inst, 2), measured)
    calibrated = compare_collective(Cluster(applied(inst, f.values), 2), measured)
    with open(HERE / "baseline.csv") as fh:
        before = {int(r["size_bytes"]): r for r in csv.DictReader(fh)}
    rows = []
    for d, c in zip(default["rows"], calibrated["rows"], strict=True):
        b = before[d["size_bytes"]]
        rows.append(
            {
                "size_bytes": d["size_bytes"],
                "measured_time_us": d["measured_time_us"],
                "measured_busbw_GBps": d["measured_busbw_GBps"],
                "before_algo": b["algo"],
                "before_time_us": float(b["predicted_time_us"]),
                "before_busbw_GBps": float(b["predicted_busbw_GBps"]),
                "before_time_error_pct": float(b["time_error_pct"]),
                "before_busbw_error_pct": float(b["busbw_error_pct"] or "nan"),
                "default_algo": f"{d['algo']}/{d['protocol']}",
                "default_time_us": d["predicted_time_us"],
                "default_busbw_GBps": d["predicted_busbw_GBps"],
                "default_time_error_pct": d["time_error_pct"],
                "default_busbw_error_pct": d["busbw_error_pct"],
                "calibrated_algo": f"{c['algo']}/{c['protocol']}",
                "calibrated_time_us": c["predicted_time_us"],
                "calibrated_busbw_GBps": c["predicted_busbw_GBps"],
                "calibrated_time_error_pct": c["time_error_pct"],
                "calibrated_busbw_error_pct": c["busbw_error_pct"],
            }
        )
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "after.csv", buf.getvalue())
    summary = {k: bands(rows, k) for k in ("before", "default", "calibrated")}
    summary["calibrated_values"] = {k: round(v, 4) for k, v in f.values.items()}
    print(json.dumps(summary, indent=2))

    sizes = [r["size_bytes"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    shown = [r["measured_busbw_GBps"] or float("nan") for r in rows]  # nccl-tests prints 0.00 below 0.005
    ax1.plot(sizes, shown, "ko-", label="measured (nccl-tests)")
    for key, style in (("before", "C3--"), ("default", "C0-"), ("calibrated", "C2:")):
        ax1.plot(sizes, [r[f"{key}_busbw_GBps"] for r in rows], style, label=key)
        errs = [r[f"{key}_busbw_error_pct"] if r["size_bytes"] >= 1 << 20 else r[f"{key}_time_error_pct"] for r in rows]
        ax2.plot(sizes, errs, style, label=key)
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_ylabel("bus bandwidth (GB/s)")
    ax1.legend()
    ax1.set_title("all_reduce, 2 x p5.48xlarge (16 ranks): predicted vs measured")
    ax2.axhspan(-30, 30, xmax=0.53, color="0.9")
    ax2.axhspan(-15, 15, xmin=0.53, color="0.9")
    ax2.axhline(0, color="k", lw=0.5)
    ax2.set_ylabel("error % (time < 1 MiB, busbw ≥ 1 MiB)")
    ax2.set_xlabel("size (bytes)")
    ax2.set_ylim(-100, 120)
    fig.tight_layout()
    fig.savefig(args.out / "after.png", dpi=110)


if __name__ == "__main__":
    main()
