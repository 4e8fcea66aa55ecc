"""Measured block times on a GPU (`shardsim profile --device cuda`) against the simulator's
compute model for that GPU (the model from kernels: `simulator.gpu_kernels`).

    python experiments/validation/gpu/compare.py PROFILE.json --topology p5.48xlarge \
        --precision bf16 [--out table.md]

Prints, per block and for the whole model, forward and backward: measured, modelled, and
modelled / measured; the share of blocks whose forward + backward is within 15 % of the
measurement; and the TFLOP/s the measurement implies.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from shardsim.core.files import atomic_write
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.hardware.profile import load_profile
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import load_instance

ROOT = Path(__file__).resolve().parents[3]
# What `shardsim profile` runs per block beyond the block's own kernels, each pass: autocast's
# casts of the fp32 weights and biases of a transformer layer's four Linear layers (and their
# gradients' casts back in backward) below fp32, and the harness's `(out.float() * g).sum()`.
AUTOCAST_CASTS = 8
HARNESS_KERNELS = 3


def compare(profile_path: str, topology: str, precision: str) -> tuple[list[dict], dict]:
    doc = json.loads(Path(profile_path).read_text())
    w = load_workload(doc["workload"])
    prof = load_profile(profile_path, w.name)
    extra = HARNESS_KERNELS + (AUTOCAST_CASTS if precision != "fp32" else 0)
    # blocks timed alone, as kernel benchmarks are: the training step's fractions do not apply
    dev = load_instance(topology).device
    assert dev.kernels is not None
    alone = replace(dev.kernels, gemm_training_fraction=1.0, attn_training_fraction=1.0)
    model = ComputeModel(replace(dev, kernels=alone), precision, arch=w.arch, extra_kernels=(extra, extra))
    batch = max(prof.blocks)
    rows = []
    for b in w.blocks:
        measured = prof.block_time(b.name, batch)
        if measured is None:
            continue
        m = model.block(b, batch)
        flops = (b.fwd_flops + b.bwd_flops) * batch
        rows.append(
            {
                "block": b.name,
                "batch": batch,
                "fwd_measured_ms": measured[0] * 1e3,
                "fwd_model_ms": m.fwd_s * 1e3,
                "bwd_measured_ms": measured[1] * 1e3,
                "bwd_model_ms": m.bwd_s * 1e3,
                "achieved_tflops": flops / (measured[0] + measured[1]) / 1e12,
                "model_over_measured": (m.fwd_s + m.bwd_s) / (measured[0] + measured[1]),
            }
        )
    fm, fp = sum(r["fwd_measured_ms"] for r in rows), sum(r["fwd_model_ms"] for r in rows)
    bm, bp = sum(r["bwd_measured_ms"] for r in rows), sum(r["bwd_model_ms"] for r in rows)
    flops = sum((b.fwd_flops + b.bwd_flops) * batch for b in w.blocks if prof.block_time(b.name, batch))
    total = {
        "workload": w.name,
        "device_profiled": doc.get("device_name", doc.get("device")),
        "model_of": f"{topology} ({model.device.model}), {precision}",
        "batch": batch,
        "fwd_measured_ms": fm,
        "fwd_model_ms": fp,
        "bwd_measured_ms": bm,
        "bwd_model_ms": bp,
        "model_over_measured": (fp + bp) / (fm + bm),
        "blocks_within_15pct": sum(abs(r["model_over_measured"] - 1) <= 0.15 for r in rows),
        "blocks": len(rows),
        "achieved_tflops": flops / ((fm + bm) / 1e3) / 1e12,
        "model_tflops": model.flops_per_s / 1e12,
        "peak_tflops": model.peak_flops / 1e12,
        "whole_model_s": doc.get("whole_model_s"),
    }
    return rows, total


def to_markdown(rows: list[dict], total: dict) -> str:
    out = [
        f"{total['workload']} at batch {total['batch']} on {total['device_profiled']}; model: {total['model_of']}",
        "",
        "| block | fwd measured | fwd model | bwd measured | bwd model | model / measured | achieved TFLOP/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['block']} | {r['fwd_measured_ms']:.3f} ms | {r['fwd_model_ms']:.3f} ms | "
            f"{r['bwd_measured_ms']:.3f} ms | {r['bwd_model_ms']:.3f} ms | {r['model_over_measured']:.2f} | "
            f"{r['achieved_tflops']:.3g} |"
        )
    out.append(
        f"| **all blocks** | {total['fwd_measured_ms']:.2f} ms | {total['fwd_model_ms']:.2f} ms | "
        f"{total['bwd_measured_ms']:.2f} ms | {total['bwd_model_ms']:.2f} ms | {total['model_over_measured']:.2f} | "
        f"{total['achieved_tflops']:.3g} |"
    )
    out += [
        "",
        f"model / measured (forward + backward): {total['model_over_measured']:.3f}; blocks within 15 %: "
        f"{total['blocks_within_15pct']} of {total['blocks']}; measured {total['achieved_tflops']:.0f} TFLOP/s over"
        f" the blocks (dense peak {total['peak_tflops']:.0f}).",
    ]
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile")
    p.add_argument("--topology", default="p5.48xlarge")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--out", help="also write the table (markdown) and the figures (JSON beside it)")
    ns = p.parse_args()
    rows, total = compare(ns.profile, ns.topology, ns.precision)
    md = to_markdown(rows, total)
    print(md)
    if ns.out:
        atomic_write(Path(ns.out), md)
        atomic_write(Path(ns.out).with_suffix(".json"), json.dumps({"rows": rows, "total": total}, indent=2) + "\n")


if __name__ == "__main__":
    main()
