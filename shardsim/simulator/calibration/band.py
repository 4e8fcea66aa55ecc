"""A calibrated prediction's uncertainty, one sigma, as a relative figure: the parameters' share
(the posterior covariance of the fitted log-parameters, the calibration file's
``fit.covariance_log``, `prior`, propagated through this prediction's own sensitivity to them:
sqrt(gᵀ Σ g), g_i = d log(throughput) / d u_i by a forward step of `prior.ID_STEP` in u_i) and
the model's own error for the device and stack (`model_error`: the calibration file's
``fit.model_error``, `pooled_error`), added as independent errors (`model_error.total_sigma`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardsim.config import RunConfig
from shardsim.simulator.calibration.apply import Calibration, load_calibration
from shardsim.simulator.calibration.parameters import applied
from shardsim.simulator.calibration.prior import ID_STEP
from shardsim.simulator.model_error import ModelError, step_error, total_sigma

PSEUDO_ROWS = 5  # the stated error of the device and stack weighs as this many rows beside the fit's own


def pooled_error(stated: ModelError, residuals: np.ndarray, fitted: int) -> ModelError:
    """The model's error a calibration adds: the stated error of its device and stack
    (`model_error`) pooled with the rows' residuals after the fit (log ratios; `fitted`
    parameters spent), sqrt((k₀·σ² + Σr²) / (k₀ + n − p)) with k₀ `PSEUDO_ROWS`: a few rows
    keep the stated figure, many rows their own."""
    n = len(residuals)
    dof = max(n - fitted, 0)
    sigma = math.sqrt((PSEUDO_ROWS * stated.sigma**2 + float(residuals @ residuals)) / (PSEUDO_ROWS + dof))
    source = f"{stated.source}, pooled with the {n} rows' residuals ({PSEUDO_ROWS} : {dof} weight)"
    return ModelError(sigma, stated.measured, source, stated.stack)


@dataclass(frozen=True)
class Band:
    """The relative one-sigma band of a calibrated step time (``pct``, the total), its parts
    (``parameters_pct``; the model's error ``model``) and each fitted parameter's sensitivity
    (d log throughput / d log(value + shift))."""

    parameters_pct: float | None  # None: the calibration file carries no covariance (written before it did)
    model: ModelError
    sensitivity: dict[str, float]
    why: str = ""

    @property
    def pct(self) -> float:
        """The total band in percent: the parameters' share (0 where not determined) and the model's."""
        params = math.log1p((self.parameters_pct or 0.0) / 100)
        return 100 * math.expm1(total_sigma(params, self.model.sigma))

    def to_dict(self) -> dict:
        out = {"band_pct": self.pct, "parameters_pct": self.parameters_pct, "model_error": self.model.to_dict()}
        return out | {"sensitivity": self.sensitivity} | ({"note": self.why} if self.why else {})


def calibration_model_error(cal: Calibration, library: str) -> ModelError:
    """The model's error a calibration file states (``fit.model_error``) for a prediction with
    `library`; a file written before it did, or one fitted to another library's runs: the stated
    error of its device and `library` (`model_error.step_error`)."""
    saved = cal.fit.get("model_error") or {}
    if saved.get("library", library) == library and isinstance(saved.get("sigma_log"), int | float):
        stack = str(saved.get("stack") or cal.device)
        return ModelError(float(saved["sigma_log"]), bool(saved.get("measured")), str(saved.get("source")), stack)
    return step_error(cal.device, library)


def prediction_band(cfg: RunConfig, cal: Calibration | None = None) -> Band:
    """The band of `cfg`'s calibrated prediction (with ``cfg.calibration``, or `cal`)."""
    from shardsim.simulator.predict import predict
    from shardsim.specs.hardware.topology import Cluster, make_cluster

    cal = cal or load_calibration(cfg.calibration)
    fit = cal.fit
    model = calibration_model_error(cal, cfg.library)
    cov = fit.get("covariance_log")
    names = list((fit.get("fitted") or {}).keys())
    if cov is None or not names:
        why = "the parameters' share not determined: the calibration file has no covariance (written before it did)"
        return Band(None, model, {}, why)
    base = make_cluster(cfg.topology, cfg.nodes, cfg.gpus_per_node)
    plain = cfg.replace(calibration=None)
    values = cal.values
    # the step with the fitted values, as each moved one is made (a profile, if any, over them)
    step_time_s = predict(plain, cluster=Cluster(applied(base.instance, values), base.nodes)).step_time_s
    g: dict[str, float] = {}
    for name in names:
        shift = float(fit["fitted"][name].get("shift", 0.0))
        p = cal.parameters[name]
        up = math.exp(math.log(values[name] + shift) + ID_STEP) - shift
        step = ID_STEP
        if up > p.high:  # at the upper bound: step down
            up, step = math.exp(math.log(values[name] + shift) - ID_STEP) - shift, -ID_STEP
        moved = Cluster(applied(base.instance, values | {name: up}), base.nodes)
        t = predict(plain, cluster=moved).step_time_s
        g[name] = math.log(step_time_s / t) / step
    var = sum(g[a] * cov[i][j] * g[b] for i, a in enumerate(names) for j, b in enumerate(names))
    return Band(100 * math.expm1(math.sqrt(max(var, 0.0))), model, g)
