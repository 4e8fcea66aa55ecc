"""`shardsim validate`: predicted vs measured step times on emulated clusters."""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import asdict, replace

from shardsim.core.files import check_not_input, check_output_dir, input_files, output_folder
from shardsim.core.flagtypes import Count, Real
from shardsim.core.torch_required import require_torch
from shardsim.runtime.emulation.hostspeed import QUIET_STEAL_SHARE
from shardsim.runtime.train import MAX_THREADS
from shardsim.runtime.validation.matrix import DEFAULT_MATRIX, load_matrix
from shardsim.runtime.validation.matrix_schema import MAX_RETRIES
from shardsim.runtime.validation.measure import validate
from shardsim.runtime.validation.report import markdown

log = logging.getLogger("shardsim")

# the files validate writes in its --out folder, besides runs/ and the profile it measures
WRITTEN = ("validation.json", "validation.csv", "validation.md", "scatter.png", "errors.png")
MAX_ERROR_PCT = 1_000.0  # --max-mape and --max-error: a bound above 1,000 % bounds nothing


def _holding(matrix, wait: bool):
    """Hold every topology of the matrix (`emulation.namespaces.held`) where this process can
    emulate; elsewhere validate has nothing to run, or says it needs root."""
    from shardsim.runtime.emulation.iproute import EmulationError, check_privileges
    from shardsim.runtime.emulation.namespaces import held
    from shardsim.runtime.emulation.plan import plan_cluster

    try:
        check_privileges()
    except EmulationError:
        return contextlib.nullcontext()
    return held([plan_cluster(top) for top, _ in matrix.topologies], wait=wait)


def _cmd_validate(ns) -> int:
    require_torch("shardsim validate")
    matrix = load_matrix(ns.matrix)
    out = check_output_dir(ns.out, "out")
    written = [out / name for name in (*WRITTEN, *(() if ns.profile else ("profile.json",)))]
    runs = out / "runs"
    written += [p for p in runs.rglob("*") if p.is_file()] if runs.is_dir() else []
    check_not_input(written, input_files(ns.matrix, ns.profile, ns.calibration), "out")
    if ns.max_steal is not None:
        matrix = replace(matrix, max_steal=ns.max_steal)
    if ns.retries is not None:
        matrix = replace(matrix, retries=ns.retries)
    with _holding(matrix, ns.wait), output_folder(out, "out"):  # the whole job: profiling the links and every run
        rows, summary = validate(matrix, out, profile=ns.profile, threads=ns.threads, calibration=ns.calibration)
    if ns.json:
        print(json.dumps({"rows": [asdict(r) for r in rows], **summary}))
    else:
        print(markdown(rows, summary), end="")
        log.info("written %s/validation.{json,csv,md}, scatter.png, errors.png", out)
    failed = [r for r in rows if r.status.startswith("failed")]
    if failed:
        log.error("%d run(s) failed, e.g. %s: %s", len(failed), failed[0].key, failed[0].status)
        return 1
    bad = []
    if ns.max_mape is not None and not summary["mape_pct"] <= ns.max_mape:
        bad.append(f"mean error {summary['mape_pct']:.1f} % exceeds --max-mape {ns.max_mape:g} %")
    if ns.max_error is not None and not summary["max_error_pct"] <= ns.max_error:
        bad.append(f"largest error {summary['max_error_pct']:.1f} % exceeds --max-error {ns.max_error:g} %")
    if bad:
        log.error("validation failed: %s", "; ".join(bad))
        return 1
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "validate",
        help="run configurations for real on emulated clusters and compare with predictions (needs root)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--matrix", default=None, help=f"matrix YAML (default: {DEFAULT_MATRIX.name}, shipped)")
    p.add_argument("--out", default="results/validation", help="output folder, resumable (default: %(default)s)")
    p.add_argument("--profile", default=None, help="a profile to predict from (default: measured, out/profile.json)")
    p.add_argument(
        "--calibration",
        default=None,
        help="a calibration file (shardsim calibrate) the predictions apply (default: none)",
    )
    p.add_argument(
        "--threads", type=Count(MAX_THREADS), default=1, help="torch threads per rank (default: %(default)s)"
    )
    p.add_argument(
        "--max-steal",
        type=Real(0.0, 1.0),
        default=None,
        help="set aside steps where the hypervisor took more than this part of the cores' time "
        f"(default: the matrix's max_steal, else {QUIET_STEAL_SHARE:g})",
    )
    p.add_argument(
        "--retries",
        type=Count(MAX_RETRIES, 0),
        default=None,
        help="more attempts at a configuration with fewer than half its steps quiet (default: the matrix's, else 2)",
    )
    p.add_argument(
        "--max-mape",
        type=Real(0.0, MAX_ERROR_PCT, inclusive=True),
        default=None,
        help="exit 1 when the mean absolute error (%%) is above this (default: no bound)",
    )
    p.add_argument(
        "--max-error",
        type=Real(0.0, MAX_ERROR_PCT, inclusive=True),
        default=None,
        help="exit 1 when the largest error (%%) is above this (default: no bound)",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="when another job holds one of the matrix's topologies, wait for it (default: refuse, exit 2)",
    )
    p.add_argument("--json", action="store_true", help="print {rows, mape_pct, max_error_pct, best_agrees, ...}")
    p.set_defaults(func=_cmd_validate)
