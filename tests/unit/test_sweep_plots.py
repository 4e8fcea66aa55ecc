"""The sweep's plots read as the tables do: a text model's rates in tokens per GPU and $ per
million tokens; a configuration that does not fit is never drawn as if it did (left out of the
throughput and breakdown plots and counted, hatched and marked ✗ in the memory plot, whose axis
a huge bar does not flatten); a price is read where the topology has one; every label of the
cost panel inside its axis."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from shardsim.config import RunConfig
from shardsim.report.plots import (
    CLIP,
    breakdown_figure,
    memory_figure,
    plot_all,
    representative_rows,
    throughput_cost_figure,
)
from shardsim.sweep.search import sweep
from shardsim.sweep.space import SweepSpace

UNSIMULATED = ["step_time_s", "samples_per_s", "compute_s", "exposed_comm_s", "bubble_s", "optimizer_s", "mfu",
               "tokens_per_s_per_gpu", "cost_per_million_samples_usd", "cost_per_million_tokens_usd"]  # fmt: skip


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    """A text model's sweep on a priced topology (g4dn), two sizes."""
    cfg = RunConfig(workload="tiny-gpt", topology="g4dn.12xlarge", nodes=2)
    space = SweepSpace(strategies=("ddp", "zero", "zero2d"), nodes=(1, 2), tp_degrees=(1,))
    return sweep(cfg, space, workers=1).table


def unfit(df: pd.DataFrame, kind: str = "ddp", times: float = 50.0) -> pd.DataFrame:
    """`df` with its `kind` rows as a sweep gives a configuration that does not fit: `times` the
    device's memory, not simulated."""
    df = df.copy()
    rows = df["strategy_kind"] == kind
    df.loc[rows, "fits"] = False
    df.loc[rows, "memory_required_gib"] = df.loc[rows, "device_memory_gib"] * times
    df.loc[rows, UNSIMULATED] = float("nan")
    return df


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")) if t.get_text()]


def test_a_text_models_throughput_and_cost_are_in_tokens_per_gpu_and_per_million_tokens(table):
    fig = throughput_cost_figure(table)
    ax1, ax2 = fig.axes
    assert ax1.get_xlabel() == "tokens/s per GPU"
    assert ax2.get_xlabel() == "USD per million tokens (on-demand price)"
    widths = [p.get_width() for p in ax1.patches]  # bottom to top: the best at the top, over both sizes
    assert widths == pytest.approx(sorted(table["tokens_per_s_per_gpu"]))
    assert sorted(p.get_width() for p in ax2.patches) == pytest.approx(sorted(table["cost_per_million_tokens_usd"]))


def test_rows_that_do_not_fit_are_counted_not_drawn_and_a_price_is_read(table):
    df = unfit(table)
    fig = throughput_cost_figure(df)
    ax1, ax2 = fig.axes
    fitting = df[df["fits"]]
    labels = [t.get_text() for t in ax1.get_yticklabels()]
    assert len(labels) == len(fitting) and not any("ddp" in t for t in labels)
    counted = f"{(~df['fits']).sum()} of {len(df)} configurations do not fit in memory: not shown"
    assert counted in fig.get_suptitle()
    assert not any("unknown" in t for t in texts(fig))  # g4dn has a price: every drawn row has its cost
    low, high = ax2.get_ylim()
    assert all(low <= p.get_y() and p.get_y() + p.get_height() <= high for p in ax2.patches)


def test_a_row_without_a_price_says_so_inside_the_cost_panel(table):
    df = table.copy()
    df.loc[df.index[:1], "cost_per_million_tokens_usd"] = float("nan")  # a cluster whose topology has no price
    ax1, ax2 = throughput_cost_figure(df).axes
    notes = [t for t in ax2.texts if "unknown (no price)" in t.get_text()]
    low, high = ax2.get_ylim()
    assert len(notes) == 1 and low <= notes[0].get_position()[1] <= high


def test_the_breakdown_draws_the_rows_that_fit_and_counts_the_others(table):
    df = unfit(table)
    fig = breakdown_figure(df)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels and not any("✗" in t or t.startswith("ddp") for t in labels)
        assert "1 of these" in ax.get_title() and "do not fit in memory: not shown" in ax.get_title()


def test_a_huge_bar_does_not_flatten_the_memory_plot_and_its_total_is_written(table):
    df = unfit(table, times=100.0)
    fig = memory_figure(df)
    for ax, (_, g) in zip(fig.axes, df.groupby(["topology", "nodes"], sort=False), strict=False):
        limit = float(g["device_memory_gib"].iloc[0])
        assert ax.get_ylim()[1] == pytest.approx(CLIP * limit)
        huge = g[~g["fits"]]["memory_required_gib"].iloc[0]
        assert f"{huge:,.0f} GiB" in [t.get_text() for t in ax.texts]
        assert f"{limit:,.0f} GiB" in [t.get_text() for t in ax.texts]  # the device's line says its size
        marked = [t.get_text() for t in ax.get_xticklabels() if t.get_text().endswith("✗")]
        assert len(marked) == (~representative_rows(g)["fits"]).sum() == 1


def test_each_memory_bar_is_what_fits_compares(table):
    """A bar's top is the memory a configuration requires, so one that does not fit by a little
    is drawn above the device's line (its parts alone may be below it)."""
    df = unfit(table, times=1.1)
    fig = memory_figure(df)
    ax = fig.axes[0]
    g = representative_rows(df[(df["nodes"] == df["nodes"].iloc[0])])
    tops: dict[float, float] = {}
    for p in ax.patches:
        x = round(p.get_x() + p.get_width() / 2, 6)
        tops[x] = max(tops.get(x, 0.0), p.get_y() + p.get_height())
    assert [tops[x] for x in sorted(tops)] == pytest.approx(g["memory_required_gib"].tolist())
    assert not math.isnan(ax.get_ylim()[1])


def test_a_sweep_where_nothing_fits_says_so_in_every_plot(table, tmp_path):
    df = table
    for kind in df["strategy_kind"].unique():
        df = unfit(df, kind)
    for figure in (throughput_cost_figure, breakdown_figure):
        assert "no configuration fits in memory" in texts(figure(df))
    names = {p.name for p in plot_all(df, tmp_path)}
    assert {"breakdown.png", "memory.png", "throughput_cost.png", "scaling.png"} <= names


def test_the_breakdown_title_says_whether_its_rows_run_one_job() -> None:
    import pandas as pd

    from shardsim.report.plots import _one_job

    one = pd.DataFrame({"topology": ["p5", "p5"], "nodes": [1, 1], "global_batch": [64, 64]})
    assert _one_job(one) == "every layout at global batch 64"
    weak = pd.DataFrame({"topology": ["p5", "p5"], "nodes": [1, 2], "global_batch": [64, 128]})
    assert _one_job(weak) == "every layout of a cluster at that cluster's global batch"
    mixed = one.assign(global_batch=[64, 32])
    assert "differ" in _one_job(mixed)
