"""Fit the kernel model's training figures to the calibration set and write the file they live in
(`topologies/fitted/training.yaml`, the same figures on every GPU), or with --check compare it.

    python experiments/calibration/fit_defaults.py [--check]

The fit is `shardsim calibrate`'s (`simulator.calibration.fit`): least squares on log tokens/s per
GPU over the rows of `experiments/calibration/data/mpt-a100-40gb.csv` (78 FSDP runs of MPT models
on A100-40GB), predicted on topology a100-40gb-roce without the training figures
(both fractions 1, `rank_time_cv` 0), of three of calibrate's parameters: `matmul_efficiency.bf16`
(the GEMM rate: over the topology's best measured GEMM it is `gemm_training_fraction`),
`attention_efficiency` (a factor on the fused-attention rates: `attn_training_fraction`) and
`rank_time_cv`. It takes about 20 CPU-seconds (about 25 predictions of the 78 rows).

Rounding (`fit_figures`, `gemm_fraction`): `attn_training_fraction` and `rank_time_cv` to 3 decimals, each to the
nearest; `gemm_training_fraction` is the fitted GEMM efficiency to 3 decimals over the best measured
GEMM, cut (rounded down) to 3 decimals: the largest such fraction whose GEMM rate is not above the
fitted one. The nearest 3 decimals of the unrounded ratio can differ by one in the last place.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import time
from dataclasses import dataclass, replace
from decimal import ROUND_DOWN, ROUND_HALF_EVEN, Decimal
from pathlib import Path

from shardsim.core.files import atomic_write
from shardsim.data import TOPOLOGIES
from shardsim.simulator import gpu_kernels as gk
from shardsim.simulator.calibration import fit as F
from shardsim.simulator.calibration.measurements import read_measurements
from shardsim.specs.hardware.topology import FITTED_FILE, TRAINING_FIGURES, InstanceType, KernelSpec, load_instance

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "experiments" / "calibration" / "data" / "mpt-a100-40gb.csv"
SHIPPED = TOPOLOGIES / FITTED_FILE
TOPOLOGY = "a100-40gb-roce"
NEUTRAL = {n: KernelSpec.__dataclass_fields__[n].default for n in TRAINING_FIGURES}  # fractions 1, cv 0: no effect
# calibrate's parameter for each figure (matmul_efficiency is fitted per precision: .bf16 here)
PARAMS = {
    "gemm_training_fraction": "matmul_efficiency",
    "attn_training_fraction": "attention_efficiency",
    "rank_time_cv": "rank_time_cv",
}
RANKS = (8, 128, 512)  # where the source of rank_time_cv states what it costs


@dataclass(frozen=True)
class Figures:
    """The fit and the figures derived from it: each figure unrounded, its standard error and as shipped."""

    fit: F.Fit
    matmul: str  # calibrate's name of the fitted GEMM efficiency (matmul_efficiency.<precision>)
    benchmark: float  # the topology's best measured GEMM efficiency of that precision
    rows: int
    value: dict[str, float]
    stderr: dict[str, float]
    shipped: dict[str, float]
    seconds: float


def base_instance() -> InstanceType:
    """The calibration set's topology with its training figures at the values that change nothing."""
    inst = load_instance(TOPOLOGY)
    assert inst.device.kernels is not None
    return replace(inst, device=replace(inst.device, kernels=replace(inst.device.kernels, **NEUTRAL)))


def _round(x: float | Decimal, places: int, how: str = ROUND_HALF_EVEN) -> Decimal:
    return Decimal(str(x)).quantize(Decimal(1).scaleb(-places), rounding=how)


def gemm_fraction(matmul: float, benchmark: float) -> Decimal:
    """The shipped GEMM training fraction: `matmul` to 3 decimals over `benchmark`, cut to 3 decimals."""
    return _round(_round(matmul, 3) / Decimal(str(benchmark)), 3, ROUND_DOWN)


def fit_figures() -> Figures:
    """Fit the training figures to the measured rows of `CSV` (see the module docstring)."""
    inst = base_instance()
    rows = read_measurements(CSV, TOPOLOGY, inst)
    names, notes = F.fitted_names(inst, rows, tuple(PARAMS.values()))
    if notes or len(names) != len(PARAMS):
        raise SystemExit(f"{CSV}: the rows do not fit {', '.join(PARAMS.values())}: {'; '.join(notes) or names}")
    param = dict(zip(PARAMS, names, strict=True))
    matmul = param["gemm_training_fraction"]
    start = time.process_time()
    f = F.fit(inst, rows, names)
    seconds = time.process_time() - start
    bench = inst.device.matmul_efficiency[matmul.split(".", 1)[1]]
    # each figure: its parameter over what the topology's own figure already gives
    over = {"gemm_training_fraction": bench, "attn_training_fraction": 1.0, "rank_time_cv": 1.0}
    value = {n: f.values[param[n]] / over[n] for n in TRAINING_FIGURES}
    stderr = {n: f.stderr[param[n]] / over[n] for n in TRAINING_FIGURES}
    shipped = {
        "gemm_training_fraction": gemm_fraction(f.values[matmul], bench),
        "attn_training_fraction": _round(value["attn_training_fraction"], 3),
        "rank_time_cv": _round(value["rank_time_cv"], 3),
    }
    return Figures(
        fit=f,
        matmul=matmul,
        benchmark=bench,
        rows=len(rows),
        value=value,
        stderr=stderr,
        shipped={k: float(v) for k, v in shipped.items()},
        seconds=seconds,
    )


