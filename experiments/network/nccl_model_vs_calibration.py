"""NCCL's own tuner model (`shardsim.simulator.network.nccl_model`, NCCL v2.20.3-1) against
the measured all-reduce of `experiments/calibration/data/nccl-all-reduce-p5-2node.csv`
(nccl-tests on 2 × p5.48xlarge, 16 ranks). Nothing is fitted: the inputs are stated below.

    python experiments/network/nccl_model_vs_calibration.py [--out DIR]

Prints a markdown table (per size: the (algorithm, protocol) the model picks, predicted and
measured time and bus bandwidth, the error) and writes nccl_model_vs_calibration.csv and
nccl_model_vs_calibration.png to DIR (default: this folder).

Inputs assumed for p5.48xlarge (sources in experiments/network/nccl_model.md):
- 16 ranks on 2 nodes, compute capability 90 (H100 SXM), AMD hosts (EPYC 7R13);
- 16 channels (`comm->nChannels`), as NCCL printed on p5 (rings of all 16 ranks, "Channel
  12/16" in awslabs/awsome-distributed-ai issue #386);
- 22 GB/s per channel intra and inter (`bwIntra`, `bwInter`): the largest entry of NCCL's
  sm90SpeedArrayInter (src/graph/search.cc line 845) with 16 channels within one H100's
  NVLink bandwidth as NCCL counts it (18 links × SM90_NVLINK_BW 20.6 = 370.8 GB/s,
  src/graph/topo.h line 17) and 2 channels within one GPU's 4 × 100 Gb/s EFA (50 GB/s);
- no NVLink SHARP graph (NVLS / NVLS-tree off), no CollNet, no network latency reported by
  the plugin (`latencyInter` 0), balanced tree pattern.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from shardsim.simulator.network import nccl_model as nm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "experiments" / "calibration" / "data" / "nccl-all-reduce-p5-2node.csv"
HERE = Path(__file__).resolve().parent
P5 = nm.NcclSystem(
    nranks=16,
    nnodes=2,
    compute_capability=90,
    ring=nm.Graph(nchannels=16, bw_intra=22.0, bw_inter=22.0),
    cpu_vendor="amd",
)
BUSBW_FROM = 1 << 20  # error on bus bandwidth from 1 MiB, on time below


def rows(path: Path = CSV, system: nm.NcclSystem = P5) -> list[dict]:
    out = []
    with path.open() as f:
        for r in csv.DictReader(f):
            size = int(r["size_bytes"])
            measured_us = float(r["time_us"])
            c = nm.choose("all_reduce", size, system)
            measured_bus = nm.busbw_GBps("all_reduce", size, system.nranks, measured_us)
            model_bus = nm.busbw_GBps("all_reduce", size, system.nranks, c.time_us)
            if size >= BUSBW_FROM:
                metric, err = "busbw", model_bus / measured_bus - 1
            else:
                metric, err = "time", c.time_us / measured_us - 1
            out.append(
                {
                    "size_bytes": size,
                    "algo": c.algo,
                    "proto": c.proto,
                    "model_time_us": c.time_us,
                    "measured_time_us": measured_us,
                    "model_busbw_GBps": model_bus,
                    "measured_busbw_GBps": measured_bus,
                    "error_on": metric,
                    "error": err,
                }
            )
    return out


def size_label(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def markdown(table: list[dict]) -> str:
    lines = [
        "| size | NCCL model picks | model time (µs) | measured time (µs) | model busbw (GB/s) "
        "| measured busbw (GB/s) | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {size_label(r['size_bytes'])} | {r['algo']} / {r['proto']} "
            f"| {r['model_time_us']:.1f} | {r['measured_time_us']:.1f} "
            f"| {r['model_busbw_GBps']:.2f} | {r['measured_busbw_GBps']:.2f} "
            f"| {r['error']:+.0%} ({r['error_on']}) |"
        )
    return "\n".join(lines)


def plot(table: list[dict], path: Path) -> None:
    sizes = [r["size_bytes"] for r in table]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(sizes, [r["measured_time_us"] for r in table], "o-", label="measured (nccl-tests)")
    ax1.plot(sizes, [r["model_time_us"] for r in table], "s--", label="NCCL 2.20 model")
    ax1.set(xscale="log", yscale="log", xlabel="size (bytes)", ylabel="time (µs)")
    ax2.plot(sizes, [r["measured_busbw_GBps"] for r in table], "o-", label="measured")
    ax2.plot(sizes, [r["model_busbw_GBps"] for r in table], "s--", label="NCCL 2.20 model")
    ax2.set(xscale="log", xlabel="size (bytes)", ylabel="bus bandwidth (GB/s)")
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("all_reduce, 2 × p5.48xlarge (16 × H100, EFA): NCCL's tuner model vs measured")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    table = rows()
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "nccl_model_vs_calibration.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        for r in table:
            w.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()})
    plot(table, args.out / "nccl_model_vs_calibration.png")
    print(markdown(table))
    print()
    print(candidates())


def candidates(sizes: tuple[int, ...] = (8, 1 << 20, 1 << 30)) -> str:
    """Every (algorithm, protocol) the model weighs, its time (µs) at a few sizes."""
    per_size = [nm.predict_time_us("all_reduce", s, P5) for s in sizes]
    lines = [
        "| algorithm / protocol | " + " | ".join(size_label(s) for s in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for pair in per_size[0]:
        cells = " | ".join(f"{t[pair]:.1f}" for t in per_size)
        lines.append(f"| {pair[0]} / {pair[1]} | {cells} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
