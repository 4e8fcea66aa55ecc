"""The columns computed over a whole sweep table: the rank of each row within its cluster, and
the scaling efficiency of each configuration across cluster sizes; and which rows lead (what a
report draws, which the pruned search keeps exact)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardsim.specs.strategies import STRATEGIES as KINDS
from shardsim.sweep.faces import FACES
from shardsim.sweep.rows import SCALING_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

PIPELINES = [k for k, v in KINDS.items() if v.is_pipeline]  # the kinds whose rows are pipelines
MAX_BARS = 30  # the leading rows of a cluster a throughput plot draws
SCALING_LINES = 8  # the configurations a scaling plot or table shows


def rank(df: pd.DataFrame) -> pd.DataFrame:
    """Rank within each cluster by throughput: fitting configurations first by samples/s (the
    order of tokens/s per GPU too, a cluster's rows sharing their world and sequence; and of step
    time where they run one global batch, as a sweep's layouts do unless its batch axes mix
    them), then the ones that do not fit, by samples/s. Equal speed: less memory first (1F1B
    before GPipe when they tie), then the enumeration order."""
    df = df.copy()
    df["_order"] = range(len(df))
    df["_cluster"] = df.groupby(["topology", "nodes"], sort=False).ngroup()
    df = df.sort_values(
        ["_cluster", "fits", "samples_per_s", "memory_required_gib", "_order"],
        ascending=[True, False, False, True, True],
        kind="mergesort",
    )
    df["rank"] = df.groupby("_cluster").cumcount() + 1
    return df.drop(columns=["_order", "_cluster"]).reset_index(drop=True)


def scaling(df: pd.DataFrame, mode: str | None = None) -> pd.DataFrame:
    """Scaling efficiency of each configuration across cluster sizes, per topology.

    efficiency(N) = (samples/s at N GPUs / N) / (samples/s at N0 / N0), N0 the smallest
    world where that configuration was predicted; the ideal line is samples/s(N0) · N/N0.
    mode: "weak" (fixed batch per device) or "strong" (fixed global batch); None infers it
    (strong when every row of a topology has the same global batch and worlds differ)."""
    df = df.copy()
    for col in SCALING_COLUMNS:
        df[col] = None if col == "scaling_mode" else float("nan")
    for _, idx in df.groupby(["topology", "label"], sort=False).groups.items():
        g = df.loc[idx]
        base = g.loc[g["world"].idxmin()]
        n0, s0 = float(base["world"]), float(base["samples_per_s"])
        ideal = s0 * g["world"] / n0
        df.loc[idx, "scaling_base_gpus"] = n0
        df.loc[idx, "ideal_samples_per_s"] = ideal
        df.loc[idx, "scaling_efficiency"] = g["samples_per_s"] / ideal
    for idx in df.groupby("topology", sort=False).groups.values():
        g = df.loc[idx]
        m = mode
        if m is None:
            m = "strong" if g["global_batch"].nunique() == 1 and g["world"].nunique() > 1 else "weak"
        df.loc[idx, "scaling_mode"] = m
    return df


def scaling_configs(g: pd.DataFrame, limit: int = SCALING_LINES) -> list[str]:
    """Configurations of one topology present at two or more sizes: every plain ddp/zero/zero2d
    one (no tensor parallelism, the base settings: no suffix to its label), then the others
    (tensor-parallel or with other settings, and the pipelines) with the highest samples/s, up to
    `limit` lines: the lines of its scaling plot and table (`shardsim.report`)."""
    import pandas as pd

    counts = g.groupby("label", sort=False)["world"].nunique()
    multi = [c for c in counts.index if counts[c] > 1]
    first = g.drop_duplicates("label").set_index("label")
    tp = first["strategy_tp"] if "strategy_tp" in first else pd.Series(1, index=first.index)
    cp = first["strategy_cp"] if "strategy_cp" in first else pd.Series(1, index=first.index)

    def plain(c: str) -> bool:
        single = int(tp[c] or 1) == 1 and int(cp[c] or 1) == 1
        return first.loc[c, "strategy_kind"] not in PIPELINES and single and ", " not in c

    dp = sorted(
        (c for c in multi if plain(c)),
        key=lambda c: (FACES[first.loc[c, "strategy_kind"]].plot_order, int(first.loc[c, "strategy_degree"])),
    )
    others = (
        g[g["label"].isin([c for c in multi if not plain(c)])]
        .groupby("label", sort=False)["samples_per_s"]
        .max()
        .sort_values(ascending=False, kind="mergesort")
    )
    return (dp + list(others.index))[:limit] if len(dp) < limit else dp
