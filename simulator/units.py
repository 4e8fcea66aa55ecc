"""Parsing and formatting of sizes, rates and durations."""

from __future__ import annotations

import re

from shardsim.simulator.errors import ConfigError

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

GIB = 1024**3


def parse_size(text: str | int | float, *, field: str = "size") -> int:
    """Parse '1GiB', '25MB', '4096' into a positive number of bytes."""
    if isinstance(text, bool):
        raise ConfigError(f"expected a size such as 1GiB or 25MB, got {text!r}", field=field)
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        m = _SIZE_RE.match(str(text))
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise ConfigError(f"expected a size such as 1GiB or 25MB, got {text!r}", field=field)
        value, unit = float(m.group(1)), m.group(2).lower()
    size = int(round(value * _SIZE_UNITS[unit]))
    if size <= 0:
        raise ConfigError(f"expected a size > 0, got {text!r}", field=field)
    return size


def format_bytes(n: float) -> str:
    """Human form with binary units: 1.00 GiB."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def format_seconds(t: float) -> str:
    """Human form: 1.23 s, 4.56 ms, 7.89 us."""
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.2f} us"
