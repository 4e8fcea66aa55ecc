"""The recommendation of a sweep: the sharded data-parallel degree and the configuration to use.

Never a configuration that does not fit in memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardsim.config import DATA_PARALLEL
from shardsim.core.errors import ConfigError
from shardsim.simulator.model_error import ModelError, step_error
from shardsim.simulator.results import KEY_COLUMNS, nest
from shardsim.sweep.rows import SETTING_COLUMNS, native

if TYPE_CHECKING:
    import pandas as pd


class Recommendation(dict):
    """`recommend()`'s answer: a dict (written as JSON as it is), whose main keys read as
    attributes too. A configuration it names (`best`, `runner_up`, `sdp`, `cheapest`, ...) is a
    dict of the row's columns (the result key's: `topology`, `nodes`, `world`, `label`,
    `strategy_kind`, `strategy_degree`, ...; `step_time_s`, `samples_per_s`, `memory_required_gib`,
    `fits`, ...: docs/results.md), or None."""

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
    """The columns of a row that a recommendation names, as plain Python: the key (its strategy
    one object, as in `--json` rows), the settings when the sweep listed them, the figures."""
    if r is None:
        return None
    keys = (
        *KEY_COLUMNS,
        "layout",
        *(k for k in SETTING_COLUMNS if k in r.index),
        "batch_per_device",
        "grad_accum",
        "global_batch",
        "seq_len",
        "step_time_s",
        "samples_per_s",
        "tokens_per_s_per_gpu",
        "mfu",
        "memory_allocated_gib",
        "memory_reserved_gib",
        "memory_required_gib",
        "fits",
        "cost_per_million_samples_usd",
        "cost_per_step_usd",
        "cost_per_million_tokens_usd",
    )
    out = nest({k: native(r[k]) for k in keys if k in r.index})
    tp, pp, shard = int(r["strategy_tp"]), int(r["strategy_pp"]), int(r["strategy_degree"])
    cp = int(r["strategy_cp"]) if "strategy_cp" in r.index else 1
    dp = int(r["world"]) // (tp * pp * cp)
    out["degrees"] = {"tp": tp, "pp": pp, "dp": dp, "shard": shard} | ({"cp": cp} if cp > 1 else {})
    # SageMaker model parallelism's keys for the layout (v2's hybrid_shard_degree: ranks a parameter is sharded over)
    out["sagemaker"] = {"tensor_parallel_degree": tp, "pipeline_parallel_degree": pp, "hybrid_shard_degree": shard}
    if cp > 1:  # v2's context_parallel_degree
        out["sagemaker"]["context_parallel_degree"] = cp
    return out


def _recommend_one(df: pd.DataFrame, error: ModelError) -> dict[str, Any]:
    """The recommendation over the rows of `df`, whatever clusters they come from."""
    fit = df[df["fits"]].sort_values(
        ["samples_per_s", "memory_required_gib"], ascending=[False, True], kind="mergesort"
    )
    if fit.empty:
        least = df.loc[df["memory_required_gib"].idxmin()] if len(df) else None
        reason = "no configuration fits in memory"
        if least is not None:
            reason += (
                f" (the smallest, {least['label']}, needs {least['memory_required_gib']:.1f} GiB per rank; "
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
            "margin_within_error": None,
            "reason": reason,
        }
    best = fit.iloc[0]
    runner = fit.iloc[1] if len(fit) > 1 else None
    sdp = fit[fit["strategy_kind"].isin(DATA_PARALLEL)]
    sdp_best = sdp.iloc[0] if len(sdp) else None
    sdp_runner = sdp.iloc[1] if len(sdp) > 1 else None

    def margin(a, b) -> float | None:
        return None if a is None or b is None else float(a["samples_per_s"] / b["samples_per_s"] - 1.0)

    return {
        "sharded_data_parallel_degree": None if sdp_best is None else int(sdp_best["strategy_degree"]),
        "sdp": _summary(sdp_best),
        "sdp_runner_up": _summary(sdp_runner),
        "sdp_margin": margin(sdp_best, sdp_runner),
        "best": _summary(best),
        "runner_up": _summary(runner),
        "margin": margin(best, runner),
        "margin_over_sdp": margin(best, sdp_best),  # best overall (a pipeline?) vs the best sdp row
        # the best's lead over the runner-up is inside the model's error on this device: a tie until measured
        "margin_within_error": None if runner is None else bool(margin(best, runner) < error.pct / 100),
        "reason": "",
    }


def sweep_error(df: pd.DataFrame, library: str) -> ModelError:
    """The model's error on the device of `df`'s rows (one cluster's, or the first) with `library`
    (`model_error.step_error`: measured here, or "not measured here" and the stated default)."""
    return step_error(str(df["device"].iloc[0]), library)


def recommend(df: pd.DataFrame, library: str = "pytorch") -> Recommendation:
    """What to use. Never a configuration that does not fit.

    sharded_data_parallel_degree: the degree of the fastest fitting ddp (1) / zero (world) /
    zero2d (d) row; best: the fastest fitting row of any kind; margin: how much faster the
    best is than the runner-up (samples/s ratio - 1), and `margin_within_error` whether that is
    inside the model's one-sigma error on the device with `library` (`model_error`, `sweep_error`:
    a tie until measured). Over several clusters, the overall
    answer is by samples/s, `cheapest` by cost per million samples, and `clusters` holds the
    answer for each cluster."""
    if df.empty:
        raise ConfigError("empty sweep: nothing to recommend")
    fit = df[df["fits"]]
    out = _recommend_one(df, sweep_error(fit if len(fit) else df, library))
    out["model_error"] = sweep_error(fit if len(fit) else df, library).to_dict()
    out["hint"] = None  # when nothing fits, what would (`sweep.hints`: the sweep sets it, knowing the configurations)
    clusters = list(df.groupby(["topology", "nodes"], sort=False))
    if len(clusters) > 1:
        out["clusters"] = [
            {"topology": top, "nodes": int(nodes), "world": int(g["world"].iloc[0])}
            | _recommend_one(g, sweep_error(g, library))
            for (top, nodes), g in clusters
        ]
    priced = df[df["fits"] & df["cost_per_million_samples_usd"].notna()]
    out["cheapest"] = (
        _summary(priced.sort_values("cost_per_million_samples_usd", kind="mergesort").iloc[0]) if len(priced) else None
    )
    return Recommendation(out)
