"""The recommendation of a sweep: the sharded data-parallel degree and the configuration to use.

Never a configuration that does not fit in memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.config import DATA_PARALLEL
from shardsim.core.errors import ConfigError
from shardsim.simulator.sweep.rows import SETTING_COLUMNS, native

if TYPE_CHECKING:
    import pandas as pd


class Recommendation(dict):
    """`recommend()`'s answer: a dict (written as JSON as it is), whose main keys read as
    attributes too. A configuration it names (`best`, `runner_up`, `sdp`, `cheapest`, ...) is a
    dict of the row's columns (`topology`, `nodes`, `world`, `config`, `strategy`, `degree`,
    `step_time_s`, `samples_per_s`, `memory_per_rank_gib`, `fits`, ...), or None."""

    __slots__ = ()

    @property
    def sharded_data_parallel_degree(self) -> int | None:
        """The degree of the fastest fitting ddp (1) / zero (the world) / zero2d (d) row; None
        when none fits."""
        return self["sharded_data_parallel_degree"]

    @property
    def best(self) -> dict[str, Any] | None:
        """The fastest fitting configuration of any kind (pipelines included)."""
        return self["best"]

    @property
    def runner_up(self) -> dict[str, Any] | None:
        return self["runner_up"]

    @property
    def margin(self) -> float | None:
        """How much faster `best` is than `runner_up` (samples/s ratio - 1)."""
        return self["margin"]

    @property
    def reason(self) -> str:
        """Why nothing is recommended ("" when something is)."""
        return self["reason"]


def _summary(r: pd.Series | None) -> dict[str, Any] | None:
    """The columns of a row that a recommendation names, as plain Python (its settings too
    when the sweep listed them)."""
    if r is None:
        return None
    keys = (
        "topology",
        "nodes",
        "world",
        "config",
        "strategy",
        "degree",
        "pp",
        "microbatches",
        "schedule",
        "step_time_s",
        "samples_per_s",
        "memory_per_rank_gib",
        "fits",
        "cost_per_million_samples_usd",
    )
    keys += tuple(k for k in SETTING_COLUMNS if k in r.index)
    return {k: native(r[k]) for k in keys}


def _recommend_one(df: pd.DataFrame) -> dict[str, Any]:
    """The recommendation over the rows of `df`, whatever clusters they come from."""
    fit = df[df["fits"]].sort_values(
        ["samples_per_s", "memory_per_rank_gib"], ascending=[False, True], kind="mergesort"
    )
    if fit.empty:
        least = df.loc[df["memory_per_rank_gib"].idxmin()] if len(df) else None
        reason = "no configuration fits in memory"
        if least is not None:
            reason += (
                f" (the smallest, {least['config']}, needs {least['memory_per_rank_gib']:.1f} GiB per rank; "
                f"the device has {least['device_memory_gib']:g} GiB)"
            )
        return {
            "sharded_data_parallel_degree": None,
            "sdp": None,
            "best": None,
            "runner_up": None,
            "margin": None,
            "margin_over_sdp": None,
            "sdp_runner_up": None,
            "sdp_margin": None,
            "reason": reason,
        }
    best = fit.iloc[0]
    runner = fit.iloc[1] if len(fit) > 1 else None
    sdp = fit[fit["strategy"].isin(DATA_PARALLEL)]
    sdp_best = sdp.iloc[0] if len(sdp) else None
    sdp_runner = sdp.iloc[1] if len(sdp) > 1 else None

    def margin(a, b) -> float | None:
        return None if a is None or b is None else float(a["samples_per_s"] / b["samples_per_s"] - 1.0)

    return {
        "sharded_data_parallel_degree": None if sdp_best is None else int(sdp_best["degree"]),
        "sdp": _summary(sdp_best),
        "sdp_runner_up": _summary(sdp_runner),
        "sdp_margin": margin(sdp_best, sdp_runner),
        "best": _summary(best),
        "runner_up": _summary(runner),
        "margin": margin(best, runner),
        "margin_over_sdp": margin(best, sdp_best),  # best overall (a pipeline?) vs the best sdp row
        "reason": "",
    }


def recommend(df: pd.DataFrame) -> Recommendation:
    """What to use. Never a configuration that does not fit.

    sharded_data_parallel_degree: the degree of the fastest fitting ddp (1) / zero (world) /
    zero2d (d) row; best: the fastest fitting row of any kind; margin: how much faster the
    best is than the runner-up (samples/s ratio - 1). Over several clusters, the overall
    answer is by samples/s, `cheapest` by cost per million samples, and `clusters` holds the
    answer for each cluster."""
    if df.empty:
        raise ConfigError("empty sweep: nothing to recommend")
    out = _recommend_one(df)
    clusters = list(df.groupby(["topology", "nodes"], sort=False))
    if len(clusters) > 1:
        out["clusters"] = [
            {"topology": top, "nodes": int(nodes), "world": int(g["world"].iloc[0]), **_recommend_one(g)}
            for (top, nodes), g in clusters
        ]
    priced = df[df["fits"] & df["cost_per_million_samples_usd"].notna()]
    out["cheapest"] = (
        _summary(priced.sort_values("cost_per_million_samples_usd", kind="mergesort").iloc[0]) if len(priced) else None
    )
    return Recommendation(out)