def render(fig: Figures) -> str:
    """The text of the shipped file: each figure as shipped, with its source."""
    data = CSV.relative_to(ROOT)
    m = _round(fig.fit.values[fig.matmul], 3)
    g, a, cv = (fig.shipped[n] for n in TRAINING_FIGURES)
    fitted = (
        f"fitted, not measured, to the measured throughput of {data} ({fig.rows} FSDP runs of MPT models on "
        "A100-40GB) by least squares on log tokens/s, the three training figures of this file together "
        "(experiments/calibration/fit_defaults.py)"
    )
    also = "fitted, not measured, with gemm_training_fraction (see its source)"
    everywhere = "Fitted on the A100 only; assumed the same on every other GPU (not measured there)."
    pace = ", ".join(f"+{(gk.slowest_of(n, cv) - 1) * 100:.1f} % at {n}" for n in RANKS)
    sources = {
        "gemm_training_fraction": (
            f"{fitted}: GEMMs at {m} +- {fig.fit.stderr[fig.matmul]:.3f} of peak over the {fig.benchmark:g} of "
            f"the best measured GEMM ({TOPOLOGY}'s {fig.matmul}) = {m / Decimal(str(fig.benchmark)):.5f}, cut to "
            f"{g:g}. What it stands for: clocks that settle below the short benchmark's under sustained power "
            f"draw, HBM bandwidth shared with overlapped NCCL kernels (the SMs they hold are modelled apart: "
            f"engine.sm_share). {everywhere}"
        ),
        "attn_training_fraction": (
            f"{also}: the factor on the fused-attention rates, {fig.value['attn_training_fraction']:.3f} +- "
            f"{fig.stderr['attn_training_fraction']:.3f}. The calibration set's attention ran at {a * 100:.0f} % "
            "of the FlashAttention-2 benchmark rates: as a first-generation or Triton flash kernel would (the "
            "FlashAttention-2 paper puts FlashAttention-1 at 25-40 % of A100 peak) or through effects of the "
            f"training step; which one is not known. {everywhere}"
        ),
        "rank_time_cv": (
            f"{also}: {fig.value['rank_time_cv']:.3f} +- {fig.stderr['rank_time_cv']:.3f}. The rank-to-rank "
            "variation of compute time, so that the slowest of N ranks sets the pace (1 + cv x E[max of N "
            f"normals]: {pace} ranks); in the calibration set throughput per GPU falls about 1.5 % per "
            "doubling of GPUs from 16 to 128. It stands for every effect that grows with the ranks that wait "
            f"on each other (stragglers, jitter, fabric congestion), not a measured spread. {everywhere}"
        ),
    }
    head = (
        "# The kernel model's training figures, the same on every GPU. A topology's device.kernels reads them\n"
        "# with `training_figures: fitted`; a figure it gives itself replaces the one here.\n"
        "# Written by experiments/calibration/fit_defaults.py (--check compares): do not edit by hand.\n"
    )
    body = "".join(f'{n}: {{value: {fig.shipped[n]:g}, source: "{sources[n]}"}}\n' for n in TRAINING_FIGURES)
    return head + body


def differences(text: str, path: Path) -> list[str]:
    """The lines of the file at `path` that differ from `text`, as a unified diff (empty: identical)."""
    old = path.read_text().splitlines() if path.is_file() else []
    return list(difflib.unified_diff(old, text.splitlines(), str(path), "the fit", lineterm="", n=0))


def report(fig: Figures) -> str:
    f = fig.fit
    lines = [
        f"fitted to {CSV.relative_to(ROOT)} ({fig.rows} rows) on {TOPOLOGY} without the training figures: "
        f"{f.evaluations} evaluations, {fig.seconds:.1f} CPU-s",
        *(f"  {n:<24} {f.defaults[n]:g} -> {v:.5f} +- {f.stderr[n]:.4f}" for n, v in f.values.items()),
        "figures (value +- standard error -> shipped):",
        *(f"  {n:<24} {fig.value[n]:.5f} +- {fig.stderr[n]:.4f} -> {fig.shipped[n]:g}" for n in TRAINING_FIGURES),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help=f"compare {SHIPPED.relative_to(ROOT)}; exit 1 if it differs")
    ns = p.parse_args(argv)
    fig = fit_figures()
    print(report(fig))
    text = render(fig)
    if ns.check:
        diff = differences(text, SHIPPED)
        print("\n".join(diff) if diff else f"{SHIPPED.relative_to(ROOT)}: identical")
        return 1 if diff else 0
    atomic_write(SHIPPED, text)
    print(f"{SHIPPED.relative_to(ROOT)}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
