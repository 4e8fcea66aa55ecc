"""The band's coverage by leave-one-group-out: the A100 calibration table grouped by model size,
and the project's own measured runs (experiments/validation/**/validation.csv) grouped by the
run that measured them. Prints the markdown table of experiments/readings/band-coverage.md.

    python experiments/readings/band_coverage.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from shardsim.simulator.calibration import coverage as C
from shardsim.simulator.calibration import prior as P
from shardsim.simulator.calibration.fit import ratios
from shardsim.simulator.calibration.measurements import read_measurements
from shardsim.simulator.calibration.parameters import parameter
from shardsim.simulator.model_error import ModelError, step_error
from shardsim.specs.hardware.topology import load_instance

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "experiments" / "calibration" / "data" / "mpt-a100-40gb.csv"
TOPOLOGY = "a100-40gb-roce"
FITTED = ("matmul_efficiency.bf16", "attention_efficiency")  # what calibrate fits to the whole table
VALIDATION = ROOT / "experiments" / "validation"


def table_rows() -> tuple[np.ndarray, np.ndarray, list[str], ModelError]:
    """The A100 table's log ratios at the defaults, their Jacobian in u over `FITTED`, each row's
    model size, and the stated error of the A100 with PyTorch."""
    inst = load_instance(TOPOLOGY)
    rows = read_measurements(TABLE, TOPOLOGY, inst)
    params = [parameter(n) for n in FITTED]
    u0 = np.array([P.to_u(p, float(np.clip(p.read(inst), p.low, p.high))) for p in params])
    jac = P.jacobian(inst, rows, params, u0)
    return np.log(ratios(inst, rows, {})), jac, [m.info["model"] for m in rows], step_error(inst.device.model)


def validation_rows() -> tuple[np.ndarray, list[str]]:
    """log(predicted / measured) of every measured row under experiments/validation, and its run's folder."""
    frames = []
    for path in sorted(VALIDATION.glob("**/validation.csv")):
        d = pd.read_csv(path)
        frames.append(d[d["status"] == "ok"].assign(group=str(path.parent.relative_to(VALIDATION))))
    d = pd.concat(frames)
    return np.log(d["predicted_s"] / d["measured_s"]).to_numpy(), list(d["group"])


def main() -> int:
    log_ratio, jac, groups, stated = table_rows()
    errors, bands = C.linear_held_out(log_ratio, jac, groups, stated)
    without = C.linear_held_out(log_ratio, jac, groups, None)[1]  # the parameters' share alone
    v_errors, v_groups = validation_rows()
    v_bands = C.stated_held_out(v_errors, v_groups)
    lines = [
        "| rows (held out by group) | band | rows | groups | median band | within 1 sigma | within 2 sigma |",
        "|---|---|---|---|---|---|---|",
    ]
    table, runs = "A100 table, by model size", "experiments/validation, by run"
    for what, band, cov in (
        (table, "the fitted parameters' only (main)", C.coverage(errors, without, groups)),
        (table, "parameters + model error", C.coverage(errors, bands, groups)),
        (runs, "model error (the other runs' RMS)", C.coverage(v_errors, v_bands, v_groups)),
    ):
        lines.append(
            f"| {what} | {band} | {cov.rows} | {cov.groups} | ±{np.expm1(cov.median_band) * 100:.1f} % | "
            f"{cov.one_sigma:.1%} | {cov.two_sigma:.1%} |"
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
