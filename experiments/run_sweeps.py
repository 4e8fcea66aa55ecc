"""Regenerate the committed sweeps under experiments/sweeps/ (tables, plots, recommendations).

    python experiments/run_sweeps.py                 # all studies
    python experiments/run_sweeps.py seed mics-gpt-10b --workers 2

Studies (experiments/README.md says what they show):
- seed: every configuration of the seed scenario (vit-630m, 8 x g4dn.12xlarge, global batch 128:
  batch 4/device where data parallel, fp32, checkpointing, SageMaker's library as the seed's
  measurement ran) — what `shardsim sweep` prints with no arguments.
- mics-gpt-10b, mics-gpt-100b: ZeRO vs ZeRO-2D (MiCS, as SageMaker's library runs it: `library: smp`,
  the hierarchical all-gather across nodes) on p4d.24xlarge (bf16) and p3dn.24xlarge
  (fp16: V100 has no bf16) from 4 to 64 nodes, weak scaling at a fixed batch per device; degree
  8 (one node), 16 and up to 128 (where gpt-100b's states fit); no tensor parallelism (the
  question is ZeRO's partition group).
- pipeline-gpt2-xl: pipeline vs sharding for GPT-2 XL's shape with an untied head
  (experiments/models/gpt2-xl-untied.yaml, 1.6 B params: does not fit one T4 with Adam; the study
  predates tied-embedding pipelines and keeps the untied head) on 4 x g4dn.12xlarge, fp16: every
  configuration.
Each study writes sweep.csv, sweep.parquet, recommended.json, summary.md and PNG/SVG plots.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from shardsim.config import RunConfig, load_config
from shardsim.core.files import atomic_write, check_output_dir
from shardsim.report.plots import plot_all
from shardsim.sweep.output import write_tables
from shardsim.sweep.recommendation import recommend
from shardsim.sweep.rows import upgrade_table
from shardsim.sweep.search import sweep
from shardsim.sweep.space import SweepSpace

ROOT = Path(__file__).resolve().parent.parent


OUT = ROOT / "experiments" / "sweeps"
MICS_NODES = (4, 8, 16, 32, 64)
MICS_DEGREES = (8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Part:
    base: RunConfig
    space: SweepSpace


STUDIES: dict[str, tuple[str, list[Part]]] = {
    "seed": ("shardsim sweep", [Part(load_config(), SweepSpace())]),
    "mics-gpt-10b": (
        "shardsim sweep --workload gpt-10b --batch-per-device 2 --strategies zero,zero2d --degrees 8,16,32,64,128 "
        "--nodes 4,8,16,32,64 --topology p4d.24xlarge --precision bf16 --library smp --tp 1 "
        "(and p3dn.24xlarge with --precision fp16)",
        [
            Part(
                RunConfig(
                    workload="gpt-10b", topology="p4d.24xlarge", batch_per_device=2, precision="bf16", library="smp"
                ),
                SweepSpace(strategies=("zero", "zero2d"), degrees=MICS_DEGREES, nodes=MICS_NODES, tp_degrees=(1,)),
            ),
            Part(
                RunConfig(
                    workload="gpt-10b", topology="p3dn.24xlarge", batch_per_device=2, precision="fp16", library="smp"
                ),
                SweepSpace(strategies=("zero", "zero2d"), degrees=MICS_DEGREES, nodes=MICS_NODES, tp_degrees=(1,)),
            ),
        ],
    ),
    "mics-gpt-100b": (
        "shardsim sweep --workload gpt-100b --batch-per-device 1 --strategies zero,zero2d --degrees 8,16,32,64,128 "
        "--nodes 4,8,16,32,64 --topology p4d.24xlarge --precision bf16 --library smp --tp 1 "
        "(and p3dn.24xlarge with --precision fp16)",
        [
            Part(
                RunConfig(
                    workload="gpt-100b", topology="p4d.24xlarge", batch_per_device=1, precision="bf16", library="smp"
                ),
                SweepSpace(strategies=("zero", "zero2d"), degrees=MICS_DEGREES, nodes=MICS_NODES, tp_degrees=(1,)),
            ),
            Part(
                RunConfig(
                    workload="gpt-100b", topology="p3dn.24xlarge", batch_per_device=1, precision="fp16", library="smp"
                ),
                SweepSpace(strategies=("zero", "zero2d"), degrees=MICS_DEGREES, nodes=MICS_NODES, tp_degrees=(1,)),
            ),
        ],
    ),
    "pipeline-gpt2-xl": (
        "shardsim sweep --workload experiments/models/gpt2-xl-untied.yaml --topology g4dn.12xlarge --nodes 4 "
        "--batch-per-device 2 --precision fp16",
        [
            Part(
                RunConfig(
                    workload="experiments/models/gpt2-xl-untied.yaml",  # relative: it is named in the outputs
                    topology="g4dn.12xlarge",
                    nodes=4,
                    batch_per_device=2,
                    precision="fp16",
                ),
                SweepSpace(),
            )
        ],
    ),
}


def _fmt(v, spec: str) -> str:
    return "" if v is None or pd.isna(v) else format(v, spec)


def summary_markdown(name: str, command: str, df: pd.DataFrame, rec: dict) -> str:
    """A short ranked table per cluster, and the recommendation, as Markdown."""
    lines = [
        f"# Sweep `{name}`",
        "",
        f"Command: `{command}`",
        "",
        f"{len(df)} configurations, {int((~df['fits']).sum())} do not fit in memory (marked **no**, never "
        "recommended). Per cluster below: the 15 fastest, then every other ddp/zero/zero2d row.",
        "",
    ]
    b = rec["best"]
    if b is None:
        lines.append(f"**No recommendation**: {rec['reason']}")
    else:
        sdp = rec["sdp"]
        if sdp is not None:
            lines.append(
                f"- Recommended `sharded_data_parallel_degree`: **{rec['sharded_data_parallel_degree']}** "
                f"({sdp['label']} on {sdp['nodes']} x {sdp['topology']}, {sdp['step_time_s']:.3f} s/step)"
            )
        margin = "" if rec["margin"] is None else f", {rec['margin'] * 100:.1f}% ahead of {rec['runner_up']['label']}"
        lines.append(
            f"- Best overall: **{b['label']}** on {b['nodes']} x {b['topology']}: {b['step_time_s']:.3f} s/step, "
            f"{b['samples_per_s']:.1f} samples/s{margin}"
        )
    lines.append("")
    if df.groupby("topology")["world"].nunique().max() > 1:
        lines += pivot_markdown(df)
    cols = (
        "rank",
        "label",
        "step_time_s",
        "samples_per_s",
        "compute_s",
        "exposed_comm_s",
        "bubble_s",
        "memory_required_gib",
        "fits",
        "cost_per_million_samples_usd",
        "scaling_efficiency",
    )
    for (top, nodes), g in df.groupby(["topology", "nodes"], sort=False):
        batch = f"batch {int(g['batch_per_device'].iloc[0])}/device"
        if g["batch_per_device"].nunique() > 1 and g["global_batch"].nunique() == 1:  # held across layouts
            per_device = int(g.loc[g["strategy_tp"] == 1, "batch_per_device"].iloc[0])
            gb = int(g["global_batch"].iloc[0])
            batch = f"global batch {gb}: batch {per_device}/device where data parallel"
        lines += [f"## {nodes} x {top} ({int(g['world'].iloc[0])} GPUs, {g['precision'].iloc[0]}, {batch})", ""]
        present = [c for c in cols if c in g]
        lines.append("| " + " | ".join(present) + " |")
        lines.append("|" + "---|" * len(present))
        shown = g[(g["rank"] <= 15) | (g["strategy_kind"] != "pipeline")]
        for _, r in shown.iterrows():
            cells = []
            for c in present:
                v = r[c]
                if c in ("step_time_s", "compute_s", "exposed_comm_s", "bubble_s"):
                    cells.append(_fmt(v, ".3f"))
                elif c in ("samples_per_s", "cost_per_million_samples_usd"):
                    cells.append(_fmt(v, ".1f") or "unknown")
                elif c == "memory_required_gib":
                    cells.append(_fmt(v, ".2f"))
                elif c == "scaling_efficiency":
                    cells.append(_fmt(v * 100, ".0f") + "%" if pd.notna(v) else "")
                elif c == "fits":
                    cells.append("yes" if v else "**no**")
                else:
                    cells.append(str(v))
            lines.append("| " + " | ".join(cells) + " |")
        if len(g) > len(shown):
            lines.append(f"\n({len(g) - len(shown)} more rows in sweep.csv)")
        lines.append("")
    return "\n".join(lines)


def pivot_markdown(df: pd.DataFrame) -> list[str]:
    """Per topology: step time and weak/strong scaling efficiency of each configuration by GPU count."""
    from shardsim.sweep.ranking import scaling_configs

    lines: list[str] = []
    for top, g in df.groupby("topology", sort=False):
        worlds = sorted(int(w) for w in g["world"].unique())
        mode = g["scaling_mode"].iloc[0]
        lines += [
            f"### {top}: step time (s) and {mode} scaling efficiency by GPU count (✗ = does not fit)",
            "",
            "| configuration | " + " | ".join(f"{w} GPUs" for w in worlds) + " |",
            "|---|" + "---|" * len(worlds),
        ]
        for cfg in scaling_configs(g, limit=12):
            cells = []
            for w in worlds:
                r = g[(g["label"] == cfg) & (g["world"] == w)]
                if r.empty:
                    cells.append("")
                    continue
                r = r.iloc[0]
                mark = "" if r["fits"] else " ✗"
                cells.append(f"{r['step_time_s']:.3f}{mark} ({r['scaling_efficiency'] * 100:.0f}%)")
            lines.append(f"| {cfg} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def run_study(name: str, workers: int | None, replot: bool = False, root: Path = OUT) -> None:
    command, parts = STUDIES[name]
    out = check_output_dir(root / name, "--out")  # made as its first file is written
    t = time.perf_counter()
    if replot:  # tables as committed: summary and plots only (e.g. after a change to the plots)
        df = upgrade_table(pd.read_parquet(out / "sweep.parquet"))  # one written before the result key too
    else:
        df = pd.concat([sweep(p.base, p.space, workers=workers).table for p in parts], ignore_index=True)
        write_tables(df, out)
    seconds = time.perf_counter() - t
    rec = recommend(df, parts[0].base.library)  # every part of a study runs one library
    atomic_write(out / "recommended.json", json.dumps(rec, indent=2) + "\n")
    atomic_write(out / "summary.md", summary_markdown(name, command, df, rec) + "\n")
    plot_all(df, out)
    b = rec["best"]
    best = "nothing fits" if b is None else f"{b['label']} on {b['nodes']} x {b['topology']}"
    print(
        f"{name}: {len(df)} configurations in {seconds:.1f} s; best {best}; "
        f"sharded_data_parallel_degree {rec['sharded_data_parallel_degree']}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("studies", nargs="*", choices=[*STUDIES, []], help="default: all")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--replot", action="store_true", help="no predictions: summary and plots from sweep.parquet")
    p.add_argument("--out", type=Path, default=OUT, help=f"folder of the studies (default {OUT.relative_to(ROOT)})")
    ns = p.parse_args()
    os.chdir(ROOT)  # workloads given as paths are named relative to the repository
    for name in ns.studies or STUDIES:
        run_study(name, ns.workers, ns.replot, ns.out)


if __name__ == "__main__":
    main()
