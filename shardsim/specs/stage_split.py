"""How a pipeline's layers split into its stages: as even as possible (`even_split`), a list
given one count a stage (`layers_per_stage`, "3,4,4,3"), or "auto" (`balanced_split`: the
split whose slowest stage is fastest, the embedding's time on the first stage and the head's
and loss's on the last)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Any

AUTO = "auto"


def layers_per_stage_text(v: Any) -> Any:
    """A configuration's layers_per_stage as its normal text: "auto", or counts joined by commas
    (a list of integers or their text). ValueError saying what is wrong."""
    if v is None or v == AUTO:
        return v
    items = v.split(",") if isinstance(v, str) else v if isinstance(v, list | tuple) else None
    if not items:
        raise ValueError(f"expected auto or layer counts separated by commas (3,4,4,3), got {v!r}")
    counts = []
    for x in items:
        try:
            n = int(x.strip()) if isinstance(x, str) else x if isinstance(x, int) and not isinstance(x, bool) else None
        except ValueError:
            n = None
        if n is None or n < 1:
            raise ValueError(f"expected layer counts of at least 1 each (3,4,4,3) or auto, got {v!r}")
        counts.append(n)
    return ",".join(map(str, counts))


def split_counts(text: str) -> list[int]:
    """The counts of a normal layers_per_stage text (not auto)."""
    return [int(x) for x in text.split(",")]


def split_refusal(text: str, stages: int, n_layers: int) -> str | None:
    """Why counts `text` do not split `n_layers` layers into `stages` stages (None: they do)."""
    counts = split_counts(text)
    if len(counts) != stages:
        return f"{len(counts)} layer counts for {stages} pipeline stages (pp x stages_per_rank)"
    if sum(counts) != n_layers:
        return f"the layer counts sum to {sum(counts)}, the model has {n_layers} layers"
    return None


def even_split(n_layers: int, stages: int) -> list[int]:
    """As even as possible, earlier stages taking the remainder (numpy.array_split)."""
    base, extra = divmod(n_layers, stages)
    return [base + (1 if s < extra else 0) for s in range(stages)]


def ranges(counts: Sequence[int]) -> list[tuple[int, int]]:
    """Layers [start, end) of each stage of `counts`."""
    ends = list(accumulate(counts))
    return [(e - c, e) for c, e in zip(counts, ends, strict=True)]


def balanced_split(layer_s: Sequence[float], first_s: float, last_s: float, stages: int) -> list[int]:
    """The split of layers (their seconds `layer_s`, forward + backward) into `stages` stages of at
    least one layer whose slowest stage, with `first_s` on the first and `last_s` on the last, is
    fastest (to a float's precision: a bisection over the stage time, each candidate packed
    greedily from the last stage, so later stages take as many layers as fit)."""
    n = len(layer_s)
    assert 1 <= stages <= n
    prefix = [0.0, *accumulate(layer_s)]

    def fits(limit: float) -> list[int] | None:
        """Stages from the last back, each as many layers as fit under `limit` (one at least),
        leaving one for every stage before."""
        counts, end = [], n
        for s in range(stages - 1, -1, -1):
            extra = (first_s if s == 0 else 0.0) + (last_s if s == stages - 1 else 0.0)
            if s == 0:
                start = 0
                if prefix[end] - prefix[start] + extra > limit:
                    return None
            else:
                start = end - 1
                while start - 1 >= s and prefix[end] - prefix[start - 1] + extra <= limit:
                    start -= 1
                if prefix[end] - prefix[start] + extra > limit:
                    return None
            counts.append(end - start)
            end = start
        return counts[::-1]

    lo, hi = 0.0, prefix[n] + first_s + last_s  # hi fits (one stage would take it all)
    for _ in range(100):  # bisect the least time every stage fits under, to a float's precision
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if fits(mid) is None else (lo, mid)
    found = fits(hi)
    assert found is not None
    return found
