"""Reading a simulated timeline: interval arithmetic and Chrome traces."""

from __future__ import annotations

import json
from pathlib import Path

from shardsim.core.files import atomic_write
from shardsim.simulator.engine import Span


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in union(intervals))


def subtract(whole: list[tuple[float, float]], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Parts of `whole` not covered by `cut`, in one pass over each: both made unions (sorted,
    disjoint), a cut that ends before a piece of `whole` starts ends before every later one does."""
    out = []
    cut = union(cut)
    j, n = 0, len(cut)
    for a, b in union(whole):
        while j < n and cut[j][1] <= a:
            j += 1
        cur, k = a, j
        while k < n and cut[k][0] < b:
            c, d = cut[k]
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def write_chrome_trace(path: str | Path, spans: list[Span], class_labels: list[str], meta: dict) -> None:
    """A Chrome trace (Perfetto / chrome://tracing): one process per rank class, one
    thread per stream; written atomically."""
    events: list[dict] = []
    streams: dict[tuple[int, str], int] = {}
    for rc, label in enumerate(class_labels):
        events.append({"ph": "M", "name": "process_name", "pid": rc, "args": {"name": label}})
    for s in spans:
        key = (s.rank_class, s.stream)
        if key not in streams:
            streams[key] = len([k for k in streams if k[0] == s.rank_class])
            events.append(
                {"ph": "M", "name": "thread_name", "pid": s.rank_class, "tid": streams[key], "args": {"name": s.stream}}
            )
        if s.end <= s.start:
            continue
        events.append(
            {
                "ph": "X",
                "name": s.name,
                "cat": f"{s.kind},{s.phase}",
                "pid": s.rank_class,
                "tid": streams[key],
                "ts": s.start * 1e6,
                "dur": (s.end - s.start) * 1e6,
            }
        )
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}
    atomic_write(path, json.dumps(doc))
