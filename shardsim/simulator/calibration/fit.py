"""Fitting the named parameters (`calibration.parameters`) to measurements, and checking the fit
by k-fold cross-validation.

The residual of a row is log(predicted / measured throughput): over- and under-prediction by the
same factor weigh the same. `scipy.optimize.least_squares` (trust-region reflective, within each
parameter's bounds) minimises their squares; its Jacobian comes from finite differences of whole
predictions (`DIFF_STEP`), each a simulated step.

A fit is one to write (`untrusted` says why not) when the rows determine it: more rows depend on
the parameters than there are parameters (else it passes through every row and says nothing of
its error), and the Jacobian at the solution, each column over its parameter's range, has full
rank (`RCOND`; else a parameter or a combination of them has an infinite standard error); and
when it does not end with a parameter at its bound while missing the rows by more than
`MAX_MAE_AT_BOUND_PCT` on average (the rows ask for more than the figure can give: other
units, another device or topology).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from shardsim.core.errors import ConfigError
from shardsim.simulator.calibration.collectives import CollectiveRow
from shardsim.simulator.calibration.measurements import Measurement
from shardsim.simulator.calibration.parameters import DEFAULT_FIT, MATMUL, MAX_MAE_AT_BOUND_PCT, applied, parameter
from shardsim.simulator.predict import StepPrediction, predict
from shardsim.specs.hardware.topology import Cluster, InstanceType

DIFF_STEP = 1e-2  # relative finite-difference step: wide enough to step over the simulator's small kinks
TOLERANCE = 1e-4  # least_squares' ftol and xtol
SEED = 0  # of the fold assignment
RCOND = 1e-6  # a singular value of the range-scaled Jacobian below this fraction of its largest: rank-deficient
NULL_SHARE = 0.1  # a parameter with this much of a rank-deficient direction is among those not determined
BOUND_SHARE = 1e-3  # a value within this fraction of its range from a bound is at that bound


Row = Measurement | CollectiveRow  # a measured run's step, or one size of a measured collective


@dataclass(frozen=True)
class Fit:
    values: dict[str, float]
    defaults: dict[str, float]
    bounds: dict[str, tuple[float, float]]
    stderr: dict[str, float]  # from the Jacobian at the optimum (inf where the rows do not determine it)
    evaluations: int
    informative: int  # rows whose prediction depends on a fitted parameter
    undetermined: tuple[str, ...] = ()  # parameters in a direction the Jacobian at the optimum does not see

    def at_bound(self, name: str) -> bool:
        """Whether parameter `name` ended on one of its bounds (within `BOUND_SHARE` of its range)."""
        (lo, hi), v = self.bounds[name], self.values[name]
        return min(v - lo, hi - v) <= BOUND_SHARE * (hi - lo)


def fitted_names(
    inst: InstanceType, rows: list[Row], requested: tuple[str, ...] = DEFAULT_FIT
) -> tuple[tuple[str, ...], list[str]]:
    """The parameters to fit (``matmul_efficiency`` once per precision the runs use) and one note
    for each one left out because nothing in the rows or the topology depends on it (a compute
    figure without measured runs: a collective row depends on the network's figures only)."""
    runs = [m for m in rows if isinstance(m, Measurement)]
    names: list[str] = []
    notes: list[str] = []
    no_runs = "left out, no measured runs (collective rows depend on the network figures only)"
    for name in requested:
        if name == MATMUL:
            names += [f"{MATMUL}.{p}" for p in sorted({m.cfg.precision for m in runs})]
            if not runs:
                notes.append(f"{name}: {no_runs}")
            continue
        if name.startswith(MATMUL + ".") and name.split(".", 1)[1] not in inst.device.matmul_efficiency:
            known = ", ".join(f"{MATMUL}.{p}" for p in inst.device.matmul_efficiency)
            raise ConfigError(f"{inst.name} has no {name}; expected one of {known}", field="params")
        p = parameter(name)
        if p.needs != "nodes" and not runs:  # every figure but the network's is a compute one
            notes.append(f"{name}: {no_runs}")
        elif p.needs in ("kernels", "ranks") and inst.device.kernels is None:
            notes.append(f"{name}: left out, {inst.name} has no kernel figures (device.kernels)")
        elif p.needs == "nodes" and all(m.nodes == 1 for m in rows):
            notes.append(f"{name}: left out, every row runs on one node")
        elif p.needs == "ranks" and all((m.world or m.nodes * inst.device.count) == 1 for m in runs):
            notes.append(f"{name}: left out, every row runs on one rank")
        else:
            names.append(name)
    return tuple(dict.fromkeys(names)), notes


def predictions(inst: InstanceType, rows: list[Measurement], values: dict[str, float]) -> list[StepPrediction]:
    """Each row predicted on `inst` (or the row's own instance: another topology of the device, part
    of a node) with `values` over its figures."""
    calibrated = applied(inst, values)
    out = []
    for m in rows:
        # a row on `inst`'s own nodes (its topology, every device) is predicted on `inst` as given
        # (compare.py's roofline passes a copy without kernel figures); another topology or part of
        # a node on the row's own instance
        whole = m.instance is None or (m.instance.name == inst.name and m.instance.device.count == inst.device.count)
        own = calibrated if whole else applied(m.instance, values)
        try:
            out.append(predict(m.cfg, workload=m.workload, cluster=Cluster(own, m.nodes)))
        except ConfigError as err:
            raise ConfigError(err.message, where=m.label, field=err.field) from None
    return out


def ratios(inst: InstanceType, rows: list[Row], values: dict[str, float]) -> np.ndarray:
    """Predicted over measured throughput of each row (a run's step, or a collective's size)."""
    runs = [m for m in rows if isinstance(m, Measurement)]
    calibrated = applied(inst, values)
    of_run = iter(m.ratio(p) for m, p in zip(runs, predictions(inst, runs, values), strict=True))
    return np.array([next(of_run) if isinstance(m, Measurement) else m.ratio_on(calibrated) for m in rows])


def fit(inst: InstanceType, rows: list[Row], names: tuple[str, ...]) -> Fit:
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
    informative, undetermined, err = _uncertainty(res.jac * (hi - lo), 2 * res.cost, names)
    return Fit(
        values=dict(zip(names, res.x.tolist(), strict=True)),
        defaults=dict(zip(names, x0.tolist(), strict=True)),
        bounds={n: (p.low, p.high) for n, p in zip(names, params, strict=True)},
        stderr=dict(zip(names, (err * (hi - lo)).tolist(), strict=True)),
        evaluations=int(res.nfev),
        informative=informative,
        undetermined=undetermined,
    )


def _uncertainty(jac: np.ndarray, sse: float, names: tuple[str, ...]) -> tuple[int, tuple[str, ...], np.ndarray]:
    """(rows that depend on a parameter, parameters the rows do not determine, standard errors)
    of a fit whose Jacobian, each column over its parameter's range, is `jac` and whose sum of
    squared residuals is `sse`; errors in those range units, inf where not determined or where
    no row is left to estimate them."""
    rows, p = jac.shape
    informative = int(np.count_nonzero(np.any(jac != 0, axis=1)))
    _, s, vt = np.linalg.svd(jac)
    rank = int(np.count_nonzero(s > RCOND * s.max())) if s.size and s.max() > 0 else 0
    null = vt[rank:]  # directions of the parameters that no row sees
    undetermined = tuple(n for i, n in enumerate(names) if null.size and np.abs(null[:, i]).max() >= NULL_SHARE)
    if undetermined or informative <= p:
        return informative, undetermined, np.full(p, np.inf)
    cov = (vt.T / s**2) @ vt * (sse / (rows - p))
    return informative, undetermined, np.sqrt(np.diag(cov))


def folds(n: int, k: int, seed: int = SEED) -> list[np.ndarray]:
    """`k` disjoint sets of row indices covering 0..n-1 (a seeded shuffle, split as evenly as can be)."""
    if not 2 <= k <= n:
        raise ConfigError(f"expected 2 <= folds <= {n} (the rows), got {k}", field="folds")
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(f) for f in np.array_split(order, k)]


