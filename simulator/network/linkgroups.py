"""Links that always carry the same load, merged into one resource before simulating.

Links crossed by the same routes, with the same bytes per byte sent on each and the same
capacity, carry the same load at every instant (every port of one ring, every NIC of one
layer of nodes): as constraints of the max-min allocation they are copies of each other.
Keeping one of each gives the same allocation, and a collective over thousands of ranks
becomes a transfer over a handful of resources.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardsim.simulator.network.fluid import Route


def group_links(capacity: np.ndarray, routes: Sequence[Route]) -> tuple[np.ndarray, list[Route]]:
    """(capacity of each group, each route over groups) for the links `routes` cross.

    A link's signature is its capacity, then the bytes each route puts on it (0 when it does
    not cross it); links of one signature form a group, numbered in the signatures' sorted
    order. In plain Python: the routes are short lists (a few links after the ring edges'
    merging) and numpy's row-wise unique cost more than the whole simulation of big plans."""
    cap = capacity.tolist()
    n = len(routes)
    sig: dict[int, list[float]] = {}  # used link -> [capacity, bytes on route 0, 1, ...]
    for r, route in enumerate(routes):
        for link, u in zip(route.links, route.unit, strict=True):
            s = sig.get(link)
            if s is None:
                s = sig[link] = [cap[link]] + [0.0] * n
            s[r + 1] = u
    keys = {link: tuple(s) for link, s in sig.items()}
    order = {k: i for i, k in enumerate(sorted(set(keys.values())))}
    gid = {link: order[k] for link, k in keys.items()}
    caps = np.array([k[0] for k in order], dtype=float)
    out = []
    for route in routes:
        first: dict[int, float] = {}
        for link, u in zip(route.links, route.unit, strict=True):
            first.setdefault(gid[link], u)  # every link of a group carries the same bytes
        groups = sorted(first)
        out.append(Route(tuple(groups), tuple(first[g] for g in groups)))
    return caps, out
