"""A calibrated prediction's uncertainty: the posterior covariance of the fitted log-parameters
(the calibration file's ``fit.covariance_log``, `prior`) propagated through this prediction's
own sensitivity to them: band = sqrt(gᵀ Σ g), g_i = d log(throughput) / d u_i by a forward step
of `prior.ID_STEP` in u_i. It is the parameters' share of the error only (one sigma, as a
relative figure); the model's own error per configuration (`prior.ROW_ERROR`) comes on top."""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardsim.config import RunConfig
from shardsim.simulator.calibration.apply import Calibration, load_calibration
from shardsim.simulator.calibration.parameters import applied
from shardsim.simulator.calibration.prior import ID_STEP


@dataclass(frozen=True)
class Band:
    """The relative one-sigma band of a calibrated step time (``pct``), and each fitted parameter's
    sensitivity (d log throughput / d log(value + shift))."""

    pct: float | None  # None: the calibration file carries no covariance (written before it did)
    sensitivity: dict[str, float]
    why: str = ""

    def to_dict(self) -> dict:
        return {"band_pct": self.pct, "sensitivity": self.sensitivity} | ({"note": self.why} if self.why else {})


def prediction_band(cfg: RunConfig, cal: Calibration | None = None) -> Band:
    """The band of `cfg`'s calibrated prediction (with ``cfg.calibration``, or `cal`)."""
    from shardsim.simulator.predict import predict
    from shardsim.specs.hardware.topology import Cluster, make_cluster

    cal = cal or load_calibration(cfg.calibration)
    fit = cal.fit
    cov = fit.get("covariance_log")
    names = list((fit.get("fitted") or {}).keys())
    if cov is None or not names:
        return Band(None, {}, "not determined: the calibration file has no covariance (written before it did)")
    base = make_cluster(cfg.topology, cfg.nodes)
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
    return Band(100 * math.sqrt(max(var, 0.0)), g)
