"""A calibration end to end: measured runs and measured collectives (nccl-tests files, each size
a row) read, the parameters the rows determine fitted to them with a prior toward the defaults
(`prior`), the fit checked (before / after errors, cross-validation with folds chosen from the row
count: `choose_folds`) and the calibration file's content (`Calibration`), as `shardsim calibrate`
and `shardsim.calibrate` both make it.

Parameters the rows do not determine are held at their defaults (each with why); rows that
determine none are refused (ConfigError). A fit that ends at a bound and still misses the rows by
far is refused unless `force`; forced, its `warning` says why it is not to be trusted.
Messages name the command's flags (``--force``, ``--params``, ``--nodes``): the keyword arguments
of `calibrate` have the same names (``--nccl-tests`` is `nccl_tests`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardsim.core.errors import ConfigError
from shardsim.simulator.calibration.parameters import DEFAULT_FIT, NETWORK_FIT

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from shardsim.simulator.calibration.apply import Calibration
    from shardsim.simulator.calibration.collectives import CollectiveRow
    from shardsim.simulator.calibration.fit import Row
    from shardsim.simulator.calibration.measurements import Measurement
    from shardsim.simulator.calibration.prior import MapFit
    from shardsim.simulator.model_error import ModelError
    from shardsim.specs.hardware.topology import InstanceType

DEFAULT_FOLDS = None  # chosen from the row count (`choose_folds`)
LEAVE_ONE_OUT_BELOW = 10  # fewer rows than this: leave-one-out cross-validation by default
FOLDS_AT_OR_ABOVE = 5  # else this many folds
FORCE = " (--force writes it anyway, marked forced)"


def errors(ratio: np.ndarray) -> dict[str, float]:
    """Mean absolute, mean signed and largest error of throughput, in percent."""
    import numpy as np

    e = (ratio - 1) * 100
    return {"mae_pct": float(np.abs(e).mean()), "signed_pct": float(e.mean()), "max_pct": float(np.abs(e).max())}


@dataclass(frozen=True, eq=False)  # arrays have no truth value: results compare by identity
class CalibrationResult:
    """A fit and how well it does.

    instance: the topology the rows were predicted on; rows: the measured runs, then each
    nccl-tests file's sizes (`CollectiveRow`), in file order; names: the parameters fitted;
    notes: one line per requested parameter left out (nothing depends on it, or held at its
    default: the rows do not determine it) and on the folds; fit: values, defaults, bounds,
    standard errors, posterior covariance (`prior.MapFit`); before / after / cv: predicted over measured throughput
    (a collective's: measured over predicted time) of each row with the topology's figures, with
    the fitted ones, and from a fit to the other folds (None without cross-validation); errors:
    `errors()` of each (keys before, after, cross_validated, the last with its folds); warning:
    why a forced fit is not to be trusted ("" otherwise); calibration: what a calibration file
    holds (`apply.write_calibration` writes it; predict, sweep, validate and collective take it)."""

    instance: InstanceType
    rows: list[Row]
    names: tuple[str, ...]
    notes: list[str]
    fit: MapFit
    before: np.ndarray
    after: np.ndarray
    cv: np.ndarray | None
    errors: dict[str, dict[str, Any]]
    warning: str
    calibration: Calibration
    warnings: list[str]  # what the user should know of a fit that is written (more parameters than rows)
    dropped: list[str] = field(default_factory=list)  # per nccl-tests file with rows left out: which and why
    model_error: ModelError | None = None  # the model's error the fit adds to a prediction's band (`band.pooled_error`)

    def bands(self) -> np.ndarray:
        """Each row's one-sigma band in log throughput with the fitted values: the parameters'
        share and the model's own error, added (`model_error.total_sigma`)."""
        import numpy as np

        model = self.model_error.sigma if self.model_error else 0.0
        return np.sqrt(self.fit.parameters_sigma() ** 2 + model**2)

    @property
    def values(self) -> dict[str, float]:
        """The fitted value of each parameter."""
        return dict(self.fit.values)


def choose_folds(rows: int, requested: int | None) -> tuple[int, str]:
    """The folds of the cross-validation, and a note when they are not the ones requested:
    leave-one-out below `LEAVE_ONE_OUT_BELOW` rows, else `FOLDS_AT_OR_ABOVE`, when none is requested;
    a request for more folds than rows is clamped to leave-one-out; one row: none."""
    if requested == 0:
        return 0, ""
    if rows < 2:
        return 0, "cross-validation: none, one row (nothing to hold out)"
    if requested is None:
        return (rows if rows < LEAVE_ONE_OUT_BELOW else FOLDS_AT_OR_ABOVE), ""
    if requested > rows:
        return rows, f"cross-validation: {requested} folds asked, {rows} rows: leave-one-out ({rows} folds)"
    return requested, ""


def untrusted(f: MapFit, mae_pct: float) -> str | None:
    """Why the fit `f`, missing the rows by `mae_pct` on average after it, is not one to write: a
    parameter at a bound while the rows are missed by more than `MAX_MAE_AT_BOUND_PCT`; None when it is."""
    from shardsim.simulator.calibration.parameters import MAX_MAE_AT_BOUND_PCT

    bound = [n for n in f.values if f.at_bound(n)]
    if bound and mae_pct > MAX_MAE_AT_BOUND_PCT:
        return (
            f"{', '.join(bound)} ended at a bound and the fit still misses the rows by {mae_pct:,.0f} % on average "
            f"(more than {MAX_MAE_AT_BOUND_PCT:g} %): the rows ask for what the model cannot give; check the "
            "measurements' units and that they ran on this topology's device"
        )
    return None


def fit_section(f: MapFit, warnings: list[str], model: ModelError | None = None, library: str = "") -> dict[str, Any]:
    """What a calibration file says of the fit: the prior, which parameters were fitted (the scaled
    Jacobian's singular values over them, each one's column norm) and which held (why), the
    posterior covariance of the fitted log-parameters (u = log(value + shift)) and the model's
    own error (`model`, for runs of `library`) that a prediction's band comes from."""
    from shardsim.simulator.calibration.prior import PRIOR_SIGMA, ROW_ERROR

    return (
        {
            "prior": {"sigma_log": PRIOR_SIGMA, "row_error_log": ROW_ERROR},
            "singular_values": [round(v, 4) for v in f.singular],  # of the scaled Jacobian over the fitted set
            "fitted": {n: {"column_norm": round(f.column[n], 4), "shift": f.shifts[n]} for n in f.names},
            "held": dict(f.held),
            "row_error_log": round(f.row_error, 6),
            "covariance_log": [[float(x) for x in row] for row in f.covariance.tolist()],
        }
        | ({"model_error": model.to_dict() | {"library": library}} if model else {})
        | ({"warnings": list(warnings)} if warnings else {})
    )


def worse_than_defaults(errs: dict[str, dict[str, Any]]) -> str | None:
    """A warning when the fit misses its own rows by more than the topology's figures do (mean
    or largest |error|): the calibration file would make predictions of these rows worse."""
    b, a = errs["before"], errs["after"]
    if a["mae_pct"] <= b["mae_pct"] and a["max_pct"] <= b["max_pct"]:
        return None
    return (
        f"the fit is worse than the defaults on its own rows (mean |error| {b['mae_pct']:.1f} % -> "
        f"{a['mae_pct']:.1f} %, largest {b['max_pct']:.0f} % -> {a['max_pct']:.0f} %): predict without "
        "--calibration, or fit fewer parameters (--params)"
    )


def at_bound(f: MapFit) -> str | None:
    """A warning when a fitted parameter ended at a bound: the rows ask for more than the figure can give."""
    bound = [n for n in f.names if f.at_bound(n)]
    if not bound:
        return None
    return (
        f"{', '.join(bound)} ended at a bound: the rows ask for more than the figure can give (structure the model "
        "lacks, or rows from another device or in other units); its standard error and the band understate the doubt"
    )


def stated_error(inst: InstanceType, runs: list[Measurement], collectives: list[CollectiveRow]) -> ModelError:
    """The model's stated error for what the rows measured (`model_error`): training steps on the
    topology's device with the runs' library (several libraries: not measured here), else the
    collectives on the topology's instance type."""
    from shardsim.simulator.model_error import collective_error, step_error

    if runs:
        libraries = sorted({m.cfg.library for m in runs})
        return step_error(inst.device.model, " + ".join(libraries))
    return collective_error(inst.name, max(r.nodes for r in collectives))


def model_shape(m: Measurement) -> object:
    """What tells one model from another among measured runs: its architecture but for the
    sequence length (the rows of one model at several lengths are one model), else its name."""
    from dataclasses import replace

    arch = m.workload.arch
    return replace(arch, seq_len=0) if arch is not None else m.workload.name


def one_model(runs: list[Measurement]) -> str | None:
    """A warning when two or more measured runs are all of one model: the fit cannot tell that
    model's own error from the stack's, and carries it to every other model."""
    if len(runs) < 2 or len({model_shape(m) for m in runs}) > 1:
        return None
    arch = runs[0].workload.arch
    name = f"{arch.family}, hidden {arch.hidden}, {arch.layers} layers" if arch else runs[0].workload.name
    return (
        f"every measured run is of one model ({name}): the fit cannot tell that model's own error from the "
        "stack's and carries it to other models (the shipped defaults fitted to 3 rows of one size of the A100 "
        "calibration table predict its other sizes worse: experiments/calibration/three_rows.md); measure a second "
        "model size"
    )


def default_params(runs: bool, collectives: bool) -> tuple[str, ...]:
    """What is fitted without ``--params``: `DEFAULT_FIT` to measured runs, `NETWORK_FIT` to
    measured collectives; to both, both but ``nic_efficiency`` (`NIC_EFFICIENCY_NOTE`)."""
    if runs and collectives:
        return tuple(n for n in DEFAULT_FIT if n != "nic_efficiency") + NETWORK_FIT
    return (DEFAULT_FIT if runs else ()) + (NETWORK_FIT if collectives else ())


# a choice: the size factors and nic_efficiency scale the same NIC rate (their product is what
# the rows see), so the two together are not determined; the size factors say more
NIC_EFFICIENCY_NOTE = "nic_efficiency: left out beside nccl-tests files, the NIC size factors scale the same rate"


def collective_measurements(
    paths: tuple[str | Path, ...], inst: InstanceType, nodes: int | None
) -> tuple[list[CollectiveRow], list[dict[str, Any]], list[str]]:
    """The rows of each section of each nccl-tests file (`collectives.collective_rows`; `nodes`
    for a file that names no ranks), what the calibration file says of each section (path,
    collective, ranks, nodes, rows, sha256) and one line per file that had rows dropped
    (`nccl_tests.dropped_line`). A file given twice, or measured on other nodes than `nodes`, is
    refused."""
    from shardsim.simulator.calibration.collectives import collective_rows
    from shardsim.simulator.network.nccl_tests import dropped_line, read_nccl_tests_sections

    rows: list[CollectiveRow] = []
    files: list[dict[str, Any]] = []
    dropped: list[str] = []
    seen: set[Path] = set()
    for path in paths:
        if Path(path).resolve() in seen:
            raise ConfigError(f"{path}: given twice", field="nccl_tests")
        seen.add(Path(path).resolve())
        sections = read_nccl_tests_sections(path)
        found = 0
        for result in sections:
            if nodes is not None and result.nodes is not None and result.nodes != nodes:
                raise ConfigError(f"{path}: measured on {result.nodes} nodes, not --nodes {nodes}", field="nodes")
            these = collective_rows(result, inst, nodes)
            found += len(these)
            rows += these
            if these:
                r0 = these[0]
                files.append(
                    {"file": str(path), "op": r0.op, "ranks": r0.ranks, "nodes": r0.nodes, "rows": len(these),
                     "sha256": result.sha256}
                )  # fmt: skip
        if not found:
            raise ConfigError(f"{path}: no sizes above 0 bytes with a time", field="nccl_tests")
        if line := dropped_line(sections):
            dropped.append(line)
    return rows, files, dropped


def calibrate(
    measured: str | Path | pd.DataFrame | None,
    topology: str,
    *,
    params: tuple[str, ...] | None = None,
    folds: int | None = DEFAULT_FOLDS,
    force: bool = False,
    nccl_tests: tuple[str | Path, ...] = (),
    nodes: int | None = None,
) -> CalibrationResult:
    """Fit `params` (default: `default_params`) to the measurements of `measured` (a CSV,
    runs.csv, a run JSON file or a folder of them, or a pandas DataFrame with a CSV's columns)
    and of the nccl-tests files `nccl_tests` (each size a row; `nodes` for a file that names no
    ranks) on `topology` (a name or YAML path), with `folds`-fold cross-validation (0: none;
    None: `choose_folds`). Refused before the fit: neither kind of measurement, folds 1, nothing
    to fit, rows that determine none of the parameters; after it: an untrusted fit (unless `force`)."""
    import numpy as np

    from shardsim.simulator.calibration import fit as F
    from shardsim.simulator.calibration import prior as P
    from shardsim.simulator.calibration.apply import Calibration, Fitted
    from shardsim.simulator.calibration.band import pooled_error
    from shardsim.simulator.calibration.measurements import read_frame, read_measurements
    from shardsim.specs.hardware.topology import load_instance

    if measured is None and not nccl_tests:
        raise ConfigError("nothing to fit to: give measured runs (MEASURED) or --nccl-tests FILE", field="measured")
    if folds is not None and (isinstance(folds, bool) or not isinstance(folds, int) or folds < 0 or folds == 1):
        raise ConfigError(f"expected 0 (none) or >= 2 folds, got {folds!r}", field="folds")
    inst = load_instance(topology)
    is_path = isinstance(measured, str | Path)
    runs: list[Measurement] = []
    if measured is not None:
        runs = read_measurements(measured, topology, inst) if is_path else read_frame(measured, topology, inst)
        if not runs:
            raise ConfigError("no measurements: the table has no rows", field="measurements")
    collectives, files, dropped = collective_measurements(tuple(nccl_tests), inst, nodes)
    rows: list[Row] = [*runs, *collectives]
    requested = default_params(bool(runs), bool(collectives)) if params is None else tuple(params)
    names, notes = F.fitted_names(inst, rows, requested)
    if params is None and runs and collectives:
        notes.append(NIC_EFFICIENCY_NOTE)
    if not names:
        raise ConfigError("nothing to fit: " + "; ".join(notes), field="params")
    k, fold_note = choose_folds(len(rows), folds)
    if fold_note:
        notes.append(fold_note)
    ident = P.identify(inst, rows, names)
    warnings: list[str] = []
    if len(names) > ident.informative:
        warnings.append(
            f"{len(names)} parameters for {ident.informative} informative row(s) (rows whose prediction depends on "
            "one): only the directions the rows determine are fitted, the rest held at their defaults"
        )
    if one := one_model(runs):
        warnings.append(one)
    if not ident.fitted:
        why = f"the rows determine none of {', '.join(names)}: " + "; ".join(f"{n}: {w}" for n, w in ident.held.items())
        raise ConfigError(why + "; measure configurations that depend on them", field="params")
    before = F.ratios(inst, rows, {})
    f = P.map_fit(inst, rows, names, ident)
    after = F.ratios(inst, rows, f.values)
    errs: dict[str, dict[str, Any]] = {"before": errors(before), "after": errors(after)}
    warning = untrusted(f, errs["after"]["mae_pct"])
    if warning and not force:
        raise ConfigError(warning + FORCE)
    warnings += [w for w in (worse_than_defaults(errs), None if warning else at_bound(f)) if w]
    model = pooled_error(stated_error(inst, runs, collectives), np.log(after), len(f.names))
    cv = P.cross_validated(inst, rows, names, k) if k else None
    if cv is not None:
        errs["cross_validated"] = errors(cv) | {"folds": k}
    fitted_to: dict[str, Any] = {"rows": len(rows)}
    if runs:
        digest = hashlib.sha256(Path(measured).read_bytes()).hexdigest() if is_path and Path(measured).is_file() else ""
        fitted_to |= {"measured": str(measured) if is_path else "a table", "measured_rows": len(runs), "sha256": digest}
    if files:
        fitted_to["nccl_tests"] = files
    cal = Calibration(
        device=inst.device.model,
        topology=topology,
        parameters={n: Fitted(f.values[n], f.defaults[n], *f.bounds[n]) for n in f.names},
        fitted_to=fitted_to,
        errors=errs,
        warning=warning or "",
        fit=fit_section(f, warnings, model, " + ".join(sorted({m.cfg.library for m in runs})) if runs else "nccl"),
    )
    names = f.names
    notes += [f"{n}: {why}" for n, why in f.held.items()]
    result = (inst, rows, names, notes, f, before, after, cv, errs, warning or "", cal, warnings, dropped)
    return CalibrationResult(*result, model_error=model)
