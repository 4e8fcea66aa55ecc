"""Llama 3.1 70B at sequence 8192: which layout (tensor × pipeline × data parallel, sharded how)
on p4d and on p5, from 4 to 64 nodes, at a fixed global batch of 256 sequences (2M tokens).

Every layout the simulator has: tensor parallelism 1, 2, 4, 8 inside a node (with sequence
parallelism), pipelines of every stage count (1F1B, default microbatch counts), data parallelism
replicated (DDP), sharded over all (ZeRO-3) or over groups (ZeRO-2D / HSDP), and every split of
the 256 sequences into micro-batches and gradient accumulation steps (grad_accum 1 ... 64: the
micro-batch per data-parallel rank follows). bf16, full activation checkpointing, fused Adam.
Configurations that do not fit in memory are pruned before simulation. The tensor-parallel
layouts once more with asyncTP, under torch.compile as it needs (inductor's micro-pipeline pass:
each fused matmul in chunks beside the next chunk's transfer; compile also fuses the layers'
memory-bound kernels and saves fewer activations).

    python experiments/sweeps/llama70b-layouts/study.py [--nodes 4,8,16] [--topologies p5.48xlarge]

Writes rows.csv (every fitting configuration), best.csv (the best of each cluster, and the best
of each tensor-parallel degree), layouts.png; the reading is README.md beside this file.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
GLOBAL_BATCH = 256  # sequences of 8192 tokens: 2M tokens a step
SEQ = 8192
ACCUM = (1, 2, 4, 8, 16, 32, 64)
KEEP = ["topology", "nodes", "world", "label", "layout", "strategy_kind", "strategy_tp", "async_tp", "strategy_pp",
        "strategy_degree", "strategy_microbatches", "batch_per_device", "grad_accum", "step_time_s", "samples_per_s",
        "tokens_per_s_per_gpu", "mfu", "exposed_comm_s", "bubble_s", "memory_required_gib", "device_memory_gib",
        "cost_per_million_samples_usd"]  # fmt: skip


def cluster_rows(topology: str, nodes: int, workers: int):
    """Every fitting configuration of one cluster (all accumulation splits), best first."""
    import pandas as pd

    import shardsim
    from shardsim.config import RunConfig
    from shardsim.core.errors import ConfigError

    base = RunConfig(workload="llama-3.1-70b", topology=topology, nodes=nodes, precision="bf16",
                     shape={"seq_len": SEQ}, checkpointing="full", optimizer_impl="fused")  # fmt: skip
    tables, seen = [], 0
    variants = (
        (base, [1, 2, 4, 8], False),
        (
            base.replace(compile=True, strategy={"kind": "zero", "tp": 2, "sequence_parallel": True, "async_tp": True}),
            [2, 4, 8],
            True,
        ),
    )
    for cfg, tps, overlap in variants:
        for ga in ACCUM:
            try:
                r = shardsim.sweep(cfg.replace(grad_accum=ga), global_batch=GLOBAL_BATCH, schedules=["1f1b"],
                                   tp_degrees=tps, workers=workers)  # fmt: skip
            except ConfigError:  # the global batch does not divide over this many ranks and steps
                continue
            seen += len(r.table)
            tables.append(r.table[r.table["fits"]].assign(grad_accum=ga, async_tp=overlap))
    df = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if len(df):
        df["tokens_per_s_per_gpu"] = df["samples_per_s"] * SEQ / df["world"]
        df = df.sort_values("samples_per_s", ascending=False, kind="mergesort")
    return df, seen


def plot(best_tp, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tops = list(dict.fromkeys(best_tp["topology"]))
    colors = {1: "#4C72B0", 2: "#DD8452", 4: "#55A868", 8: "#C44E52"}
    fig, axes = plt.subplots(1, len(tops), figsize=(6 * len(tops), 4.2), sharey=False, squeeze=False)
    for ax, top in zip(axes[0], tops, strict=True):
        g = best_tp[best_tp["topology"] == top]
        for (tp, overlap), h in g.groupby(["strategy_tp", "async_tp"]):
            h = h.sort_values("nodes")
            style = (
                dict(linestyle="--", marker="x", color=colors[tp]) if overlap else dict(marker="o", color=colors[tp])
            )
            name = f"tp {tp}" + (" asyncTP (compiled)" if overlap else "")
            ax.plot(h["nodes"], h["tokens_per_s_per_gpu"], label=name, **style)
        ax.set_xscale("log", base=2)
        nodes = sorted(set(g["nodes"]))
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.set_xlabel("nodes")
        ax.set_ylabel("tokens/s per GPU")
        ax.set_title(f"Llama 3.1 70B, seq 8192, 2M-token batch: {top}\n(each line: the best pp × dp for that tp)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.text(0.01, 0.01, "Source: shardsim's predictions (experiments/sweeps/llama70b-layouts/study.py, rows.csv)",
             fontsize=7, color="#555555")  # fmt: skip
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topologies", default="p4d.24xlarge,p5.48xlarge")
    p.add_argument("--nodes", default="4,8,16,32,64")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, default=HERE)
    a = p.parse_args(argv)
    rows, t0, total = [], time.time(), 0
    for top in a.topologies.split(","):
        for n in map(int, a.nodes.split(",")):
            df, seen = cluster_rows(top, n, a.workers)
            total += seen
            what = "nothing fits"
            if len(df):
                b = df.iloc[0]
                what = f"{b['label']} [{b['layout']}] {b['tokens_per_s_per_gpu']:.0f} tok/s/GPU"
            took = time.time() - t0
            print(f"{n:3d} x {top}: {seen} configurations, {len(df)} fit; best {what} ({took:.0f} s)", flush=True)
            rows.append(df)
    df = pd.concat(rows, ignore_index=True)
    df = df[[c for c in KEEP if c in df]]
    a.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.out / "rows.csv", index=False, float_format="%.6g")
    best = df.groupby(["topology", "nodes"], sort=False).head(1).assign(best="overall")
    best_tp = df.groupby(["topology", "nodes", "strategy_tp", "async_tp"], sort=False).head(1)
    pd.concat([best, best_tp.assign(best="of its tp")]).to_csv(a.out / "best.csv", index=False, float_format="%.6g")
    plot(best_tp, a.out / "layouts.png")
    print(f"{total} configurations in {time.time() - t0:.0f} s; wrote rows.csv, best.csv, layouts.png to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
