"""Llama 3.1 405B in 4D layouts on p5.48xlarge (H100): the best predicted layouts at 8,192 tokens
on 512 GPUs and at 131,072 tokens (context parallelism) on 16,384 GPUs, each row with its layout,
tokens/s per GPU, MFU, memory and dollars per million tokens.

    python experiments/llama405b/study.py [--workers N] [--spaces 8k,131k]

Runs pruned `shardsim sweep`s (the commands are in `SPACES` and in the README this writes) into
experiments/llama405b/{8k,131k}/ (with run.json: the command, its seconds and its notes) and
writes experiments/llama405b/README.md with the ten fastest layouts that fit of each space.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
SHARDSIM = str(Path(sys.executable).with_name("shardsim"))
COMMON = ["--workload", "llama-3.1-405b", "--topology", "p5.48xlarge", "--precision", "bf16", "--prune", "--yes"]
SPACES = {
    "8k": (
        "8,192 tokens on 512 H100 (64 × p5.48xlarge), one sequence per GPU and data-parallel rank",
        ["--nodes", "64", "--seq-len", "8192", "--tp", "4,8", "--pp", "1,2,4,8,16",
         "--schedules", "1f1b,interleaved-1f1b,zbv", "--stages-per-rank", "1,2", "--float8", "none,tensorwise"],
    ),
    "131k": (
        "131,072 tokens on 16,384 H100 (2,048 × p5.48xlarge), context parallelism, 128 sequences (16 M tokens) a step",
        ["--nodes", "2048", "--seq-len", "131072", "--global-batch", "128", "--tp", "8", "--cp", "8,16", "--pp", "8,16",
         "--schedules", "1f1b,interleaved-1f1b", "--stages-per-rank", "1,2", "--float8", "none,tensorwise",
         "--checkpointing", "selective,full"],
    ),
}  # fmt: skip
COLUMNS = {
    "label": "layout",
    "tokens_per_s_per_gpu": "tokens/s/GPU",
    "mfu": "MFU",
    "memory_allocated_gib": "memory (GiB)",
    "cost_per_million_tokens_usd": "$/Mtok",
    "step_time_s": "step (s)",
    "global_batch": "global batch",
}


def run(name: str, args: list[str], workers: int | None) -> None:
    """Sweep space `name` into HERE/name, with run.json beside its files."""
    out = HERE / name
    cmd = [SHARDSIM, "sweep", *COMMON, *args, "--out", str(out), "--no-progress"]
    if workers:
        cmd += ["--workers", str(workers)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"{name}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    notes = [line for line in proc.stderr.splitlines() if "dropped" in line or "pruned" in line]
    shown = " ".join(["shardsim sweep", *COMMON, *args])
    (out / "run.json").write_text(json.dumps({"command": shown, "seconds": round(took), "notes": notes}, indent=1))


def table(df: pd.DataFrame, n: int = 10) -> list[str]:
    fits = df[df["fits"]].sort_values("tokens_per_s_per_gpu", ascending=False).head(n)
    cols = [c for c in COLUMNS if c in fits.columns]
    lines = ["| " + " | ".join(COLUMNS[c] for c in cols) + " |", "|" + "---|" * len(cols)]
    for _, r in fits.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            cells.append(f"{100 * v:.1f} %" if c == "mfu" else f"{v:,.3g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--spaces", default=",".join(SPACES), help="the spaces to sweep again (default: all)")
    ns = ap.parse_args()
    for name in ns.spaces.split(","):
        run(name, SPACES[name][1], ns.workers)
    text = [
        "# Llama 3.1 405B in 4D layouts on H100 (predicted)",
        "",
        "Written by `python experiments/llama405b/study.py`: pruned sweeps of `shardsim`, their full",
        "tables in `8k/` and `131k/` (`sweep.csv`, `recommended.json`). Predictions of the model as",
        "it stands (PyTorch FSDP2 + DTensor TP + pipelining + ring attention, torchao Float8, the",
        "p5.48xlarge figures in shardsim/data/topologies/p5.48xlarge.yaml with their sources); no row",
        "here was measured. MFU is against the BF16 dense peak (989 TFLOP/s), as torchtitan reports it.",
        "The seconds are wall time on a 2-core machine with the sweep niced beside other work.",
        "",
    ]
    for name, (title, _) in SPACES.items():
        meta = json.loads((HERE / name / "run.json").read_text())
        df = pd.read_csv(HERE / name / "sweep.csv")
        fits = int(df["fits"].sum())
        text += [f"## {title}", "", f"`{meta['command']}`", ""]
        text += [f"{len(df):,} configurations in the table, {fits:,} fit; {meta['seconds']} s here.", ""]
        text += [f"- {n.removeprefix('shardsim: ')}" for n in meta["notes"]] + ([""] if meta["notes"] else [])
        text += [*table(df), ""]
    (HERE / "README.md").write_text("\n".join(text))
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
