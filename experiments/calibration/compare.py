"""Predict every row of the calibration set (measured A100-40GB FSDP runs of MPT models) with
shardsim's defaults and compare tokens/s per GPU.

    python experiments/calibration/compare.py [--csv ../shared/calibration/mpt-a100-40gb.csv] [--out DIR]

An MPT model is built as a gpt-family `Arch` (d_model, n_heads, n_layers, ffn 4 × d_model,
vocabulary 50,368, seq_len): it has biases and an untied head where MPT has none and a tied
one (about 2 % more parameters at 125m, under 0.1 % at 7b). Topology `a100-40gb-roce`; strategy
zero (FULL_SHARD), bf16, checkpointing per row (full or none), microbatch and grad_accum per row.
Prints the per-row table and the errors: mean absolute, mean signed, by seq_len / microbatch /
GPU count, and the rows predicted not to fit. With --out, writes rows.csv and summary.md there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from shardsim.simulator.config import load_config
from shardsim.simulator.files import atomic_write
from shardsim.simulator.hardware.topology import make_cluster
from shardsim.simulator.predict import predict
from shardsim.simulator.workload.model import Arch, from_arch

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT.parent / "shared" / "calibration" / "mpt-a100-40gb.csv"
TOPOLOGY = "a100-40gb-roce"


def predict_row(r: pd.Series) -> dict:
    arch = Arch(
        "gpt",
        hidden=int(r.d_model),
        layers=int(r.n_layers),
        heads=int(r.n_heads),
        ffn=int(r.expansion_ratio * r.d_model),
        seq_len=int(r.seq_len),
        vocab=int(r.vocab_size),
    )
    w = from_arch(str(r.model), arch)
    cfg = load_config(
        None,
        {
            "workload": str(r.model),
            "topology": TOPOLOGY,
            "nodes": int(r.gpus) // int(r.gpus_per_node),
            "strategy": "zero",
            "batch_per_device": int(r.microbatch),
            "grad_accum": int(r.grad_accum),
            "precision": "bf16",
            "checkpointing": "full" if bool(r.activation_checkpointing) else "none",
        },
    )
    cluster = make_cluster(TOPOLOGY, cfg.nodes)
    p = predict(cfg, workload=w, cluster=cluster)
    tok = p.samples_per_s * arch.seq_len / p.world
    return {
        "model": r.model,
        "seq_len": int(r.seq_len),
        "gpus": int(r.gpus),
        "microbatch": int(r.microbatch),
        "grad_accum": int(r.grad_accum),
        "ckpt": bool(r.activation_checkpointing),
        "measured": float(r.tokens_per_s_per_gpu),
        "predicted": tok,
        "error_pct": (tok / float(r.tokens_per_s_per_gpu) - 1) * 100,
        "memory_gib": p.memory_per_rank_gib,
        "fits": p.fits,
        "compute_ms": p.breakdown.get("compute", 0.0) * 1e3,
        "exposed_comm_ms": p.breakdown.get("exposed comm", 0.0) * 1e3,
    }


def markdown(df: pd.DataFrame) -> str:
    """A DataFrame as a markdown table (its index as the first column when named)."""
    d = df.reset_index() if df.index.name else df
    cells = [[f"{v:.1f}" if isinstance(v, float) else str(v) for v in row] for row in d.itertuples(index=False)]
    head = [str(c) for c in d.columns]
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(c) + " |" for c in cells]
    )


def summarize(df: pd.DataFrame) -> str:
    out = [
        f"rows {len(df)}: mean absolute error {df.error_pct.abs().mean():.1f} %, "
        f"mean signed error {df.error_pct.mean():+.1f} %, max |error| {df.error_pct.abs().max():.1f} %; "
        f"predicted not to fit: {int((~df.fits).sum())}",
        "",
    ]
    for col in ("seq_len", "microbatch", "gpus", "model", "ckpt"):
        g = df.groupby(col).error_pct.agg(["count", "mean", lambda e: e.abs().mean()])
        g.columns = ["rows", "signed %", "abs %"]
        out += [f"by {col}", "", markdown(g), ""]
    out += ["rows", "", markdown(df), ""]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default=str(CSV))
    p.add_argument("--out", help="folder for rows.csv and summary.md")
    ns = p.parse_args()
    rows = pd.read_csv(ns.csv)
    df = pd.DataFrame([predict_row(r) for _, r in rows.iterrows()])
    text = summarize(df)
    print(text)
    if ns.out:
        out = Path(ns.out)
        atomic_write(out / "rows.csv", df.to_csv(index=False))
        atomic_write(out / "summary.md", text)


if __name__ == "__main__":
    main()
