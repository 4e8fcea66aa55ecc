"""The fit `shardsim calibrate` makes: only the parameters the rows determine, each shrunk toward
its topology default, with an uncertainty that is always finite.

Parameters are fitted as u = log(x + shift) (`shift`: 0, or `SHIFT_SHARE` of the range for a
parameter whose bound is 0, so that 0 stays reachable). Two named choices set the strength:

- `PRIOR_SIGMA`: the prior on each u is normal around the default's u with this standard
  deviation (0.25: a default is believed within a factor 1.28 at one sigma);
- `ROW_ERROR`: the error of one row in log throughput the model is stated at (0.05: the
  kernel model's mean error on the A100 calibration table is 4.4 %, experiments/calibration).

The fit (`map_fit`) minimises sum((log ratio / ROW_ERROR)²) + sum(((u - u0) / PRIOR_SIGMA)²)
(a MAP estimate; `scipy.optimize.least_squares` with the prior as extra residuals).

Identifiability (`identify`): the Jacobian of the rows' log ratios with respect to u, at the
defaults, over `ROW_ERROR` (each column a parameter's information per unit of u). A direction
of it whose singular value is below 1 / PRIOR_SIGMA carries less information from the rows than
the prior holds: the parameter with the largest share of the weakest such direction is held at
its default, and the test is repeated on the rest until every direction passes. Held
parameters are not fitted and not written: the topology's figure applies.

Uncertainty: the posterior covariance of the fitted u, (JᵀJ / s² + I / PRIOR_SIGMA²)⁻¹ at the
optimum, where s² is the larger of ROW_ERROR² and the rows' mean squared residual (when there
are more rows than fitted parameters). A prediction's band propagates it through that
prediction's own sensitivity to u (`apply.prediction_band`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from shardsim.simulator.calibration.fit import DIFF_STEP, TOLERANCE, Row, ratios
from shardsim.simulator.calibration.parameters import Parameter, parameter
from shardsim.specs.hardware.topology import InstanceType

PRIOR_SIGMA = 0.25  # prior standard deviation of log(parameter) around its default
ROW_ERROR = 0.05  # stated error of one row in log throughput (the model's 4.4 % MAE on the A100 table)
SHIFT_SHARE = 0.01  # a parameter with a bound at 0 is fitted as log(x + this share of its range)
ID_STEP = 0.05  # the step in u of the Jacobian at the defaults (5 %: over the simulator's small kinks)


def shift(p: Parameter) -> float:
    """What `p` is offset by before its log (0 unless its lower bound is 0)."""
    return SHIFT_SHARE * (p.high - p.low) if p.low <= 0 else 0.0


def to_u(p: Parameter, x: float) -> float:
    return float(np.log(x + shift(p)))


def from_u(p: Parameter, u: float) -> float:
    return float(np.clip(np.exp(u) - shift(p), p.low, p.high))


@dataclass(frozen=True)
class Identified:
    """Which requested parameters the rows determine at the defaults, and why each other is held."""

    fitted: tuple[str, ...]
    held: dict[str, str]  # name → why it is held at its default
    singular: tuple[float, ...]  # the scaled Jacobian's singular values over the fitted set, largest first
    column: dict[str, float]  # each fitted parameter's column norm of the scaled Jacobian (its own information)
    informative: int  # rows whose prediction depends on a requested parameter


@dataclass(frozen=True)
class MapFit:
    """The fit: values of the fitted parameters, their defaults and bounds, the posterior covariance
    of their u (`names` order), standard errors of the values, what was held and why."""

    names: tuple[str, ...]
    values: dict[str, float]
    defaults: dict[str, float]
    bounds: dict[str, tuple[float, float]]
    covariance: np.ndarray
    stderr: dict[str, float]
    held: dict[str, str]
    singular: tuple[float, ...]
    column: dict[str, float]
    informative: int
    row_error: float  # the s used in the covariance
    evaluations: int
    shifts: dict[str, float] = field(default_factory=dict)
    jacobian: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # d log ratio / du at the fit, rows × names

    def parameters_sigma(self) -> np.ndarray:
        """Each row's one-sigma error in log throughput from the fitted parameters alone: sqrt(j Σ jᵀ)."""
        if not self.names:
            return np.zeros(len(self.jacobian))
        return np.sqrt(np.maximum(np.einsum("ri,ij,rj->r", self.jacobian, self.covariance, self.jacobian), 0.0))

    def at_bound(self, name: str) -> bool:
        (lo, hi), v = self.bounds[name], self.values[name]
        return min(v - lo, hi - v) <= 1e-3 * (hi - lo)


def _values(params: list[Parameter], u: np.ndarray) -> dict[str, float]:
    return {p.name: from_u(p, float(x)) for p, x in zip(params, u, strict=True)}


