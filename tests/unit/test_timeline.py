"""Interval arithmetic of a simulated timeline (`timeline`)."""

from __future__ import annotations

import random

from shardsim.simulator.timeline import subtract, union


def _subtract_reference(whole, cut):
    """Every piece of `whole` against every cut (quadratic): what `subtract` must equal."""
    out = []
    cut = union(cut)
    for a, b in union(whole):
        cur = a
        for c, d in cut:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out


def test_subtract_is_the_quadratic_scan():
    rnd = random.Random(7)
    for _ in range(3000):
        grid = [0.0, 1.0] + [rnd.random() for _ in range(rnd.randint(1, 10))]
        whole, cut = ([(rnd.choice(grid), rnd.choice(grid)) for _ in range(rnd.randint(0, 8))] for _ in range(2))
        assert subtract(whole, cut) == _subtract_reference(whole, cut)


def test_subtract_cut_spanning_pieces():
    assert subtract([(0, 1), (2, 3), (4, 5)], [(0.5, 4.5)]) == [(0, 0.5), (4.5, 5)]
    assert subtract([(0, 10)], [(1, 2), (3, 4), (-1, 0.5)]) == [(0.5, 1), (2, 3), (4, 10)]
