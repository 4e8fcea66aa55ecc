"""The network's figures per NIC fabric (efa, infiniband, roce, ethernet) that NCCL's cost
model does not know: read from `fitted/network.yaml`, replaced by `shardsim calibrate`.

- `latency_inter_us`: NCCL's `latencyInter`, the latency a network plugin reports for one
  network hop, which NCCL's tuner adds to its own (InfiniBand-class) per-hop figures, twice
  for the Simple protocol (src/graph/tuning.cc, v2.20.3-1, lines 229-230).
- `size_factor`: the fraction of a NIC's rate that one collective call achieves by the bytes
  that NIC carries in the call, as points (bytes, fraction) interpolated linearly in
  log(bytes), flat below the first point, and rising from the last one to 1 at
  `FULL_RATE_BYTES`: a NIC moving a few KiB per call is dominated by its per-message costs (the
  proxy thread, the plugin, the NIC's completion path), one moving a GiB by its rate.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import Fields, load_yaml
from shardsim.data import TOPOLOGIES

NETWORK_FILE = "fitted/network.yaml"  # under the shipped topologies' folder
# A NIC that moves this much in one call runs at its topology's rate × nic.efficiency (an
# assumption: per-message costs are then a small share); the table's last point rises to it.
FULL_RATE_BYTES = float(1 << 30)
FIGURE_NAMES = ("latency_inter_us", "size_factor")


@dataclass(frozen=True)
class NetworkFigures:
    fabric: str
    latency_inter_us: float
    size_factor: tuple[tuple[float, float], ...]  # (bytes a NIC carries in one call, achieved fraction)

    @functools.cached_property
    def _points(self) -> tuple[np.ndarray, np.ndarray]:
        """log(bytes) and fractions, with the rise to 1 at FULL_RATE_BYTES."""
        pts = self.size_factor
        if pts[-1][0] < FULL_RATE_BYTES:
            pts = (*pts, (FULL_RATE_BYTES, 1.0))
        return np.log([b for b, _ in pts]), np.array([f for _, f in pts])

    def factors(self, nic_bytes: np.ndarray) -> np.ndarray:
        """The achieved fraction of the NIC's rate for calls that move `nic_bytes` through it:
        linear in log(bytes) between the points, flat beyond the ends."""
        x, f = self._points
        return np.interp(np.log(np.maximum(nic_bytes, 1e-300)), x, f)

    def factor(self, nic_bytes: float) -> float:
        """`factors` of one size."""
        return float(self.factors(np.array([nic_bytes]))[0])


def size_points(value: object, where: str, field: str) -> tuple[tuple[float, float], ...]:
    """A list of [bytes, fraction] pairs, bytes ascending and > 0, fractions in (0, 1]."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"expected a list of [bytes, fraction] pairs, got {value!r}", where=where, field=field)
    pts = []
    for i, pair in enumerate(value):
        ok = isinstance(pair, list) and len(pair) == 2
        ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)
        if not ok or not (pair[0] > 0 and 0 < pair[1] <= 1 and math.isfinite(pair[0])):
            raise ConfigError(
                f"expected [bytes > 0, fraction in (0, 1]], got {pair!r}", where=where, field=f"{field}[{i}]"
            )
        if pts and pair[0] <= pts[-1][0]:
            raise ConfigError("bytes must ascend", where=where, field=f"{field}[{i}]")
        pts.append((float(pair[0]), float(pair[1])))
    return tuple(pts)


def parse_figures(f: Fields, fabric: str) -> NetworkFigures:
    f.closed(FIGURE_NAMES)
    return NetworkFigures(
        fabric=fabric,
        latency_inter_us=f.number("latency_inter_us", minimum=0.0, strict=False),
        size_factor=size_points(f.raw("size_factor"), f.where, f"{f.prefix}size_factor"),
    )


@functools.cache
def _fitted() -> dict[str, tuple[NetworkFigures, dict[str, str]]]:
    where = f"topologies/{NETWORK_FILE}"
    top = Fields(load_yaml(TOPOLOGIES / NETWORK_FILE), where)
    out = {}
    for fabric in top.data:
        f = top.sub(fabric)
        out[fabric] = (parse_figures(f, fabric), {n: s for n in FIGURE_NAMES if (s := f.source(n))})
    return out


def fitted_network_figures(fabric: str) -> tuple[NetworkFigures, dict[str, str]]:
    """The shipped figures of `fabric` and their sources."""
    table = _fitted()
    if fabric not in table:
        raise ConfigError(f"no network figures for fabric {fabric!r} in topologies/{NETWORK_FILE}")
    return table[fabric]
