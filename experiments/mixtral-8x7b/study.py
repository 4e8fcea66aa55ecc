"""Mixtral 8x7B on 1, 2, 4 and 8 x p5.48xlarge (H100): which expert-parallel, tensor-parallel and
FSDP layout is fastest, each row with tokens/s per GPU, MFU (of the active parameters), memory and
dollars per million tokens.

    python experiments/mixtral-8x7b/study.py [--out DIR]

One `shardsim.sweep` (the space is `SPACE`, the command that sweeps the same is in the README this
writes) over zero, zero2d and pipelines of 2 and 4 stages (1F1B), each with tensor-parallel degrees
1, 2, 4, 8 and expert-parallel degrees 1, 2, 4, 8 where they compose (`config.ep`; with tp > 1 under
etp 1 and etp = tp). Writes
table.json (every row that fits) and README.md into DIR (default: this folder).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd

import shardsim

HERE = Path(__file__).resolve().parent
BASE = {"workload": "mixtral-8x7b", "topology": "p5.48xlarge", "precision": "bf16", "seq_len": 4096}
SPACE = {
    "strategies": ["zero", "zero2d", "pipeline"],
    "nodes": [1, 2, 4, 8],
    "ep": [1, 2, 4, 8],
    "tp_degrees": [1, 2, 4, 8],
    "pp": [2, 4],
    "schedules": ["1f1b"],
}
COMMAND = (
    "shardsim sweep --workload mixtral-8x7b --topology p5.48xlarge --precision bf16 --seq-len 4096 "
    "--strategies zero,zero2d,pipeline --nodes 1,2,4,8 --ep 1,2,4,8 --tp-degrees 1,2,4,8 --pp 2,4 --schedules 1f1b"
)
COLUMNS = {
    "label": "configuration",
    "layout": "layout",
    "ep": "ep",
    "tokens_per_s_per_gpu": "tokens/s/GPU",
    "mfu": "MFU",
    "memory_required_gib": "memory (GiB)",
    "cost_per_million_tokens_usd": "$/Mtok",
    "step_time_s": "step (s)",
    "exposed_comm_s": "exposed comm (s)",
}
TOP = 5


def rows() -> pd.DataFrame:
    """Every configuration of the space that fits, fastest first within each cluster."""
    t = shardsim.sweep(BASE, workers=1, **SPACE).table
    t = t[t["fits"]].copy()
    t["ep"] = [int(m[1]) if (m := re.search(r"\bep=(\d+)", label)) else 1 for label in t["label"]]
    t = t.sort_values(["nodes", "tokens_per_s_per_gpu"], ascending=[True, False])
    return t[["nodes", "world", "global_batch", *COLUMNS]].reset_index(drop=True)


def markdown(df: pd.DataFrame) -> list[str]:
    """`df`'s `COLUMNS` as a Markdown table."""

    def cell(c: str, v) -> str:
        if c == "mfu":
            return f"{100 * v:.1f} %"
        if c == "tokens_per_s_per_gpu":
            return f"{v:,.0f}"
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    out = ["| " + " | ".join(COLUMNS.values()) + " |", "|" + "---|" * len(COLUMNS)]
    return out + ["| " + " | ".join(cell(c, r[c]) for c in COLUMNS) + " |" for _, r in df.iterrows()]


def findings(df: pd.DataFrame) -> list[str]:
    """One line per cluster: the fastest layout, the fastest with expert parallelism, and their gap."""
    out = []
    for nodes in SPACE["nodes"]:
        here = df[df["nodes"] == nodes]
        if here.empty:
            out.append(f"- {nodes} x p5.48xlarge: nothing fits (Adam's states of 46.7 B parameters need more GPUs).")
            continue
        best = here.iloc[0]
        line = f"- {nodes} x p5.48xlarge: fastest `{best['label']}` ({best['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU)"
        ep = here[here["ep"] > 1]
        both = ep[ep["label"].str.contains(r"\btp=")]
        for what, rows_ in (("with expert parallelism", ep), ("with expert and tensor parallelism", both)):
            if not rows_.empty and rows_.index[0] != here.index[0]:
                e = rows_.iloc[0]
                gap = 1 - e["tokens_per_s_per_gpu"] / best["tokens_per_s_per_gpu"]
                line += f"; {what} at best `{e['label']}`, {100 * gap:.1f} % slower"
        out.append(line + ".")
    return out


def readme(df: pd.DataFrame) -> str:
    text = [
        "# Mixtral 8x7B on 1 to 8 x p5.48xlarge: expert, tensor and data parallelism (predicted)",
        "",
        "Written by `python experiments/mixtral-8x7b/study.py` (`table.json`: every row that fits). The same",
        "space as a command:",
        "",
        f"`{COMMAND}`",
        "",
        "Predictions of the model as it stands, none measured: PyTorch FSDP2 + DTensor TP + pipelining, expert",
        "parallelism as torchtitan composes it (experts / ep per EP rank, sharded by FSDP2 over the data-parallel",
        "ranks left after EP; dispatch and combine as NCCL's all-to-all), routing taken as balanced",
        "(`moe_imbalance` 1.0, an ideal stated, not measured), 4,096 tokens a sequence, 2 sequences per GPU and",
        "data-parallel rank (every layout of a cluster runs that global batch), activation checkpointing on.",
        "MFU counts the active parameters (12.9 B a token: 6 N_active + attention), against the BF16 dense peak.",
        "Expert parallelism with tensor parallelism is torchtitan's, under both of its experts' tensor-parallel",
        "degrees: etp 1 (its default, unnamed in a label: EP borrows tensor-parallel ranks, each dispatching a",
        "tp-th of the tokens to whole experts) and etp = tp (`etp=N`: EP over data-parallel ranks, every rank",
        "dispatching all the tokens to experts split by tp).",
        "",
        "## What it shows",
        "",
        *findings(df),
        "",
        "Expert parallelism trades FSDP2's all-gathers of the experts (each EP rank gathers experts / ep of them)",
        "for the dispatch and combine all-to-alls of every MoE layer, forward, backward and recomputation. The",
        "all-gathers run ahead of compute (FSDP2's prefetch) and hide behind it; the all-to-alls cannot (the",
        "experts wait for the dispatch, the layer's output for the combine), so the exposed communication",
        "column grows with EP (every degree up to 8 keeps its all-to-alls inside a node's NVSwitch).",
        "",
    ]
    for nodes in SPACE["nodes"]:
        here = df[df["nodes"] == nodes]
        world = 8 * nodes
        text += [f"## {nodes} x p5.48xlarge ({world} H100)", ""]
        if here.empty:
            text += ["No configuration fits in memory.", ""]
            continue
        text += [f"Global batch {int(here['global_batch'].iloc[0])} sequences; {len(here)} configurations fit.", ""]
        text += [f"The {TOP} fastest:", "", *markdown(here.head(TOP)), ""]
        per_ep = here.drop_duplicates("ep").sort_values("ep")
        text += ["The fastest of each expert-parallel degree:", "", *markdown(per_ep), ""]
    return "\n".join(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="the folder to write table.json and README.md into")
    ns = ap.parse_args()
    df = rows()
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "table.json").write_text(json.dumps(df.to_dict(orient="records"), indent=1) + "\n")
    (ns.out / "README.md").write_text(readme(df))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