def jacobian(inst: InstanceType, rows: list[Row], params: list[Parameter], u0: np.ndarray) -> np.ndarray:
    """d log(ratio) / du of each row at `u0`, by a forward step of `ID_STEP` (backward at an upper bound)."""
    base = np.log(ratios(inst, rows, _values(params, u0)))
    cols = []
    for i, p in enumerate(params):
        step = ID_STEP if np.exp(u0[i] + ID_STEP) - shift(p) <= p.high else -ID_STEP
        u = u0.copy()
        u[i] += step
        cols.append((np.log(ratios(inst, rows, _values(params, u))) - base) / step)
    return np.array(cols).T if cols else np.zeros((len(rows), 0))


def select(jac: np.ndarray, names: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str], np.ndarray]:
    """The greedy rank test on the scaled Jacobian `jac` (rows × parameters, already over ROW_ERROR):
    (kept names, held name → why, singular values of the kept)."""
    keep = list(range(len(names)))
    held: dict[str, str] = {}
    threshold = 1 / PRIOR_SIGMA
    while keep:
        _, s, vt = np.linalg.svd(jac[:, keep], full_matrices=True)
        s_full = np.zeros(len(keep))
        s_full[: s.size] = s
        weakest = int(np.argmin(s_full))
        if s_full[weakest] >= threshold:
            return tuple(names[i] for i in keep), held, s_full
        share = np.abs(vt[weakest])
        drop = keep[int(np.argmax(share))]
        held[names[drop]] = (
            f"held at its default: the weakest direction of the scaled Jacobian, where it weighs most, has "
            f"singular value {s_full[weakest]:.2g}, below the prior's {threshold:.2g}"
            " (the rows say less than the prior)"
        )
        keep.remove(drop)
    return (), held, np.zeros(0)


def identify(inst: InstanceType, rows: list[Row], names: tuple[str, ...]) -> Identified:
    """The rank test at the defaults (see the module docstring)."""
    params = [parameter(n) for n in names]
    u0 = np.array([to_u(p, float(np.clip(p.read(inst), p.low, p.high))) for p in params])
    jac = jacobian(inst, rows, params, u0) / ROW_ERROR
    informative = int(np.count_nonzero(np.any(np.abs(jac) > 1e-9, axis=1)))
    fitted, held, s = select(jac, names)
    norms = {n: float(np.linalg.norm(jac[:, names.index(n)])) for n in fitted}
    return Identified(fitted, held, tuple(float(v) for v in s), norms, informative)


def map_fit(inst: InstanceType, rows: list[Row], names: tuple[str, ...], ident: Identified | None = None) -> MapFit:
    """Identify (unless given), then fit the determined parameters with the prior."""
    ident = ident or identify(inst, rows, names)
    fitted = ident.fitted
    params = [parameter(n) for n in fitted]
    defaults = {p.name: float(np.clip(p.read(inst), p.low, p.high)) for p in params}
    bounds = {p.name: (p.low, p.high) for p in params}
    shifts = {p.name: shift(p) for p in params}
    if not params:
        return MapFit((), {}, {}, {}, np.zeros((0, 0)), {}, ident.held, (), {}, ident.informative, ROW_ERROR, 0)
    u0 = np.array([to_u(p, defaults[p.name]) for p in params])
    lo = np.array([to_u(p, p.low) if p.low + shift(p) > 0 else -np.inf for p in params])
    hi = np.array([to_u(p, p.high) for p in params])

    def residuals(u: np.ndarray) -> np.ndarray:
        data = np.log(ratios(inst, rows, _values(params, u))) / ROW_ERROR
        return np.concatenate([data, (u - u0) / PRIOR_SIGMA])

    res = least_squares(residuals, u0, bounds=(lo, hi), diff_step=DIFF_STEP, ftol=TOLERANCE, xtol=TOLERANCE)
    n, k = len(rows), len(params)
    jd = res.jac[:n] * ROW_ERROR  # d log ratio / du
    data_res = res.fun[:n] * ROW_ERROR
    s2 = ROW_ERROR**2
    if n > k:
        s2 = max(s2, float(data_res @ data_res) / (n - k))
    cov = np.linalg.inv(jd.T @ jd / s2 + np.eye(k) / PRIOR_SIGMA**2)
    values = _values(params, res.x)
    stderr = {p.name: float((values[p.name] + shifts[p.name]) * np.sqrt(cov[i, i])) for i, p in enumerate(params)}
    return MapFit(
        names=fitted,
        values=values,
        defaults=defaults,
        bounds=bounds,
        covariance=cov,
        stderr=stderr,
        held=ident.held,
        singular=ident.singular,
        column=ident.column,
        informative=ident.informative,
        row_error=float(np.sqrt(s2)),
        evaluations=int(res.nfev),
        shifts=shifts,
        jacobian=jd,
    )


def cross_validated(inst: InstanceType, rows: list[Row], names: tuple[str, ...], k: int) -> np.ndarray:
    """Each row's ratio predicted by the whole procedure (identification and fit) on the other folds' rows."""
    from shardsim.simulator.calibration.fit import folds

    out = np.empty(len(rows))
    for held in folds(len(rows), k):
        drop = set(held.tolist())
        f = map_fit(inst, [m for i, m in enumerate(rows) if i not in drop], names)
        out[held] = ratios(inst, [rows[i] for i in held], f.values)
    return out
