"""`shardsim calibrate [MEASURED] --topology T [--nccl-tests FILE ...] [--out FILE]`: fit the
model's named parameters to measured runs and measured collectives (nccl-tests output), print the
error of every row before and after and a cross-validated error, and write a calibration file
that predict, sweep, validate and collective take with ``--calibration``. Only the parameters
the rows determine are fitted (a rank test of the Jacobian), each shrunk toward its default (a
prior on its log); the others are held at their defaults, each with why. A fit that ends at a
bound and still misses the rows by far is refused in one line; ``--force`` writes it, marked
forced."""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap

from shardsim.config.flags import setting_type, str_list
from shardsim.core.console import output_width
from shardsim.core.errors import ConfigError
from shardsim.core.files import check_output_file, input_files
from shardsim.core.flagtypes import Count

MAX_FOLDS = 1_000


INPUT = """\
MEASURED, a CSV: one row a measured run, a header of columns. The workload: `workload` (a library
name, a model YAML or config.json), or its shape (`family, hidden, layers, heads, kv_heads, ffn,
vocab, seq_len, tied_embeddings, positions`), or llm-foundry's benchmark columns (`d_model,
n_heads, n_layers, expansion_ratio, vocab_size, seq_len, microbatch, grad_accum, gpus,
sharding_strategy, mp_mode, activation_checkpointing`). The run: `nodes` or `gpus` (fewer GPUs
than a node holds: part of one node), `gpus_per_node`, `topology` (another topology of the same
device) and any setting of predict (`strategy, batch_per_device, grad_accum, precision,
checkpointing, reduce_dtype`, ...). What was measured, one or more (they must agree):
`tokens_per_s_per_gpu`, `tokens_per_s`, `samples_per_s`, `step_time_s`. Other columns are notes.
The band it prints adds the model's own error for the device and stack (docs/calibration.md). A
worked example of 3 rows: docs/examples/calibration-3-rows.csv (docs/calibration.md).
Also read: a runtime runs.csv, a run JSON file or a folder of them."""


class _Paragraphs(argparse.HelpFormatter):
    """Help whose description keeps its paragraphs (blank-line separated), each wrapped at whole words."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(
            textwrap.fill(" ".join(par.split()), width, initial_indent=indent, subsequent_indent=indent,
                          break_long_words=False, break_on_hyphens=False)
            for par in text.split("\n\n")
        )  # fmt: skip

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)


def _line(name: str, e: dict[str, float]) -> str:
    mae, signed, top = e["mae_pct"], e["signed_pct"], e["max_pct"]
    return f"{name:<16} mean |error| {mae:5.1f} %, signed {signed:+5.1f} %, max {top:5.1f} %"


def _row_text(m) -> tuple[str, str]:
    """A row as the table names it, and its measured figure."""
    from shardsim.core.units import format_bytes
    from shardsim.simulator.calibration.collectives import CollectiveRow

    if isinstance(m, CollectiveRow):
        what = f"{m.op} {format_bytes(m.size_bytes)}, {m.ranks} ranks / {m.nodes} nodes"
        t = m.measured_time_us  # as nccl-tests prints a time: 2 decimals below 100 µs, 1 below 10 ms
        return what, f"{t:.2f} µs" if t < 100 else f"{t:.1f} µs" if t < 10_000 else f"{t:.0f} µs"
    i = m.info
    what = f"{i['model']} seq {i['seq_len']} gpus {i['gpus']} mb {i['microbatch']} ga {i['grad_accum']}"
    return f"{what} ({m.label})", f"{m.measured:,.0f}" if m.measured >= 100 else f"{m.measured:.4g}"


def _band(r, say) -> None:
    """The model's error the fit adds to a prediction's band, and the band (one sigma) it gives its own rows."""
    import numpy as np

    model = r.model_error
    params = np.expm1(r.fit.parameters_sigma()) * 100
    total = r.bands()
    miss = np.abs(np.log(r.after))
    say(f"model error added: {model.text()}")
    median = np.median(np.expm1(total)) * 100
    say(
        f"band of a prediction (one sigma): the fitted parameters ±{np.median(params):.1f} % (median of the rows, "
        f"largest ±{params.max():.1f} %) and the model's ±{model.pct:.1f} %: total ±{median:.1f} %; "
        f"the rows within it: {np.mean(miss <= total):.0%} at one sigma, {np.mean(miss <= 2 * total):.0%} at two "
        "(in sample; held out: experiments/readings/band-coverage.md)"
    )


def _cmd_calibrate(ns: argparse.Namespace) -> int:
    from shardsim.simulator.calibration.apply import write_calibration
    from shardsim.simulator.calibration.calibrate import calibrate
    from shardsim.simulator.calibration.collectives import CollectiveRow
    from shardsim.simulator.calibration.prior import PRIOR_SIGMA, ROW_ERROR

    if ns.measured is None and not ns.nccl_tests:
        raise ConfigError("nothing to fit to: give measured runs (MEASURED) or --nccl-tests FILE", field="measured")
    if ns.out:
        check_output_file(ns.out, "out", inputs=input_files(ns.measured, ns.topology, *ns.nccl_tests))
    r = calibrate(
        ns.measured,
        ns.topology,
        params=ns.params,
        folds=ns.folds,
        force=ns.force,
        nccl_tests=tuple(ns.nccl_tests),
        nodes=ns.nodes,
    )
    inst, rows, before, after, cv, f = r.instance, r.rows, r.before, r.after, r.cv, r.fit
    for line in r.dropped:
        print(line, file=sys.stderr)
    width = output_width()
    n_coll = sum(isinstance(m, CollectiveRow) for m in rows)
    sources = [f"{len(rows) - n_coll} measured rows from {ns.measured}"] if ns.measured is not None else []
    if n_coll:
        sources.append(f"{n_coll} collective sizes from {', '.join(ns.nccl_tests)}")

    def say(text: str, indent: str = "") -> None:
        """A line of prose, wrapped to the output's width (COLUMNS) at whole words, when it has one."""
        if not width:
            print(indent + text)
            return
        wrapped = textwrap.fill(
            text, width, initial_indent=indent, subsequent_indent=indent + "  ", break_long_words=False,
            break_on_hyphens=False,
        )  # fmt: skip
        print(wrapped)

    say(f"{' and '.join(sources)} on {inst.name} ({inst.device.model})")
    texts = [_row_text(m) for m in rows]
    wide = max(len("row"), *(len(w) for w, _ in texts))
    folds = r.errors.get("cross_validated", {}).get("folds")
    print(
        f"{'row':<{wide}} {'measured':>12} {'before %':>9} {'after %':>8}" + (f" {'cv %':>7}" if cv is not None else "")
    )
    for i, (what, measured) in enumerate(texts):
        cells = f"{what:<{wide}} {measured:>12} {(before[i] - 1) * 100:>+9.1f} {(after[i] - 1) * 100:>+8.1f}"
        print(cells + (f" {(cv[i] - 1) * 100:>+7.1f}" if cv is not None else ""))
    if n_coll:
        print("\n(a collective's throughput is 1 / its time: its error is predicted / measured busbw - 1)")
    print("\nthroughput error (predicted / measured - 1)")
    for k, e in r.errors.items():
        name = k
        if k == "cross_validated":
            name = "leave-one-out CV" if folds == len(rows) else f"{folds}-fold CV"
        print(_line(name, e))
    print()
    _band(r, say)
    print()
    say(
        f"fitted (default → value ± standard error, [bounds]); prior: log(value) ~ default ± {PRIOR_SIGMA:g}, "
        f"row error {ROW_ERROR:g} in log throughput in the fit's weights, {f.row_error:.3g} in its covariance (the "
        f"larger of {ROW_ERROR:g} and the rows' residual); determined: the scaled Jacobian's singular values over "
        f"them, {', '.join(f'{v:.3g}' for v in f.singular)}, each at least {1 / PRIOR_SIGMA:g} (the prior's)"
    )
    for n in r.names:
        lo, hi = f.bounds[n]
        v, se = f.values[n], f.stderr[n]
        at = "  AT BOUND" if f.at_bound(n) else ""
        why = f"  (its column of the scaled Jacobian: {f.column[n]:.3g})"
        say(f"{n:<24} {f.defaults[n]:8.4g} → {v:8.4g} ± {se:.2g}  [{lo:g}, {hi:g}]{at}{why}", "  ")
    for note in r.notes:
        say(note, "  ")
    for warning in r.warnings:
        print()
        say(f"WARNING: {warning}")
    if r.warning:
        print(f"\nFORCED (--force): {r.warning}")
    if ns.out:
        write_calibration(ns.out, r.calibration)
        print(f"\nwritten {ns.out} (use: --calibration {shlex.quote(ns.out)})")
    return 0


