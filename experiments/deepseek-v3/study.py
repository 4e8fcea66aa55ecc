"""DeepSeek-V3's published training layout (16-way pipeline, 64-way expert parallelism, ZeRO-1 data
parallelism on 2,048 H800 GPUs) against a few alternatives on the same 2,048 GPUs, each with
tokens/s per GPU, MFU (of the active parameters), memory and dollars per million tokens.

    python experiments/deepseek-v3/study.py [--out DIR]

One `shardsim.predict` a layout (`LAYOUTS`); writes table.json and README.md into DIR (default:
this folder). The cluster is 256 x p5.48xlarge (H100 SXM), the stand-in for H800 (no H800
topology here: the H800 has the H100 SXM's compute and memory, its NVLink cut to 400 GB/s, so
what moves inside a node moves faster here than it did there).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import shardsim

HERE = Path(__file__).resolve().parent
BASE = {"workload": "deepseek-v3", "topology": "p5.48xlarge", "nodes": 256, "precision": "bf16"}
# 8,192 sequences of 4,096 tokens a step, in every layout: a pipeline replica (2,048 / 16 = 128 of
# them) runs 64 microbatches of one sequence; the layouts without a pipeline 4 micro-steps of one
PIPE = {"strategy": "pipeline", "schedule": "1f1b", "batch_per_device": 4}
FLAT = {"batch_per_device": 1, "grad_accum": 4}
LAYOUTS: dict[str, dict] = {
    "published: pp 16, ep 64, dp 128": PIPE | {"pp": 16, "microbatches": 64, "degree": 128, "ep": 64},
    "pp 16, ep 32": PIPE | {"pp": 16, "microbatches": 64, "degree": 128, "ep": 32},
    "pp 16, ep 8 (EP inside a node)": PIPE | {"pp": 16, "microbatches": 64, "degree": 128, "ep": 8},
    "pp 8, ep 64, dp 256": PIPE | {"pp": 8, "microbatches": 32, "degree": 256, "ep": 64},
    "no pipeline: HSDP over 256, ep 64": FLAT | {"strategy": "zero2d", "degree": 256, "ep": 64},
    "no pipeline: HSDP over 256, ep 8": FLAT | {"strategy": "zero2d", "degree": 256, "ep": 8},
    "no pipeline: FSDP over 2,048, ep 64": FLAT | {"strategy": "zero", "ep": 64},
}  # fmt: skip
COLUMNS = {
    "name": "layout",
    "label": "configuration",
    "tokens_per_s_per_gpu": "tokens/s/GPU",
    "mfu": "MFU",
    "memory_required_gib": "memory (GiB)",
    "fits": "fits",
    "cost_per_million_tokens_usd": "$/Mtok",
    "step_time_s": "step (s)",
    "exposed_comm_s": "exposed comm (s)",
    "bubble_s": "bubble (s)",
    "stage_compute_s": "compute (s), a2a stage",
    "stage_all_to_all_s": "all-to-all (s), a2a stage",
}


def a2a_stage(p) -> tuple[float, float]:
    """(compute, all-to-all) seconds in the step of the rank class (a pipeline's stage) whose
    all-to-alls take longest: its compute ops' and its all-to-all ops' spans."""
    per: dict[int, list[float]] = {}
    for s in p.spans:
        got = per.setdefault(s.rank_class, [0.0, 0.0])
        if s.kind == "compute":
            got[0] += s.end - s.start
        elif s.name.startswith("A2A"):
            got[1] += s.end - s.start
    compute, a2a = max(per.values(), key=lambda ca: ca[1])
    return compute, a2a


def row(name: str, settings: dict) -> dict:
    """The prediction of layout `name` as a row of `COLUMNS`."""
    p = shardsim.predict(BASE, **settings)
    compute, a2a = a2a_stage(p)
    return {
        "name": name,
        "label": p.label,
        "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
        "mfu": p.mfu,
        "memory_required_gib": p.memory_required_gib,
        "fits": p.fits,
        "cost_per_million_tokens_usd": p.cost_per_million_tokens_usd,
        "step_time_s": p.step_time_s,
        "exposed_comm_s": p.breakdown["exposed_comm_s"],
        "bubble_s": p.breakdown["bubble_s"],
        "stage_compute_s": compute,
        "stage_all_to_all_s": a2a,
        "global_batch": p.global_batch,
    }


def cell(c: str, v) -> str:
    if c == "mfu":
        return f"{100 * v:.1f} %"
    if c == "fits":
        return "yes" if v else "**no**"
    if c == "tokens_per_s_per_gpu":
        return f"{v:,.0f}"
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def readme(rows: list[dict]) -> str:
    published, rest = rows[0], [r for r in rows[1:] if r["fits"]]
    best = max(rest, key=lambda r: r["tokens_per_s_per_gpu"])
    gain = best["tokens_per_s_per_gpu"] / published["tokens_per_s_per_gpu"] - 1
    table = ["| " + " | ".join(COLUMNS.values()) + " |", "|" + "---|" * len(COLUMNS)]
    table += ["| " + " | ".join(cell(c, r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(
        [
            "# DeepSeek-V3's published layout against alternatives on 2,048 GPUs (predicted)",
            "",
            "Written by `python experiments/deepseek-v3/study.py` (`table.json`: the rows). Each row is",
            "`shardsim predict --workload deepseek-v3 --topology p5.48xlarge --nodes 256 --precision bf16` with the",
            "row's configuration (`LAYOUTS` in the script). No figure here was measured, and none is compared",
            "with DeepSeek's reported throughput.",
            "",
            "The choices that bend reality, named:",
            "- **H100 for H800**: 256 x p5.48xlarge (H100 SXM, NVSwitch at 900 GB/s a GPU, 3,200 Gb/s of EFA a",
            "  node) stands in for DeepSeek's H800 cluster (the same compute, NVLink at 400 GB/s, InfiniBand):",
            "  there is no H800 topology here.",
            "- **ZeRO-1 as FSDP2**: a pipeline's stages shard with FSDP2 here (ZeRO-1 is a kind of its own, DDP's,",
            "  and does not compose with pipelines in this code). A stage sharded over its 128 data-parallel ranks",
            "  (dp_shard 2 x ep 64: the experts over the 2 ranks left after EP, the rest over all 128) shards the",
            "  optimizer's state as ZeRO-1 does and reduce-scatters its gradients once per schedule step, as",
            "  pipelining runs FSDP2; it also all-gathers a unit's parameters in each pass that finds it resharded,",
            "  where ZeRO-1 keeps them whole: more communication than DeepSeek's, against the published layout.",
            "- **1F1B for DualPipe**: DeepSeek's DualPipe overlaps one microbatch's all-to-alls with another's",
            "  compute; zero-bubble schedules (a split backward) are not planned with expert parallelism here, so",
            "  every pipeline row runs PyTorch's 1F1B, whose all-to-alls sit on the critical path.",
            "- **Routing**: balanced (`moe_imbalance` 1.0, an ideal stated) and not node-limited (DeepSeek routes a",
            "  token to at most 4 nodes; here an EP group of 64 spreads every token's 8 experts over its 8 nodes).",
            "- **Batch**: 8,192 sequences of 4,096 tokens a step (33.5 M tokens), smaller than DeepSeek's final",
            "  batch, so that each pipeline row is simulated in seconds: 64 microbatches a 16-stage replica.",
            "- Activation checkpointing on (full: a layer's all-to-alls run again in its recomputation);",
            "  the multi-token-prediction module left out (the library model's source says so).",
            "",
            *table,
            "",
            "## What it shows",
            "",
            f"- The published layout is predicted at {published['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU "
            f"(MFU {100 * published['mfu']:.1f} %); the fastest alternative that fits is `{best['label']}` "
            f"({best['name']}), {100 * gain:+.1f} % against it.",
            f"- In the published layout the stage whose all-to-alls take longest spends "
            f"{published['stage_all_to_all_s']:.1f} s of the step in them against {published['stage_compute_s']:.1f} s",
            "  of compute (the last two columns: per step, that stage's ops). The plan hides little of it: a layer's",
            "  experts wait for their dispatch and its output for the combine, only the shared expert runs beside",
            "  the combine (torchtitan's MoE order), and under 1F1B the other stages wait for that stage, which the",
            "  bubble column counts with the pipeline's own fill and drain. DualPipe's overlap of one microbatch's",
            "  all-to-alls with another's compute is built to remove that wait; this model cannot credit it yet.",
            "- With ep 64 every layout's all-to-alls cross 8 nodes of EFA and take about as long as its compute;",
            "  with ep 8 they stay on a node's NVSwitch, and the experts' FSDP2 all-gathers over the ranks left",
            "  after EP (each EP rank gathers 32 experts a layer, not 4) take their place.",
            "",
        ]
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="the folder to write table.json and README.md into")
    ns = ap.parse_args()
    rows = [row(name, settings) for name, settings in LAYOUTS.items()]
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "table.json").write_text(json.dumps(rows, indent=1) + "\n")
    (ns.out / "README.md").write_text(readme(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
