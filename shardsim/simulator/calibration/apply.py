"""A calibration file: fitted values of the model's parameters (`calibration.parameters`) for one
device, what they were fitted to and how well; read back and applied over a topology's figures
(``--calibration FILE`` of predict, sweep, validate and collective).

    device: NVIDIA A100 SXM4 40GB          # the device the values hold for
    topology: a100-40gb-roce
    parameters:
      matmul_efficiency.bf16: {value: 0.62, default: 0.8686, low: 0.05, high: 1.0}
      ...
    fitted_to: {measured: ..., rows: 78, sha256: ..., nccl_tests: [{file: ..., rows: 32, sha256: ...}]}
    errors: {before: {...}, after: {...}, cross_validated: {...}}
    fit: {prior: {...}, fitted: {...}, held: {...}, covariance_log: [[...]]}  # `calibrate.fit_section`
    forced: true                           # only when written with --force: the rows do not
    warning: ...                           # determine the fit (why); predict warns on loading it
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field

from shardsim.core.documents import ClosedDocument, checked
from shardsim.core.errors import ConfigError
from shardsim.core.files import atomic_write
from shardsim.core.yamlio import load_yaml
from shardsim.simulator.calibration.parameters import applied, parameter
from shardsim.specs.hardware.topology import Cluster, InstanceType

log = logging.getLogger("shardsim")


@dataclass(frozen=True)
class Fitted:
    """One parameter's fitted value, its topology default and the bounds of the fit."""

    value: float
    default: float
    low: float
    high: float


@dataclass(frozen=True)
class Calibration:
    device: str
    topology: str
    parameters: dict[str, Fitted]
    fitted_to: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, Any] = field(default_factory=dict)
    warning: str = ""  # why the fit is not to be trusted, when it was written anyway (--force)
    fit: dict[str, Any] = field(default_factory=dict)  # prior, fitted / held, covariance (absent in older files)

    @property
    def values(self) -> dict[str, float]:
        return {k: p.value for k, p in self.parameters.items()}

    def to_dict(self) -> dict[str, Any]:
        return (
            {
                "device": self.device,
                "topology": self.topology,
                "parameters": {
                    k: {"value": p.value, "default": p.default, "low": p.low, "high": p.high}
                    for k, p in self.parameters.items()
                },
                "fitted_to": self.fitted_to,
                "errors": self.errors,
            }
            | ({"fit": self.fit} if self.fit else {})
            | ({"forced": True, "warning": self.warning} if self.warning else {})
        )


def write_calibration(path: str | Path, cal: Calibration) -> None:
    head = "# shardsim calibrate: fitted parameters of the compute and network model (see simulator/calibration)\n"
    atomic_write(path, head + yaml.safe_dump(cal.to_dict(), sort_keys=False))


class _FittedDoc(ClosedDocument):
    value: Annotated[float, Field(ge=0)]
    default: Annotated[float, Field(ge=0)] | None = None
    low: Annotated[float, Field(ge=0)]
    high: Annotated[float, Field(ge=0)]


class CalibrationDoc(ClosedDocument):
    """The schema of a calibration file (keys it does not name are refused: a misspelt one would
    otherwise be silently left out)."""

    device: str
    topology: str = ""
    parameters: dict[str, _FittedDoc]
    fitted_to: dict[str, Any] | None = None
    errors: dict[str, Any] | None = None
    fit: dict[str, Any] | None = None
    forced: bool = False
    warning: str | None = None


def read_calibration(path: str | Path) -> Calibration:
    """A calibration file, checked: its schema (`CalibrationDoc`), every parameter known and its
    value within its bounds."""
    where = str(path)
    doc = checked(CalibrationDoc, load_yaml(Path(path)), where)
    out: dict[str, Fitted] = {}
    for name, p in doc.parameters.items():
        try:
            parameter(name)
        except ConfigError as err:
            raise ConfigError(err.message, where=where, field=f"parameters.{name}") from None
        if not p.low <= p.value <= p.high:
            raise ConfigError(
                f"{p.value:g} is outside its bounds [{p.low:g}, {p.high:g}]",
                where=where,
                field=f"parameters.{name}.value",
            )
        out[name] = Fitted(p.value, p.value if p.default is None else p.default, p.low, p.high)
    warning = (doc.warning or "written with --force") if doc.forced else ""
    fit = dict(doc.fit or {})
    cov = fit.get("covariance_log")
    fitted = fit.get("fitted") or {}
    if cov is not None and (
        not isinstance(cov, list)
        or len(cov) != len(fitted)
        or not all(isinstance(r, list) and len(r) == len(fitted) for r in cov)
        or set(fitted) != set(out)
    ):
        why = f"expected a {len(fitted)} × {len(fitted)} matrix over the fitted parameters {', '.join(out)}"
        raise ConfigError(why, where=where, field="fit.covariance_log")
    return Calibration(doc.device, doc.topology, out, dict(doc.fitted_to or {}), dict(doc.errors or {}), warning, fit)


@functools.lru_cache(maxsize=16)
def _cached(path: str, mtime_ns: int) -> Calibration:
    cal = read_calibration(path)
    if cal.warning:
        log.warning("%s: written with --force, its fit refused: %s", path, cal.warning)
    return cal


def load_calibration(path: str | Path) -> Calibration:
    """`read_calibration`, read once per file version (a sweep applies it to every configuration);
    a forced one (``forced: true``) is a warning on stderr, once."""
    try:
        mtime = Path(path).stat().st_mtime_ns
    except OSError as exc:
        raise ConfigError(f"cannot read file: {exc.strerror}", where=str(path), field="calibration") from None
    return _cached(str(path), mtime)


def calibrated_instance(inst: InstanceType, cal: Calibration, where: str = "") -> InstanceType:
    """`inst` with the calibration's values over its figures; the device must be the one fitted."""
    if cal.device != inst.device.model:
        raise ConfigError(
            f"fitted for {cal.device}; topology {inst.name}'s device is {inst.device.model}",
            where=where or None,
            field="calibration",
        )
    for name in cal.parameters:
        if name.startswith("matmul_efficiency.") and name.split(".", 1)[1] not in inst.device.matmul_efficiency:
            raise ConfigError(
                f"{inst.name} has no {name.split('.', 1)[1]} peak", where=where or None, field="calibration"
            )
    return applied(inst, cal.values)


def calibrated(cluster: Cluster, path: str | Path) -> Cluster:
    """`cluster` with the calibration file's values over its instance's figures."""
    return replace(cluster, instance=calibrated_instance(cluster.instance, load_calibration(path), str(path)))
