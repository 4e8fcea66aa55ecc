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

RouteArrays = tuple[np.ndarray, np.ndarray]  # (links, bytes on each per byte sent): a route not yet a Route


def group_links(capacity: np.ndarray, routes: Sequence[Route | RouteArrays]) -> tuple[np.ndarray, list[Route]]:
    """(capacity of each group, each route over groups) for the links `routes` cross.

    A link's signature is its capacity, then the bytes each route puts on it (0 when it does
    not cross it); links of one signature form a group, numbered in the signatures' sorted
    order. A route is a Route or (links, bytes) arrays (links unique; a link with 0 bytes is
    not on it). Linear in the routes' lengths (vectorized): a collective over 16,384 ranks
    crosses some 10^5 links."""
    pairs = [_arrays(r) for r in routes]
    if not pairs or not any(len(links) for links, _ in pairs):
        return np.zeros(0), [Route((), ()) for _ in pairs]
    crossed = np.zeros(len(capacity), dtype=bool)
    for links, _ in pairs:
        crossed[links] = True
    used = np.flatnonzero(crossed)  # sorted
    position = np.zeros(len(capacity), dtype=np.int64)
    position[used] = np.arange(used.size)
    where = [position[links] for links, _ in pairs]  # each route's links as positions in `used`
    # partition refinement: links start grouped by capacity; each route splits every group by
    # the bytes it puts on the group's links (links off the route keep their label, which no
    # link on it shares afterwards), so in the end a label is a signature
    _, label = np.unique(capacity[used], return_inverse=True)
    label = label.astype(np.int64)
    fresh = int(label.max()) + 1
    for pos, (_, unit) in zip(where, pairs, strict=True):
        if pos.size:
            keys = label[pos]
            order = np.lexsort((unit, keys))
            k, u = keys[order], unit[order]
            starts = np.ones(k.size, dtype=bool)
            starts[1:] = (k[1:] != k[:-1]) | (u[1:] != u[:-1])
            new = np.empty_like(keys)
            new[order] = np.cumsum(starts) - 1 + fresh
            label[pos] = new
            fresh += int(starts.sum())
    # number the groups in the sorted order of their signatures
    _, group, inverse = np.unique(label, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    sig = np.zeros((group.size, len(pairs) + 1))
    sig[:, 0] = capacity[used[group]]
    for r, (pos, (_, unit)) in enumerate(zip(where, pairs, strict=True)):
        sig[inverse[pos], r + 1] = unit  # every link of a group carries the same bytes
    rank = np.empty(group.size, dtype=np.int64)
    rank[np.lexsort(sig.T[::-1])] = np.arange(group.size)
    caps = np.zeros(group.size)
    caps[rank] = sig[:, 0]
    out = []
    for pos, (_, unit) in zip(where, pairs, strict=True):
        groups, first = np.unique(rank[inverse[pos]], return_index=True)
        out.append(Route(tuple(groups.tolist()), tuple(unit[first].tolist())))
    return caps, out


def _arrays(route: Route | RouteArrays) -> RouteArrays:
    """A route's links (int64) and bytes (float64), links with no bytes left out."""
    links, unit = (route.links, route.unit) if isinstance(route, Route) else route
    links = np.asarray(links, dtype=np.int64).ravel()
    unit = np.asarray(unit, dtype=np.float64).ravel()
    keep = unit > 0
    return (links, unit) if keep.all() else (links[keep], unit[keep])
