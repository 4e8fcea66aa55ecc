"""The types of the command line's numeric flags (argparse ``type=``): each reads its value
strictly and checks its bound as the flags are parsed, so that a bad value is one line, exit
status 2, before any work. The bounds themselves are named where they belong (`scale`, the
runtime's flags)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from shardsim.core.errors import ConfigError
from shardsim.core.units import format_bytes, is_whole_size, parse_size

_SHOWN = 40  # characters of a refused value repeated in its message


def _given(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "...")


@dataclass(frozen=True)
class Count:
    """An integer from `minimum` to `maximum` (ranks, layers, steps), written in digits."""

    maximum: int
    minimum: int = 1

    def expected(self) -> str:
        return f"an integer from {self.minimum:,} to {self.maximum:,}"

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not self.minimum <= value <= self.maximum:
            raise argparse.ArgumentTypeError(f"expected {self.expected()}, got {_given(text)}")
        return value


def list_items(text: str) -> list[str]:
    """The comma-separated items of a list flag's value, stripped; an empty one (``4,,8``, a
    trailing comma, nothing at all) is refused rather than dropped."""
    items = [x.strip() for x in text.split(",")]
    if empty := [i for i, x in enumerate(items, start=1) if not x]:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated values, none of them empty, got {_given(text)}: empty element (item {empty[0]})"
        )
    return items


@dataclass(frozen=True)
class CountList:
    """``2,4,8`` → (2, 4, 8): comma-separated `Count`s, duplicates dropped, order kept."""

    maximum: int
    minimum: int = 1

    def __call__(self, text: str) -> tuple[int, ...]:
        count = Count(self.maximum, self.minimum)
        items = list_items(text)
        try:
            values = tuple(count(x) for x in items)
        except argparse.ArgumentTypeError:
            values = ()
        if not values:
            expected = f"comma-separated integers from {self.minimum:,} to {self.maximum:,}"
            raise argparse.ArgumentTypeError(f"expected {expected}, got {_given(text)}")
        return tuple(dict.fromkeys(values))


@dataclass(frozen=True)
class Real:
    """A finite number above `minimum` (or from it, `inclusive`), at most `maximum` where given."""

    minimum: float = 0.0
    maximum: float | None = None
    inclusive: bool = False

    def expected(self) -> str:
        low = f"{'>=' if self.inclusive else '>'} {self.minimum:g}"
        return f"a finite number {low}" + (f" and <= {self.maximum:,g}" if self.maximum is not None else "")

    def __call__(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        above = value >= self.minimum if self.inclusive else value > self.minimum
        if not math.isfinite(value) or not above or (self.maximum is not None and value > self.maximum):
            raise argparse.ArgumentTypeError(f"expected {self.expected()}, got {_given(text)}")
        return value


@dataclass(frozen=True)
class Size:
    """A size in bytes with its unit (``1GiB``, ``25MB``, ``4096``), from 1 byte to `maximum`."""

    maximum: int

    def __call__(self, text: str) -> int:
        if not is_whole_size(text):
            raise argparse.ArgumentTypeError(f"expected a whole number of bytes, got {_given(text)}")
        try:
            value = parse_size(text)
        except ConfigError:
            value = 0
        if not 1 <= value <= self.maximum:
            raise argparse.ArgumentTypeError(
                f"expected a size such as 1GiB or 25MB, at most {format_bytes(self.maximum)}, got {_given(text)}"
            )
        return value


@dataclass(frozen=True)
class SizeSweep:
    """``8B:16GiB`` → 8, 16, 32, ... 16 GiB (doubling, both ends included), or a list ``1MiB,64MiB,1GiB``."""

    maximum: int
    most: int = 64  # sizes: doubling from 1 B to 1 TiB is 41

    def __call__(self, text: str) -> tuple[int, ...]:
        one = Size(self.maximum)
        if ":" in text:
            ends = text.split(":")
            if len(ends) != 2:
                raise argparse.ArgumentTypeError(f"expected FROM:TO such as 8B:16GiB, got {text!r}")
            low, high = one(ends[0]), one(ends[1])
            if low > high:
                raise argparse.ArgumentTypeError(f"expected FROM <= TO, got {text!r}")
            sizes = []
            while low <= high:
                sizes.append(low)
                low *= 2
        else:
            sizes = [one(x) for x in list_items(text)]
        if not sizes or len(sizes) > self.most:
            raise argparse.ArgumentTypeError(f"expected 1 to {self.most} sizes, got {len(sizes)} from {text!r}")
        return tuple(dict.fromkeys(sizes))
