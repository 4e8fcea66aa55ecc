"""Parsing and formatting of sizes, rates and durations."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from shardsim.core.errors import ConfigError

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
COMPACT_UP_TO = 99_999.5  # a figure from here on (or not finite) is given in scientific notation: 1.235e+05


def parse_size(text: str | int | float, *, field: str = "size") -> int:
    """Parse '1GiB', '25MB', '4096' into a positive whole number of bytes (exactly: '1.5KB' is
    1500; '1.5', 0.3KiB or 1.5 is refused, a byte being the smallest size)."""
    if isinstance(text, bool):
        raise ConfigError(f"expected a size such as 1GiB or 25MB, got {text!r}", field=field)
    if isinstance(text, (int, float)):
        number, unit = text, ""
    else:
        m = _SIZE_RE.match(str(text))
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise ConfigError(f"expected a size such as 1GiB or 25MB, got {text!r}", field=field)
        number, unit = m.group(1), m.group(2).lower()
    if not math.isfinite(float(number) * _SIZE_UNITS[unit]):
        raise ConfigError(f"expected a finite size, got {text!r}", field=field)
    exact = Fraction(number) * _SIZE_UNITS[unit]
    if exact <= 0:
        raise ConfigError(f"expected a size > 0, got {text!r}", field=field)
    if exact.denominator != 1:
        raise ConfigError(f"expected a whole number of bytes, got {text!r} ({float(exact):g} bytes)", field=field)
    return int(exact)


def is_whole_size(text: str) -> bool:
    """Whether `text`, a size as `parse_size` reads it, is a whole number of bytes (``0.5KiB`` is,
    ``1.5B`` is not); text that is no size is left to `parse_size` to name."""
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        return True
    return (Fraction(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]).denominator == 1


_BINARY = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def format_bytes(n: float) -> str:
    """Human form with binary units: 1.00 GiB (beyond 99999 TiB in scientific notation)."""
    for unit, scale in _BINARY:
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.3e} {unit}" if abs(value) >= COMPACT_UP_TO else f"{value:.2f} {unit}"
    return f"{n:.0f} B"


def format_count(x: float, unit: str = "") -> str:
    """A count with the decimal prefix that suits it, 4 significant digits: 334.1 M, 1.114 T
    (``unit`` appended: 3.110 GFLOP)."""
    if not math.isfinite(x):
        return f"{x} {unit}".rstrip()
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale * (1 - 5e-5):
            return f"{_four_digits(x / scale)} {prefix}{unit}"
    return f"{x:.0f} {unit}".rstrip()


def format_flops_rate(x: float) -> str:
    """FLOP/s with the prefix that suits: 1.500 TFLOP/s, 41.20 GFLOP/s."""
    return format_count(x, "FLOP/s")


def _four_digits(value: float) -> str:
    """`value` (its magnitude below 1000 in practice) to 4 significant digits, without exponent
    below `COMPACT_UP_TO` (99999 at most: five digits), in scientific notation from there on."""
    if not math.isfinite(value) or abs(value) >= COMPACT_UP_TO:
        return f"{value:.3e}" if math.isfinite(value) else str(value)
    decimals = max(0, 4 - len(str(int(abs(value)))))
    if decimals and abs(round(value, decimals)) >= 10 ** (4 - decimals):  # 99.996 → 100.0, not 100.00
        decimals -= 1
    return f"{value:.{decimals}f}"


_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))


def format_seconds(t: float) -> str:
    """A duration in the unit that suits its magnitude, to 4 significant digits: 2.064 s,
    575.6 ms, 12.30 µs, 1235 s; zero is ``0 s``, NaN ``-``; beyond 99999 s, or below what
    rounds to 0.000 ns, in scientific notation (1.235e+05 s). Every time shardsim prints goes
    through here."""
    if t != t:
        return "-"
    if t == 0:
        return "0 s"
    if abs(t) < 5e-13:
        return f"{t:.3e} s"
    # a unit is used from where its value would round to 1.000 (999.96 ms is 1.000 s)
    scale, unit = next(((f, u) for f, u in _TIME_UNITS if abs(t) >= f * (1 - 5e-5)), _TIME_UNITS[-1])
    return f"{_four_digits(t / scale)} {unit}"


def format_rate(x: float) -> str:
    """A rate per second as a figure that never rounds to zero: one decimal from 1 up (56.5),
    none from 1,000 up (12,346), 3 significant digits below 1 (0.0123), NaN ``-``."""
    if x != x:
        return "-"
    if abs(x) >= 999.95 and math.isfinite(x):
        return f"{x:,.0f}"
    if x == 0 or abs(x) >= 1:
        return f"{x:.1f}"
    return f"{x:.3g}" if abs(x) >= 1e-4 else f"{x:.2e}"


def format_rate_unit(x: float, unit: str) -> str:
    """A rate of `unit` per second as text with its unit: ``56.5 samples/s``; below 0.01 per
    second per hour (``13.0 samples/h``), which never prints as ``0.0``."""
    if x == x and 0 < abs(x) < 0.01:
        return f"{format_rate(x * 3600)} {unit}/h"
    return f"{format_rate(x)} {unit}/s"


def format_percent(x: float) -> str:
    """A fraction as a percentage that never rounds to zero: 38.3%, 0.0123%; NaN ``-``."""
    if x != x:
        return "-"
    pct = x * 100
    return f"{pct:.1f}%" if pct == 0 or abs(pct) >= 0.1 else f"{pct:.2g}%"


def format_usd(x: float | None) -> str:
    """Dollars to the cent, or to 2 significant digits below a cent ($0.0012), never ``$0.00``;
    None or NaN ``unknown``."""
    if x is None or x != x:
        return "unknown"
    if x == 0 or abs(x) >= 0.01:
        return f"${x:,.2f}"
    return f"${x:.2g}"
