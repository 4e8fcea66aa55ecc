"""Replay real PyTorch allocation traces through the caching-allocator model (`shardsim.simulator.allocator`).

A small transformer's training steps (Adam, two steps: the second runs in the pool the first
left) run on CPU under `torch.profiler.profile(profile_memory=True)`, which records every
allocation and free of the CPU allocator with its address, size and running total. Each trace is
turned into the allocator's events (a size, or `~i` to free allocation `i`) and replayed:

- the recorded peak (the profiler's largest "Total Allocated", less what was allocated before)
  must equal the replay's requested peak to the byte: the trace is replayed whole and in order;
- the replay's allocated peak is what a GPU's `max_memory_allocated` would report for the same
  tensors (512 B rounding, unsplit rests of blocks), its reserved peak `max_memory_reserved`
  (segments kept, split and cached), with and without expandable segments; the flat 5 % share the
  memory model used before is printed beside them.

Run: `.venv/bin/python experiments/readings/allocator_replay.py` (CPU, about a minute); the
reading is `allocator-replay.md`."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from shardsim.simulator.allocator import replay

MIB = 1 << 20
CASES = {  # name: (d_model, layers, batch, sequence)
    "d256-l4-b8-s128": (256, 4, 8, 128),
    "d512-l4-b4-s256": (512, 4, 4, 256),
    "d768-l6-b2-s512": (768, 6, 2, 512),
}


def train_trace(d: int, layers: int, batch: int, seq: int, steps: int = 2) -> tuple[list[int], int]:
    """The allocator's events of building a model and `steps` Adam steps, and the recorded peak."""
    torch.manual_seed(0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        layer = nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True)
        model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
        x = torch.randn(batch, seq, d)
        for _ in range(steps):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        data = json.loads(path.read_text())
    memory = sorted(
        (e for e in data["traceEvents"] if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
        key=lambda e: e["ts"],
    )
    events: list[int] = []
    live: dict[int, int] = {}  # address -> allocation id
    count = 0
    base = None
    peak = 0
    for e in memory:
        a = e["args"]
        size, addr, total = a["Bytes"], a["Addr"], a["Total Allocated"]
        if size > 0:
            live[addr] = count
            events.append(size)
            count += 1
        elif addr in live:
            events.append(~live.pop(addr))
        else:  # freed, but allocated before the profiler started: not the step's
            continue
        if base is None:
            base = total - size
        peak = max(peak, total - base)
    return events, peak


def main() -> int:
    rows = []
    for name, (d, layers, batch, seq) in CASES.items():
        events, recorded = train_trace(d, layers, batch, seq)
        r = replay(events)
        x = replay(events, expandable_segments=True)
        rows.append(
            f"| {name} | {sum(e >= 0 for e in events):,} | {recorded:,} | {r.requested_peak:,} | "
            f"{'yes' if r.requested_peak == recorded else 'NO'} | {r.allocated_peak / MIB:.2f} | "
            f"{r.reserved_peak / MIB:.2f} ({r.reserved_peak / r.allocated_peak - 1:+.1%}) | "
            f"{x.reserved_peak / MIB:.2f} ({x.reserved_peak / x.allocated_peak - 1:+.1%}) | "
            f"{recorded * 1.05 / MIB:.2f} |"
        )
    print(
        "| case | allocations | recorded peak (B) | replay's requested peak (B) | equal | "
        "allocated (MiB) | reserved (MiB, over allocated) | reserved, expandable | flat 5 % (MiB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0 if all("| yes |" in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
