"""The scaling plot is readable: per cluster, samples/s and efficiency against the node count on
linear axes ticked at the node counts; its legend (one, below the panels) names exactly the lines
drawn, and "does not fit" only when a size that does not fit is marked."""

from __future__ import annotations

import pandas as pd

from shardsim.config import RunConfig
from shardsim.report.plots import scaling_figure
from shardsim.sweep.ranking import scaling_configs
from shardsim.sweep.search import sweep
from shardsim.sweep.space import SweepSpace

UNFIT = "does not fit in memory"


def _tiny() -> pd.DataFrame:
    cfg = RunConfig(workload="tiny-gpt", topology="g4dn.12xlarge", nodes=2)
    space = SweepSpace(strategies=("ddp", "zero"), nodes=(1, 2, 4), tp_degrees=(1,))
    return sweep(cfg, space, workers=1).table


def _check(df: pd.DataFrame) -> list[str]:
    fig = scaling_figure(df)
    tops = list(dict.fromkeys(df["topology"]))
    axes = fig.axes
    assert len(axes) == 2 * len(tops)
    for ax in axes:
        assert ax.get_xscale() == "linear" and ax.get_yscale() == "linear"
        assert ax.get_legend() is None  # no legend over the data
    for j, top in enumerate(tops):
        nodes = sorted(int(n) for n in df[df["topology"] == top]["nodes"].unique())
        for ax in (axes[j], axes[len(tops) + j]):
            assert [int(t) for t in ax.get_xticks()] == nodes
    (legend,) = fig.legends
    names = [t.get_text() for t in legend.get_texts()]
    fitting = {
        c
        for top in tops
        for c in scaling_configs(df[df["topology"] == top])
        if (df[(df["topology"] == top) & (df["label"] == c)]["fits"]).any()
    }
    assert set(names) - {UNFIT} - {n for n in names if n.startswith("ideal")} == fitting
    drawn_unfit = any(
        not df[(df["topology"] == top) & (df["label"] == c)]["fits"].all()
        for top in tops
        for c in scaling_configs(df[df["topology"] == top])
        if c in fitting
    )
    assert (UNFIT in names) == drawn_unfit
    return names


def test_a_sweep_where_everything_fits_has_no_entry_for_what_does_not():
    names = _check(_tiny())
    assert UNFIT not in names and {"ddp", "zero"} <= set(names)


def _study(workload: str, batch: int, nodes: tuple[int, ...]) -> pd.DataFrame:
    """ZeRO against ZeRO-2D on two clusters, as the MiCS studies of experiments/sweeps/ sweep them."""
    frames = []
    for topology, precision in (("p4d.24xlarge", "bf16"), ("p3dn.24xlarge", "fp16")):
        cfg = RunConfig(
            workload=workload, topology=topology, batch_per_device=batch, precision=precision, library="smp"
        )
        space = SweepSpace(strategies=("zero", "zero2d"), degrees=(8, 16), nodes=nodes, tp_degrees=(1,))
        frames.append(sweep(cfg, space, workers=1).table)
    return pd.concat(frames, ignore_index=True)


def test_two_clusters_where_everything_fits_plot_readably():
    df = _study("gpt-10b", 2, (1, 2, 4))
    assert df["fits"].all()
    assert UNFIT not in _check(df)


def test_two_clusters_where_the_small_sizes_do_not_fit_plot_readably():
    df = _study("gpt-100b", 1, (4, 8, 16))
    assert df["fits"].any() and not df["fits"].all()
    assert UNFIT in _check(df)
