"""Print the collectives PyTorch issues for one step of tensor-parallel configurations (fake process
group, FakeTensorMode; `runtime.collective_trace.trace_step`): tiny-gpt and a tiny llama-like GQA
model, tp 2 and 4, with and without sequence parallelism, alone and under ZeRO over 4 / 8 ranks.

    .venv/bin/python -m tests.tp_trace_demo [--brief]
"""

from __future__ import annotations

import sys
from collections import Counter

from shardsim.config import RunConfig, Strategy
from shardsim.runtime.collective_trace import trace_step
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.library import PRESETS

MODELS = {
    "tiny-gpt": PRESETS["tiny-gpt"],
    "tiny-llama-gqa": Arch("llama", hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, seq_len=32, vocab=256),
}


def main(brief: bool) -> None:
    for name, arch in MODELS.items():
        for tp in (2, 4):
            if arch.kv % tp:
                print(f"\n# {name} tp {tp}: refused by the runtime (fewer key/value heads than tp)")
                continue
            for sp in (False, True):
                for kind, world in (("ddp", tp), ("zero", 4), ("zero", 8)):
                    if world <= tp and kind == "zero":
                        continue
                    cfg = RunConfig(
                        workload=arch,
                        strategy=Strategy(kind, tp=tp, sequence_parallel=sp),
                        batch_per_device=3,  # 96 tokens: the loss's all-reduces unlike the norms' (64)
                        checkpointing=False,
                        backend="gloo",
                    )
                    calls = trace_step(cfg, world)
                    label = "TP alone" if kind == "ddp" else f"TP + FSDP2 over {world // tp} ranks"
                    print(f"\n# {name} tp {tp} sp {sp} world {world}: {label}, {len(calls)} collectives")
                    if brief:
                        counts = Counter((c.phase, c.kind, c.numel, c.group_size, c.group) for c in calls)
                        for (ph, k, n, g, grp), m in sorted(counts.items()):
                            print(f"  {m:3d} x {ph:<8} {k:<14} numel {n:>8} group {g} ({grp})")
                    else:
                        for c in calls:
                            print(f"  {c}")


if __name__ == "__main__":
    main("--brief" in sys.argv)