def cross_validated(inst: InstanceType, rows: list[Row], names: tuple[str, ...], k: int) -> np.ndarray:
    """Each row's ratio predicted by a fit to the other folds' rows (row order)."""
    out = np.empty(len(rows))
    for held in folds(len(rows), k):
        keep = [m for i, m in enumerate(rows) if i not in set(held.tolist())]
        f = fit(inst, keep, names)
        out[held] = ratios(inst, [rows[i] for i in held], f.values)
    return out


def untrusted(f: Fit, mae_pct: float) -> str | None:
    """Why the fit `f`, missing the rows by `mae_pct` on average after it, is not one to write
    (see the module docstring), with what to do; None when it is."""
    p = len(f.values)
    if f.informative <= p:
        return (
            f"{f.informative} row(s) depend on the {p} fitted parameter(s): the fit needs more such rows than "
            "parameters to determine them and estimate its error; measure more configurations or fit fewer (--params)"
        )
    if f.undetermined:
        return (
            f"the rows do not determine {', '.join(f.undetermined)} (a rank-deficient Jacobian at the solution: "
            "infinite standard error); measure configurations that depend on them or leave them out (--params)"
        )
    bound = [n for n in f.values if f.at_bound(n)]
    if bound and mae_pct > MAX_MAE_AT_BOUND_PCT:
        return (
            f"{', '.join(bound)} ended at a bound and the fit still misses the rows by {mae_pct:,.0f} % on average "
            f"(more than {MAX_MAE_AT_BOUND_PCT:g} %): the rows ask for what the model cannot give; check the "
            "measurements' units and that they ran on this topology's device"
        )
    return None
