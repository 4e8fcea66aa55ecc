"""How often a band covers the truth: leave-one-group-out over measured rows, each held-out
group's rows predicted with the band a calibration on the other groups gives them.

Two sources (`experiments/readings/band-coverage.md` runs both):

- a calibration table (`linear_held_out`): a fit of the named parameters to the other groups'
  rows with `prior`'s row error and prior, in its linear form about the defaults (one
  Gauss-Newton step of `prior.map_fit` from them: the rows' log ratios at the defaults and their
  Jacobian in u, computed once), the fit's covariance and the model's error pooled from the other
  groups' residuals (`band.pooled_error`); each held-out row's band is sqrt(j Σ jᵀ + σ_model²);
- measured runs with predictions and no fit (`stated_held_out`): the band is the root mean square
  of the other groups' log errors.

`coverage` is the share of held-out rows whose |log(predicted / measured)| is within one band
and within two (a normal error: 68 % and 95 %).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardsim.simulator.calibration.band import pooled_error
from shardsim.simulator.calibration.prior import PRIOR_SIGMA, ROW_ERROR
from shardsim.simulator.model_error import ModelError


@dataclass(frozen=True)
class Coverage:
    """Held-out rows, groups, and the share of rows within one and two bands."""

    rows: int
    groups: int
    one_sigma: float
    two_sigma: float
    median_band: float  # of the held-out rows, in log throughput


def coverage(errors: np.ndarray, bands: np.ndarray, groups: Sequence[object]) -> Coverage:
    """The share of `errors` (log ratios) within one and two of their `bands`."""
    miss = np.abs(errors)
    return Coverage(
        len(errors), len(set(groups)), float(np.mean(miss <= bands)), float(np.mean(miss <= 2 * bands)),
        float(np.median(bands)),
    )  # fmt: skip


def linear_held_out(
    log_ratio: np.ndarray, jac: np.ndarray, groups: Sequence[object], stated: ModelError | None
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's log ratio after a fit to the other groups' rows, and its band (one sigma, log):
    `log_ratio` the rows' log(predicted / measured) at the defaults, `jac` d log ratio / du there
    (rows × parameters), `stated` the model's stated error for the device and stack (None: the
    parameters' share alone, the band before the model's error was added)."""
    labels = np.array([str(g) for g in groups])
    k = jac.shape[1]
    errors = np.empty(len(log_ratio))
    bands = np.empty(len(log_ratio))
    for g in dict.fromkeys(labels):
        held, train = labels == g, labels != g
        j, r0 = jac[train], log_ratio[train]
        a = j.T @ j / ROW_ERROR**2 + np.eye(k) / PRIOR_SIGMA**2
        du = -np.linalg.solve(a, j.T @ r0 / ROW_ERROR**2)
        resid = r0 + j @ du
        n = len(r0)
        s2 = max(ROW_ERROR**2, float(resid @ resid) / (n - k)) if n > k else ROW_ERROR**2
        cov = np.linalg.inv(j.T @ j / s2 + np.eye(k) / PRIOR_SIGMA**2)
        model = pooled_error(stated, resid, k).sigma if stated else 0.0
        jh = jac[held]
        errors[held] = log_ratio[held] + jh @ du
        bands[held] = np.sqrt(np.einsum("ri,ij,rj->r", jh, cov, jh) + model**2)
    return errors, bands


def stated_held_out(log_ratio: np.ndarray, groups: Sequence[object]) -> np.ndarray:
    """Each row's band (one sigma, log): the root mean square of the other groups' log ratios."""
    labels = np.array([str(g) for g in groups])
    bands = np.empty(len(log_ratio))
    for g in dict.fromkeys(labels):
        held = labels == g
        bands[held] = np.sqrt(np.mean(log_ratio[~held] ** 2))
    return bands
