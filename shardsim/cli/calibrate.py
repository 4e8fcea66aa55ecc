"""`shardsim calibrate MEASURED --topology T [--out FILE]`: fit the model's named parameters to
measured runs, print the error of every row before and after and a k-fold cross-validated error,
and write a calibration file that predict, sweep and validate take with ``--calibration``. A fit
the rows do not determine, or one that ends at a bound and still misses them by far, is refused
in one line; ``--force`` prints and writes it, marked forced."""

from __future__ import annotations

import argparse
import shlex

from shardsim.config.flags import str_list
from shardsim.core.files import check_output_file
from shardsim.core.flagtypes import Count

MAX_FOLDS = 1_000


def _line(name: str, e: dict[str, float]) -> str:
    mae, signed, top = e["mae_pct"], e["signed_pct"], e["max_pct"]
    return f"{name:<16} mean |error| {mae:5.1f} %, mean signed {signed:+5.1f} %, max {top:5.1f} %"


def _cmd_calibrate(ns: argparse.Namespace) -> int:
    from shardsim.simulator.calibration.apply import write_calibration
    from shardsim.simulator.calibration.calibrate import calibrate

    if ns.out:
        check_output_file(ns.out, "out")
    r = calibrate(ns.measured, ns.topology, params=ns.params, folds=ns.folds, force=ns.force)
    inst, rows, before, after, cv, f = r.instance, r.rows, r.before, r.after, r.cv, r.fit
    print(f"{len(rows)} measured rows from {ns.measured} on {inst.name} ({inst.device.model})")
    print(f"{'row':<44} {'measured':>12} {'before %':>9} {'after %':>8}" + (f" {'cv %':>7}" if cv is not None else ""))
    for i, m in enumerate(rows):
        i_ = m.info
        what = f"{i_['model']} seq {i_['seq_len']} gpus {i_['gpus']} mb {i_['microbatch']} ga {i_['grad_accum']}"
        cells = f"{what:<44.44} {m.measured:>12.4g} {(before[i] - 1) * 100:>+9.1f} {(after[i] - 1) * 100:>+8.1f}"
        print(cells + (f" {(cv[i] - 1) * 100:>+7.1f}" if cv is not None else ""))
    print("\nthroughput error (predicted / measured - 1)")
    for k, e in r.errors.items():
        print(_line(k if k != "cross_validated" else f"{ns.folds}-fold CV", e))
    print("\nfitted (default → value ± standard error, [bounds])")
    for n in r.names:
        lo, hi = f.bounds[n]
        v, se = f.values[n], f.stderr[n]
        at = "  AT BOUND" if f.at_bound(n) else ""
        print(f"  {n:<24} {f.defaults[n]:8.4g} → {v:8.4g} ± {se:.2g}  [{lo:g}, {hi:g}]{at}")
    for note in r.notes:
        print(f"  {note}")
    if r.warning:
        print(f"\nFORCED (--force): {r.warning}")
    if ns.out:
        write_calibration(ns.out, r.calibration)
        print(f"\nwritten {ns.out} (use: --calibration {shlex.quote(ns.out)})")
    return 0


def register(sub) -> None:
    from shardsim.simulator.calibration.calibrate import DEFAULT_FOLDS
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