def register(sub) -> None:
    from shardsim.simulator.calibration.calibrate import DEFAULT_FOLDS, FOLDS_AT_OR_ABOVE, LEAVE_ONE_OUT_BELOW
    from shardsim.simulator.calibration.parameters import DEFAULT_FIT, MAX_MAE_AT_BOUND_PCT, NAMES, NETWORK_FIT

    p = sub.add_parser(
        "calibrate",
        help="fit the model's efficiency and network figures to measured runs and nccl-tests output; write a "
        "calibration file",
        description=" ".join(__doc__.splitlines()) + "\n\n" + INPUT,
        formatter_class=_Paragraphs,
    )
    p.add_argument(
        "measured",
        metavar="MEASURED",
        nargs="?",
        default=None,
        help="a CSV of measurements (its columns: above), runs.csv, a run JSON file or a folder of them "
        "(optional with --nccl-tests)",
    )
    p.add_argument("--topology", required=True, help="the topology the runs ran on (name or YAML path)")
    p.add_argument(
        "--nccl-tests",
        metavar="FILE",
        action="append",
        default=[],
        help="nccl-tests output (all_reduce, all_gather or reduce_scatter _perf: its text, or the CSV form of "
        "experiments/calibration/data), each size a row; repeat for more files (default: none)",
    )
    p.add_argument(
        "--nodes",
        type=setting_type("nodes"),
        default=None,
        help="the nodes an nccl-tests file ran on where it names no ranks (the CSV form; text files have "
        "'# Rank' lines) (default: none)",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="write the calibration file (YAML) here, its folder made if missing; never one of the inputs "
        "(default: none, print the fit only)",
    )
    p.add_argument(
        "--folds",
        type=Count(MAX_FOLDS, 0),
        default=DEFAULT_FOLDS,
        help=f"k of the k-fold cross-validation (0: none; more than the rows: leave-one-out; default: "
        f"leave-one-out below {LEAVE_ONE_OUT_BELOW} rows, else {FOLDS_AT_OR_ABOVE})",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="write a fit at a bound that misses the rows by more than "
        f"{MAX_MAE_AT_BOUND_PCT:g} %%; the file is marked forced and predict warns when it loads it (default: refused)",
    )
    p.add_argument(
        "--params",
        type=str_list,
        default=None,
        help=f"parameters to fit, comma-separated, of {', '.join(NAMES)} (default: {', '.join(DEFAULT_FIT)} to runs, "
        f"{', '.join(NETWORK_FIT)} to nccl-tests files, both to both; those the rows do not determine are held at "
        "their defaults)",
    )
    p.set_defaults(func=_cmd_calibrate)
