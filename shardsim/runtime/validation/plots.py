"""Plots of a validation: predicted vs measured (scatter) and per configuration (bars), PNG."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3")


def plot_validation(rows: list, summary: dict[str, Any], out: Path) -> list[Path]:
    ok = [r for r in rows if r.status == "ok" and not math.isnan(r.error_pct)]
    tops = list(dict.fromkeys(r.topology for r in ok))
    paths = [out / "scatter.png", out / "errors.png"]

    fig = Figure(figsize=(5.5, 5), layout="constrained")
    ax = fig.add_subplot()
    hi = max(max(r.measured_s, r.predicted_s) for r in ok) * 1.1
    ax.plot([0, hi], [0, hi], color="black", lw=1, label="predicted = measured")
    for pct, ls in ((5, "--"), (10, ":")):
        ax.fill_between([0, hi], [0, hi * (1 - pct / 100)], [0, hi * (1 + pct / 100)], color="grey", alpha=0.12)
        ax.plot([0, hi], [0, hi * (1 + pct / 100)], color="grey", lw=0.8, ls=ls, label=f"±{pct} %")
        ax.plot([0, hi], [0, hi * (1 - pct / 100)], color="grey", lw=0.8, ls=ls)
    for i, top in enumerate(tops):
        for quiet in (True, False):  # hollow: too few quiet steps (measured over every step)
            mine = [r for r in ok if r.topology == top and r.host_quiet == quiet]
            if not mine:
                continue
            color = COLORS[i % len(COLORS)]
            ax.errorbar(
                [r.measured_s for r in mine],
                [r.predicted_s for r in mine],
                xerr=[[r.measured_s - r.measured_min_s for r in mine], [r.measured_max_s - r.measured_s for r in mine]],
                fmt="o",
                color=color,
                mfc=color if quiet else "white",
                label=top if quiet else f"{top}, stolen steps",
                capsize=2,
            )
    ax.set(xlim=(0, hi), ylim=(0, hi), xlabel="measured step time (s, median; bars: min–max)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(
        f"shardsim validate: mean |error| {summary['mape_pct']:.1f} %, largest {summary['max_error_pct']:.1f} %",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.savefig(paths[0], dpi=110)

    fig = Figure(figsize=(max(6.0, 0.55 * len(ok) + 2), 4.8), layout="constrained")
    ax = fig.add_subplot()
    x = list(range(len(ok)))
    w = 0.4
    bars = ax.bar([i - w / 2 for i in x], [r.measured_s for r in ok], w, label="measured (median)", color="#4C72B0")
    for bar, r in zip(bars, ok, strict=True):
        if not r.host_quiet:
            bar.set_hatch("//")  # too few quiet steps: measured over every step
    ax.bar([i + w / 2 for i in x], [r.predicted_s for r in ok], w, label="predicted", color="#DD8452")
    for i, r in zip(x, ok, strict=True):
        ax.annotate(f"{r.error_pct:+.1f}%", (i, max(r.measured_s, r.predicted_s)), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [f"{r.topology}\n{r.label}" for r in ok], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("step time (s)")
    ax.set_title("predicted vs measured per configuration (label: prediction error; hatched: stolen)", fontsize=10)
    ax.legend(fontsize=8)
    fig.savefig(paths[1], dpi=110)
    return paths
