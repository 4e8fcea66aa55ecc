"""nccl-tests logs written for tests: sections laid out as nccl-tests 2.13 prints them (a
``# Collective test starting`` line where asked, the ``# nThread`` header, ``# Rank`` lines, the
result table and its closing lines), with made-up times (30 us + size / 50 GB/s) unless a row
gives its own."""

from __future__ import annotations

from dataclasses import dataclass

REDUCING = ("all_reduce", "reduce_scatter")
PER_RANK = ("all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Section:
    """One test binary's run: `op` over `ranks` ranks on `nodes` nodes, one row per size; `times`
    replaces the made-up time (text, as the row prints it) of the sizes it names."""

    op: str
    sizes: tuple[int, ...]
    ranks: int = 8
    nodes: int = 2
    starting: bool = True
    rank_lines: bool = True
    times: tuple[tuple[int, str], ...] = ()


def row(op: str, size: int, ranks: int, time: str | None = None) -> str:
    """A result row: out of place, then in place, with the size's count, redop and root."""
    t = float(time) if time is not None and _number(time) else 30 + size / 50e3
    count = size // 4 // (ranks if op in PER_RANK else 1)
    algbw = size / t / 1e3 if t > 0 else 0.0
    shown = time if time is not None else f"{t:.2f}"
    cells = f"{shown:>8} {algbw:7.2f} {algbw:7.2f}      0"
    redop = "sum" if op in REDUCING else "none"
    root = 0 if op == "broadcast" else -1
    return f"{size:12d} {count:12d}     float {redop:>7} {root:6d} {cells} {cells}"


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def section(s: Section) -> str:
    lines = [f"# Collective test starting: {s.op}_perf"] if s.starting else []
    lines += [
        f"# nThread 1 nGpus 1 minBytes {min(s.sizes, default=8)} maxBytes {max(s.sizes, default=8)} step: 2(factor)"
        " warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    if s.rank_lines:
        per = max(1, s.ranks // s.nodes)
        lines += [
            f"#  Rank {r:2d} Group  0 Pid {4100 + r:6d} on {f'node-{r // per}':>10} device {r % per:2d} [0x10] NVIDIA"
            for r in range(s.ranks)
        ]
    lines.append("#       size         count      type   redop    root     time   algbw   busbw #wrong     time ...")
    times = dict(s.times)
    lines += [row(s.op, size, s.ranks, times.get(size)) for size in s.sizes]
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 10.0", "#"]
    return "\n".join(lines) + "\n"


def log(*sections: Section) -> str:
    return "".join(section(s) for s in sections)


DOUBLING = tuple(1024 << k for k in range(0, 20, 2))  # 1 KiB to 256 MiB, every fourth doubling: 10 sizes
