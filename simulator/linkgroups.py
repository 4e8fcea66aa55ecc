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

from simulator.network import Route


def group_links(capacity: np.ndarray, routes: Sequence[Route]) -> tuple[np.ndarray, list[Route]]:
    """(capacity of each group, each route over groups) for the links `routes` cross.

    Refines the links class by class: first by capacity, then, route after route, by the
    bytes that route puts on them (0 when it does not cross them); vectorized, one pass per
    route."""
    arrays = [(np.asarray(r.links, dtype=np.int64), np.asarray(r.unit, dtype=float)) for r in routes]
    if not arrays:
        return np.zeros(0), []
    used = np.unique(np.concatenate([links for links, _ in arrays]))
    caps_used = capacity[used]
    gid = np.unique(caps_used, return_inverse=True)[1].ravel()
    for links, unit in arrays:
        col = np.zeros(used.size)
        col[np.searchsorted(used, links)] = unit
        gid = np.unique(np.column_stack([gid, col]), axis=0, return_inverse=True)[1].ravel()
    caps = np.zeros(int(gid.max()) + 1)
    caps[gid] = caps_used
    out = []
    for links, unit in arrays:
        groups, first = np.unique(gid[np.searchsorted(used, links)], return_index=True)
        out.append(Route.of(groups, unit[first]))
    return caps, out
