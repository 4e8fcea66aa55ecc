"""Fitting the named parameters (`calibration.parameters`) to measurements, and checking the fit
by k-fold cross-validation.

The residual of a row is log(predicted / measured throughput): over- and under-prediction by the
same factor weigh the same. `scipy.optimize.least_squares` (trust-region reflective, within each
parameter's bounds) minimises their squares; its Jacobian comes from finite differences of whole
predictions (`DIFF_STEP`), each a simulated step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from shardsim.simulator.calibration.measurements import Measurement
from shardsim.simulator.calibration.parameters import DEFAULT_FIT, MATMUL, applied, parameter
from shardsim.simulator.errors import ConfigError
from shardsim.simulator.hardware.topology import Cluster, InstanceType
from shardsim.simulator.predict import StepPrediction, predict

DIFF_STEP = 1e-2  # relative finite-difference step: wide enough to step over the simulator's small kinks
TOLERANCE = 1e-4  # least_squares' ftol and xtol
SEED = 0  # of the fold assignment


@dataclass(frozen=True)
class Fit:
    values: dict[str, float]
    defaults: dict[str, float]
    bounds: dict[str, tuple[float, float]]
    stderr: dict[str, float]  # from the Jacobian at the optimum (inf where the rows do not determine it)
    evaluations: int


def fitted_names(
    inst: InstanceType, rows: list[Measurement], requested: tuple[str, ...] = DEFAULT_FIT
) -> tuple[tuple[str, ...], list[str]]:
    """The parameters to fit (``matmul_efficiency`` once per precision the rows use) and one note
    for each one left out because nothing in the rows or the topology depends on it."""
    names: list[str] = []
    notes: list[str] = []
    for name in requested:
        if name == MATMUL:
            names += [f"{MATMUL}.{p}" for p in sorted({m.cfg.precision for m in rows})]
            continue
        p = parameter(name)
        if p.needs in ("kernels", "ranks") and inst.device.kernels is None:
            notes.append(f"{name}: left out, {inst.name} has no kernel figures (device.kernels)")
        elif p.needs == "nodes" and all(m.nodes == 1 for m in rows):
            notes.append(f"{name}: left out, every row runs on one node")
        elif p.needs == "ranks" and all(m.nodes * inst.device.count == 1 for m in rows):
            notes.append(f"{name}: left out, every row runs on one rank")
        else:
            names.append(name)
    return tuple(dict.fromkeys(names)), notes


def predictions(inst: InstanceType, rows: list[Measurement], values: dict[str, float]) -> list[StepPrediction]:
    """Each row predicted on `inst` with `values` over its figures."""
    calibrated = applied(inst, values)
    out = []
    for m in rows:
        try:
            out.append(predict(m.cfg, workload=m.workload, cluster=Cluster(calibrated, m.nodes)))
        except ConfigError as err:
            raise ConfigError(err.message, where=m.label, field=err.field) from None
    return out


def ratios(inst: InstanceType, rows: list[Measurement], values: dict[str, float]) -> np.ndarray:
    """Predicted over measured throughput of each row."""
    return np.array([m.ratio(p) for m, p in zip(rows, predictions(inst, rows, values), strict=True)])


def fit(inst: InstanceType, rows: list[Measurement], names: tuple[str, ...]) -> Fit:
    """The values of `names` that minimise the rows' squared log errors, from the topology's figures."""
    params = [parameter(n) for n in names]
    lo = np.array([p.low for p in params])
    hi = np.array([p.high for p in params])
    x0 = np.clip([p.read(inst) for p in params], lo, hi)
    scale = np.maximum(np.abs(x0), 1e-2 * (hi - lo))

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(ratios(inst, rows, dict(zip(names, x.tolist(), strict=True))))

    res = least_squares(
        residuals, x0, bounds=(lo, hi), x_scale=scale, diff_step=DIFF_STEP, ftol=TOLERANCE, xtol=TOLERANCE
    )
    jtj = res.jac.T @ res.jac
    dof = max(1, len(rows) - len(names))
    var = 2 * res.cost / dof
    try:
        cov = np.linalg.inv(jtj) * var if np.linalg.cond(jtj) < 1e12 else None
    except np.linalg.LinAlgError:
        cov = None
    err = np.sqrt(np.diag(cov)) if cov is not None else np.full(len(names), np.inf)
    return Fit(
        values=dict(zip(names, res.x.tolist(), strict=True)),
        defaults=dict(zip(names, x0.tolist(), strict=True)),
        bounds={n: (p.low, p.high) for n, p in zip(names, params, strict=True)},
        stderr=dict(zip(names, err.tolist(), strict=True)),
        evaluations=int(res.nfev),
    )


def folds(n: int, k: int, seed: int = SEED) -> list[np.ndarray]:
    """`k` disjoint sets of row indices covering 0..n-1 (a seeded shuffle, split as evenly as can be)."""
    if not 2 <= k <= n:
        raise ConfigError(f"expected 2 <= folds <= {n} (the rows), got {k}", field="folds")
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(f) for f in np.array_split(order, k)]


def cross_validated(inst: InstanceType, rows: list[Measurement], names: tuple[str, ...], k: int) -> np.ndarray:
    """Each row's ratio predicted by a fit to the other folds' rows (row order)."""
    out = np.empty(len(rows))
    for held in folds(len(rows), k):
        keep = [m for i, m in enumerate(rows) if i not in set(held.tolist())]
        f = fit(inst, keep, names)
        out[held] = ratios(inst, [rows[i] for i in held], f.values)
    return out
