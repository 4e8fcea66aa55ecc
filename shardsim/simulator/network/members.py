"""Which of a node's GPUs each group of ranks holds: the set a communicator's search sees there."""

from __future__ import annotations

import numpy as np

MAX_MASK_GPUS = 52  # GPUs of a node whose mask a float64 sum holds exactly (its 53-bit mantissa)


def node_masks(groups: np.ndarray, node_gpus: int) -> tuple[np.ndarray, int]:
    """The local GPUs of every (row of `groups`, node) as bits, at index row × nodes + node, and
    nodes (the cluster's nodes the rows reach). `node_gpus` must be at most MAX_MASK_GPUS."""
    groups = np.asarray(groups, dtype=np.int64)
    rows = groups.shape[0]
    nodes = int(groups.max()) // node_gpus + 1 if groups.size else 1
    key = np.arange(rows)[:, None] * nodes + groups // node_gpus
    bits = np.left_shift(1, groups % node_gpus).astype(np.float64)  # a group holds a rank once: sum = or
    return np.bincount(key.ravel(), weights=bits.ravel(), minlength=rows * nodes).astype(np.int64), nodes


def local_sets(masks: np.ndarray, node_gpus: int) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The distinct sets among `masks` as local GPU indices, and each mask's index among them."""
    sets, inverse = np.unique(masks, return_inverse=True)
    return [tuple(g for g in range(node_gpus) if int(m) >> g & 1) for m in sets], inverse.ravel()
