"""`shardsim calibrate MEASURED --topology T [--out FILE]`: fit the model's named parameters to
measured runs, print the error of every row before and after and a k-fold cross-validated error,
and write a calibration file that predict, sweep and validate take with ``--calibration``. A fit
the rows do not determine, or one that ends at a bound and still misses them by far, is refused
in one line; ``--force`` prints and writes it, marked forced."""

from __future__ import annotations

import argparse
import hashlib
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from shardsim.config.flags import str_list
from shardsim.core.errors import ConfigError
from shardsim.core.files import check_output_file
from shardsim.core.flagtypes import Count

if TYPE_CHECKING:
    import numpy as np

DEFAULT_FOLDS = 5
FORCE = " (--force writes it anyway, marked forced)"
MAX_FOLDS = 1_000


def errors(ratio: np.ndarray) -> dict[str, float]:
    import numpy as np  # here, not at import: the `shardsim` command loads this module for every command

    """Mean absolute, mean signed and largest error of throughput, in percent."""
    e = (ratio - 1) * 100
    return {"mae_pct": float(np.abs(e).mean()), "signed_pct": float(e.mean()), "max_pct": float(np.abs(e).max())}


def _line(name: str, e: dict[str, float]) -> str:
    mae, signed, top = e["mae_pct"], e["signed_pct"], e["max_pct"]
    return f"{name:<16} mean |error| {mae:5.1f} %, mean signed {signed:+5.1f} %, max {top:5.1f} %"


def _cmd_calibrate(ns: argparse.Namespace) -> int:
    from shardsim.simulator.calibration import fit as F
    from shardsim.simulator.calibration.apply import Calibration, Fitted, write_calibration
    from shardsim.simulator.calibration.measurements import read_measurements
    from shardsim.simulator.hardware.topology import load_instance

    if ns.out:
        check_output_file(ns.out, "out")
    if ns.folds == 1:
        raise ConfigError(f"expected 0 (none) or >= 2 folds, got {ns.folds}", field="folds")
    inst = load_instance(ns.topology)
    rows = read_measurements(ns.measured, ns.topology, inst)
    names, notes = F.fitted_names(inst, rows, ns.params)
    if not names:
        raise ConfigError("nothing to fit: " + "; ".join(notes), field="params")
    if len(rows) <= len(names) and not ns.force:  # refused before the fit: it cannot be determined
        why = f"{len(rows)} row(s) for {len(names)} parameter(s) ({', '.join(names)}): the fit needs more rows"
        raise ConfigError(f"{why} than parameters; measure more configurations or fit fewer (--params){FORCE}")
    if ns.folds > len(rows):
        why = f"{ns.folds} folds need at least {ns.folds} rows; {ns.measured} has {len(rows)} (0: no cross-validation)"
        raise ConfigError(why, field="folds")
    before = F.ratios(inst, rows, {})
    f = F.fit(inst, rows, names)
    after = F.ratios(inst, rows, f.values)
    errs = {"before": errors(before), "after": errors(after)}
    warning = F.untrusted(f, errs["after"]["mae_pct"])
    if warning and not ns.force:
        raise ConfigError(warning + FORCE)
    cv = F.cross_validated(inst, rows, names, ns.folds) if ns.folds else None

    print(f"{len(rows)} measured rows from {ns.measured} on {inst.name} ({inst.device.model})")
    print(f"{'row':<44} {'measured':>12} {'before %':>9} {'after %':>8}" + (f" {'cv %':>7}" if cv is not None else ""))
    for i, m in enumerate(rows):
        i_ = m.info
        what = f"{i_['model']} seq {i_['seq_len']} gpus {i_['gpus']} mb {i_['microbatch']} ga {i_['grad_accum']}"
        cells = f"{what:<44.44} {m.measured:>12.4g} {(before[i] - 1) * 100:>+9.1f} {(after[i] - 1) * 100:>+8.1f}"
        print(cells + (f" {(cv[i] - 1) * 100:>+7.1f}" if cv is not None else ""))
    if cv is not None:
        errs["cross_validated"] = errors(cv) | {"folds": ns.folds}
    print("\nthroughput error (predicted / measured - 1)")
    for k, e in errs.items():
        print(_line(k if k != "cross_validated" else f"{ns.folds}-fold CV", e))
    print("\nfitted (default → value ± standard error, [bounds])")
    for n in names:
        lo, hi = f.bounds[n]
        v, se = f.values[n], f.stderr[n]
        at = "  AT BOUND" if f.at_bound(n) else ""
        print(f"  {n:<24} {f.defaults[n]:8.4g} → {v:8.4g} ± {se:.2g}  [{lo:g}, {hi:g}]{at}")
    for note in notes:
        print(f"  {note}")
    if warning:
        print(f"\nFORCED (--force): {warning}")
    if ns.out:
        digest = hashlib.sha256(Path(ns.measured).read_bytes()).hexdigest() if Path(ns.measured).is_file() else ""
        cal = Calibration(
            device=inst.device.model,
            topology=ns.topology,
            parameters={n: Fitted(f.values[n], f.defaults[n], *f.bounds[n]) for n in names},
            fitted_to={"measured": str(ns.measured), "rows": len(rows), "sha256": digest},
            errors=errs,
            warning=warning or "",
        )
        write_calibration(ns.out, cal)
        print(f"\nwritten {ns.out} (use: --calibration {shlex.quote(ns.out)})")
    return 0


def register(sub) -> None:
    from shardsim.simulator.calibration.parameters import DEFAULT_FIT, MAX_MAE_AT_BOUND_PCT, NAMES

    p = sub.add_parser(
        "calibrate",
        help="fit the model's efficiency figures to measured runs; write a calibration file",
        description=__doc__.splitlines()[0] + " " + " ".join(__doc__.splitlines()[1:]),
    )
    p.add_argument(
        "measured", metavar="MEASURED", help="a CSV of measurements, runs.csv, a run JSON file or a folder of them"
    )
    p.add_argument("--topology", required=True, help="the topology the runs ran on (name or YAML path)")
    p.add_argument(
        "--out", metavar="FILE", help="write the calibration file (YAML) here (default: none, print the fit only)"
    )
    p.add_argument(
        "--folds",
        type=Count(MAX_FOLDS, 0),
        default=DEFAULT_FOLDS,
        help=f"k of the k-fold cross-validation (0: none; default: {DEFAULT_FOLDS})",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="fit and write even what the rows do not determine, or a fit at a bound that misses them by more than "
        f"{MAX_MAE_AT_BOUND_PCT:g} %%; the file is marked forced and predict warns when it loads it (default: refused)",
    )
    p.add_argument(
        "--params",
        type=str_list,
        default=DEFAULT_FIT,
        help=f"parameters to fit, of {','.join(NAMES)} (default: {','.join(DEFAULT_FIT)})",
    )
    p.set_defaults(func=_cmd_calibrate)
