"""Calibration from three rows: fit `shardsim calibrate`'s procedure (identification, prior,
`simulator.calibration.prior`) to 3 rows of one model size of `data/mpt-a100-40gb.csv` and
predict every row of the other sizes, against the same topology's defaults.

    python experiments/calibration/three_rows.py [--out experiments/calibration]

The 3 rows, by a rule fixed before looking at the result: the size's rows on one node (8 GPUs:
what a user with a few runs has), ordered by sequence length, the shortest, the median and the
longest (`pick`). Every size with at least 9 rows is tried (125m … 13b); the held-out rows are
all rows of the other sizes (67–69 rows). A second rule (the one-node rows with the sequence
lengths nearest 2,048: `pick_near_2048`) is reported beside it: it was tried first.

Two starting points (`STARTS`):
- ``shipped``: a100-40gb-roce as shipped. Its training figures were fitted to all 78 rows of
  this table (`fit_defaults.py`), held-out rows included: its error on them is in-sample, a
  bar no fit to 3 rows is expected to pass.
- ``untrained``: the same topology with the training figures at their neutral values (both
  fractions 1, `rank_time_cv` 0: the kernel model before it saw this table): what a stack the
  defaults were not fitted to looks like to the model.
The figures are in `three_rows.md` (this script writes it with --out).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardsim.simulator.calibration import fit as F
from shardsim.simulator.calibration import prior as P
from shardsim.simulator.calibration.calibrate import default_params
from shardsim.simulator.calibration.measurements import Measurement, read_measurements
from shardsim.specs.hardware.topology import InstanceType, load_instance

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fit_defaults import CSV, TOPOLOGY, base_instance  # noqa: E402

SIZES = ("mpt-125m", "mpt-350m", "mpt-760m", "mpt-1b", "mpt-3b", "mpt-7b", "mpt-13b")  # >= 9 rows each
STARTS = {"shipped": lambda: load_instance(TOPOLOGY), "untrained": base_instance}


def _one_node(rows: list[Measurement], size: str) -> list[Measurement]:
    return sorted((m for m in rows if m.info["model"] == size and m.info["gpus"] == 8), key=lambda m: m.info["seq_len"])


def pick(rows: list[Measurement], size: str) -> list[Measurement]:
    """The rule: one node's rows of `size` by sequence length: shortest, median, longest."""
    one = _one_node(rows, size)
    return [one[0], one[len(one) // 2], one[-1]]


def pick_near_2048(rows: list[Measurement], size: str) -> list[Measurement]:
    """The other rule: one node's rows of `size` with the sequence lengths nearest 2,048 (log scale)."""
    return sorted(_one_node(rows, size), key=lambda m: abs(np.log2(m.info["seq_len"] / 2048)))[:3]


@dataclass(frozen=True)
class Trial:
    start: str
    size: str
    seq_lens: tuple[int, ...]
    held_out: int
    mae_defaults: float
    mae_fitted: float
    values: dict[str, float]
    held: tuple[str, ...]


def trial(
    inst: InstanceType, start: str, rows: list[Measurement], size: str, rule=pick, defaults: np.ndarray | None = None
) -> Trial:
    """Fit 3 rows of `size` (picked by `rule`) and score the other sizes' rows; `defaults`: every
    row's ratio at `inst`'s own figures, when already computed (the same for every size)."""
    mine = rule(rows, size)
    keep = np.array([m.info["model"] != size for m in rows])
    others = [m for m, k in zip(rows, keep, strict=True) if k]
    names, _ = F.fitted_names(inst, mine, default_params(True, False))
    f = P.map_fit(inst, mine, names)
    at_defaults = F.ratios(inst, others, {}) if defaults is None else defaults[keep]
    before = np.abs(at_defaults - 1).mean() * 100
    after = np.abs(F.ratios(inst, others, f.values) - 1).mean() * 100
    seqs = tuple(m.info["seq_len"] for m in mine)
    return Trial(start, size, seqs, len(others), float(before), float(after), f.values, tuple(f.held))


def run(rule=pick, sizes=SIZES, starts=tuple(STARTS), verbose: bool = False) -> list[Trial]:
    out = []
    for start in starts:
        inst = STARTS[start]()
        rows = read_measurements(CSV, TOPOLOGY, inst)
        defaults = F.ratios(inst, rows, {})  # every row at the start's figures, once for all sizes
        for size in sizes:
            out.append(trial(inst, start, rows, size, rule, defaults))
            if verbose:
                t = out[-1]
                print(f"{rule.__name__} {start} {size}: {t.mae_defaults:.1f} % -> {t.mae_fitted:.1f} %", flush=True)
    return out


def table(trials: list[Trial]) -> list[str]:
    lines = [
        "| start | size (3 rows: seq_len) | held-out rows | MAE defaults | MAE fitted | fitted values | held |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in trials:
        vals = ", ".join(f"{k} {v:.3g}" for k, v in t.values.items())
        lines.append(
            f"| {t.start} | {t.size} ({', '.join(map(str, t.seq_lens))}) | {t.held_out} | {t.mae_defaults:.1f} % "
            f"| **{t.mae_fitted:.1f} %** | {vals} | {', '.join(t.held)} |"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write three_rows.md here (default: print only)")
    ns = ap.parse_args()
    t0 = time.process_time()
    rule, other = run(pick, verbose=True), run(pick_near_2048, verbose=True)
    text = [
        "# Calibration from three rows (`three_rows.py`)",
        "",
        f"Mean absolute error of tokens/s per GPU on the held-out rows (the other sizes), {CSV.name}. Prior: "
        f"log(parameter) ~ default ± {P.PRIOR_SIGMA}, row error {P.ROW_ERROR} (`simulator/calibration/prior.py`).",
        "",
        "## Rule: one node, the shortest, median and longest sequence",
        "",
        *table(rule),
        "",
        "## Other rule: one node, the sequence lengths nearest 2,048",
        "",
        *table(other),
        "",
        f"({time.process_time() - t0:.0f} CPU-seconds)",
    ]
    print("\n".join(text))
    if ns.out:
        (ns.out / "three_rows.md").write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
