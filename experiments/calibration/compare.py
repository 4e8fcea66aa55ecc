"""Predict every row of the calibration set (measured A100-40GB FSDP runs of MPT models) four ways
and compare tokens/s per GPU: the roofline (the topology without its kernel figures), the kernel
model's defaults, the calibrated model (`shardsim calibrate`'s fit to all rows) and its k-fold
cross-validation (each row predicted by a fit to the other folds).

    python experiments/calibration/compare.py [--csv CSV] [--out DIR] [--folds 5]

CSV: the calibration set, by default `experiments/calibration/data/mpt-a100-40gb.csv`.

Rows are read as `shardsim calibrate` reads them (`simulator.calibration.measurements`): the mpt
family (no biases, LayerNorm without bias), learned positions, tied embeddings, MLP 4 × d_model,
vocabulary 50,368; FULL_SHARD as zero, mp_mode PURE as bf16 reduction, checkpointing per row.
Topology `a100-40gb-roce`. With --out: rows.csv, summary.md, scatter.png, errors.png there.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from shardsim.core.files import atomic_path, atomic_write  # noqa: E402
from shardsim.simulator.calibration import fit as F  # noqa: E402
from shardsim.simulator.calibration.measurements import read_measurements  # noqa: E402
from shardsim.specs.hardware.topology import load_instance  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "experiments" / "calibration" / "data" / "mpt-a100-40gb.csv"
TOPOLOGY = "a100-40gb-roce"
MODELS = ("roofline", "kernels", "calibrated", "cv")


def table(csv: Path, folds: int) -> tuple[pd.DataFrame, F.Fit]:
    inst = load_instance(TOPOLOGY)
    rows = read_measurements(csv, TOPOLOGY, inst)
    raw = pd.read_csv(csv)
    roofline = replace(inst, device=replace(inst.device, kernels=None))
    preds = F.predictions(inst, rows, {})
    names, _ = F.fitted_names(inst, rows)
    f = F.fit(inst, rows, names)
    ratio = {
        "roofline": F.ratios(roofline, rows, {}),
        "kernels": np.array([m.ratio(p) for m, p in zip(rows, preds, strict=True)]),
        "calibrated": F.ratios(inst, rows, f.values),
        "cv": F.cross_validated(inst, rows, names, folds),
    }
    out = []
    for i, (m, p) in enumerate(zip(rows, preds, strict=True)):
        r = raw.iloc[i]
        d = {
            "model": r.model,
            "seq_len": int(r.seq_len),
            "gpus": int(r.gpus),
            "microbatch": int(r.microbatch),
            "grad_accum": int(r.grad_accum),
            "ckpt": bool(r.activation_checkpointing),
            "params": m.workload.params,
            "params_vs_csv_pct": (m.workload.params / r.num_params - 1) * 100,
            "measured": float(r.tokens_per_s_per_gpu),
        }
        for k in MODELS:
            d[f"{k}_tok_s"] = ratio[k][i] * d["measured"]
            d[f"{k}_err_pct"] = (ratio[k][i] - 1) * 100
        d |= {"memory_gib": p.memory_required_gib, "fits": p.fits}
        d |= {"compute_ms": p.breakdown["compute_s"] * 1e3, "exposed_comm_ms": p.breakdown["exposed_comm_s"] * 1e3}
        out.append(d)
    return pd.DataFrame(out), f


def markdown(df: pd.DataFrame) -> str:
    """A DataFrame as a markdown table (its index as the first column when named)."""
    d = df.reset_index() if df.index.name else df
    cells = [[f"{v:.1f}" if isinstance(v, float) else str(v) for v in row] for row in d.itertuples(index=False)]
    head = [str(c) for c in d.columns]
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(c) + " |" for c in cells]
    )


def summarize(df: pd.DataFrame, f: F.Fit, folds: int) -> str:
    lines = ["| model | mean abs error % | mean signed % | max abs % | rows within 10 % |", "|---|---|---|---|---|"]
    for k in MODELS:
        e = df[f"{k}_err_pct"]
        name = f"{folds}-fold CV" if k == "cv" else k
        lines.append(
            f"| {name} | {e.abs().mean():.1f} | {e.mean():+.1f} | {e.abs().max():.1f} | {(e.abs() <= 10).sum()} |"
        )
    out = [f"rows {len(df)}; predicted not to fit: {int((~df.fits).sum())}; parameter count vs the CSV's num_params: "
           f"{df.params_vs_csv_pct.min():+.3f} to {df.params_vs_csv_pct.max():+.3f} %", "", *lines, "",
           "fitted to all rows (default → value ± standard error, [bounds]):", ""]  # fmt: skip
    for n, v in f.values.items():
        lo, hi = f.bounds[n]
        out.append(f"- {n}: {f.defaults[n]:.4g} → {v:.4g} ± {f.stderr[n]:.2g} [{lo:g}, {hi:g}]")
    out.append("")
    errs = [f"{k}_err_pct" for k in MODELS]
    for col in ("seq_len", "microbatch", "gpus", "model", "ckpt"):
        g = df.groupby(col)[errs].mean()
        g.insert(0, "rows", df.groupby(col).size())
        g.columns = ["rows", *(f"{k} signed %" for k in MODELS)]
        out += [f"by {col} (mean signed error)", "", markdown(g), ""]
    show = ["model", "seq_len", "gpus", "microbatch", "grad_accum", "ckpt", "measured", *errs, "memory_gib", "fits"]
    out += ["rows", "", markdown(df[show]), ""]
    return "\n".join(out)


def plots(df: pd.DataFrame, out: Path, folds: int) -> None:
    colors = {"roofline": "tab:gray", "kernels": "tab:blue", "calibrated": "tab:green", "cv": "tab:orange"}
    label = {"cv": f"{folds}-fold CV"}
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for k in MODELS:
        ax.scatter(df.measured, df[f"{k}_tok_s"], s=14, c=colors[k], label=label.get(k, k), alpha=0.8)
    lo, hi = df.measured.min() * 0.7, df[[f"{k}_tok_s" for k in MODELS]].max().max() * 1.3
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="k", alpha=0.07, label="±10 %")
    ax.set(xscale="log", yscale="log", xlabel="measured tokens/s per GPU", ylabel="predicted tokens/s per GPU")
    ax.set_title("MPT on A100-40GB (llm-foundry), 78 rows")
    ax.legend()
    with atomic_path(out / "scatter.png") as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharey=True)
    for ax, col in zip(axes, ("seq_len", "microbatch", "gpus"), strict=True):
        for k in MODELS:
            g = df.groupby(col)[f"{k}_err_pct"].mean()
            ax.plot(g.index, g.values, "o-", c=colors[k], label=label.get(k, k))
        ax.axhline(0, c="k", lw=0.8)
        ax.axhspan(-4, 4, color="k", alpha=0.07)
        ax.set(xscale="log", xlabel=col, title=f"mean signed error by {col}")
    axes[0].set_ylabel("predicted / measured tokens/s - 1 (%)")
    axes[0].legend()
    with atomic_path(out / "errors.png") as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default=str(CSV))
    p.add_argument("--out", help="folder for rows.csv, summary.md and the plots")
    p.add_argument("--folds", type=int, default=5)
    ns = p.parse_args()
    out = Path(ns.out) if ns.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)  # before the minutes of predictions and fits, not after
    df, f = table(Path(ns.csv), ns.folds)
    text = summarize(df, f, ns.folds)
    print(text)
    if out is not None:
        atomic_write(out / "rows.csv", df.to_csv(index=False))
        atomic_write(out / "summary.md", text)
        plots(df, out, ns.folds)


if __name__ == "__main__":
    main()
