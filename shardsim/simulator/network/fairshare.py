"""Max-min fair sharing on slowdown: progressive filling, in plain Python.

Every transfer i runs at x_i × its alone rate; on link l it then needs x_i × d_il bytes/s
(d_il: its demand at x = 1). All transfers rise together until a link is full; the
transfers through it freeze at that slowdown and the others keep rising on what is left,
up to x = 1 (alone). `fill` is that algorithm on one sub-problem; the network hands it only
the links that can bind (see network.py), so the lists are short and numpy would cost more
than it saves.
"""

from __future__ import annotations

from collections.abc import Sequence

TIGHT_REL = 1e-9  # links within this of the lowest level freeze in the same round (float ties)
# Yielding transfers (compute on a host's cores) keep at least this share of a link that the
# others fill: a process that is ready to compute still gets a time slice on a busy host.
MIN_YIELD_SHARE = 0.05


def fill(
    rows: Sequence[Sequence[tuple[int, float]]], cap: Sequence[float], yields: Sequence[bool] | None = None
) -> list[float]:
    """Slowdown x per transfer. rows[i]: (link, demand at x = 1) of transfer i, demands > 0;
    cap[link]: the link's capacity. Sums run in transfer order (the order of `rows`).

    `yields[i]`: transfer i takes only what the others leave (they are filled first; it gets
    at least MIN_YIELD_SHARE of each link's capacity): compute yields the host's cores to the
    kernel's and gloo's work of moving bytes, which runs in short bursts that the scheduler
    serves first."""
    if yields is None or not any(yields) or all(yields):
        return _fill(rows, cap)
    first = [i for i, y in enumerate(yields) if not y]
    then = [i for i, y in enumerate(yields) if y]
    x = [0.0] * len(rows)
    for i, xi in zip(first, _fill([rows[i] for i in first], cap), strict=True):
        x[i] = xi
    used: dict[int, float] = {}
    for i in first:
        for link, d in rows[i]:
            used[link] = used.get(link, 0.0) + x[i] * d
    left = {link: cap[link] for i in then for link, _ in rows[i]}
    for link, u in used.items():
        if link in left:
            left[link] = max(cap[link] - u, MIN_YIELD_SHARE * cap[link])
    for i, xi in zip(then, _fill([rows[i] for i in then], left), strict=True):
        x[i] = xi
    return x


def _fill(rows: Sequence[Sequence[tuple[int, float]]], cap: Sequence[float] | dict[int, float]) -> list[float]:
    cols: dict[int, list[tuple[int, float]]] = {}
    for i, row in enumerate(rows):
        for link, d in row:
            cols.setdefault(link, []).append((i, d))
    if len(cols) > len(rows):  # many links, few transfers: links with the same users and demands
        # (every port of one ring) always have the same level; one of each is enough
        first: dict[tuple, int] = {}
        for link, col in cols.items():
            first.setdefault((cap[link], *col), link)
        cols = {link: cols[link] for link in first.values()}
    n = len(rows)
    x = [0.0] * n
    frozen = [False] * n
    left = n
    while left:
        levels: dict[int, float] = {}
        for link, col in cols.items():
            used = free = 0.0
            for i, d in col:
                if frozen[i]:
                    used += x[i] * d
                else:
                    free += d
            if free > 0:
                levels[link] = (cap[link] - used) / free
        x_star = min(min(levels.values(), default=1.0), 1.0)
        for i in range(n):
            if not frozen[i]:
                x[i] = x_star
        if x_star >= 1.0:
            break
        bound = x_star * (1 + TIGHT_REL)
        for link, level in levels.items():
            if level <= bound:
                for i, _ in cols[link]:
                    if not frozen[i]:
                        frozen[i] = True
                        left -= 1
        cols = {link: cols[link] for link in levels}  # links with nobody left to fill: done
    return x
