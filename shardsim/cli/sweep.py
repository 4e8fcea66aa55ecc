"""`shardsim sweep`: every valid configuration of a scenario, predicted, ranked, recommended.

shardsim sweep                                   # the seed scenario, all strategies
shardsim sweep --strategies ddp,zero2d --degrees 4,8
shardsim sweep --workload gpt-10b --topology p4d.24xlarge --nodes 4,8,16 --precision bf16 --out results/
shardsim sweep --global-batch 512 --nodes 2,4,8   # strong scaling
shardsim sweep --reshard-after-forward true,false --checkpointing full,selective --selective-ac-options op,2
shardsim sweep --batch-per-device 4,8 --grad-accum 1,2          # batch sizes as axes
shardsim sweep --max-batch --global-batch 512                    # the largest micro-batch that fits, per layout
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardsim.config import SCHEDULES, load_config
from shardsim.config.flags import AXES, add_algo_argument, add_axis_arguments, add_config_arguments, overrides_from_args
from shardsim.config.strategy import STRATEGY_FIELDS
from shardsim.core.errors import ConfigError, WriteError
from shardsim.core.flagtypes import Count
from shardsim.simulator.scale import MAX_SWEEP_SPACE, SWEEP_CONFIRM_ABOVE
from shardsim.specs.bounds import MAX_BATCH, MAX_WORLD
from shardsim.sweep.faces import DEFAULT_SWEEP, DEFAULT_SWEEP_TEXT

log = logging.getLogger("shardsim")

MAX_WORKERS = 1_024  # processes --workers may ask for; a sweep starts at most the machine's cores

# the sweep spans these with lists of its own (`flags.AXES`): the strategy's fields and the settings
SPANNED = tuple(s.name for s in AXES)
SETTINGS_LISTED = tuple(k for k in SPANNED if k not in ("strategy", *STRATEGY_FIELDS))
BATCH_LISTED = ("batch_per_device", "grad_accum")  # the batch's settings, listed: `SweepSpace.batch_sizes`, ...
MAX_BATCH_SEARCH = 1_024  # --max-batch alone: the largest micro-batch a search tries


def _build(ns: argparse.Namespace):
    from shardsim.sweep.space import SweepSpace

    overrides: dict[str, Any] = {k: v for k, v in overrides_from_args(ns).items() if k not in SPANNED}
    overrides["topology"] = ns.topology[0] if ns.topology else None  # the first cluster is the base
    overrides["nodes"] = ns.nodes[0] if ns.nodes else None
    for k in BATCH_LISTED:  # the first value is the base's; several are a dimension of the space
        overrides[k] = getattr(ns, k)[0] if getattr(ns, k) else None
    # a setting's first listed value is the base's (a label names the values that differ from it);
    # one value sets the base alone, several are also a dimension of the space
    listed = {k: getattr(ns, k) for k in SETTINGS_LISTED}
    for k, values in listed.items():
        overrides[k] = values[0] if values else None
    float8_list = listed["float8"] and len(listed["float8"]) > 1
    if float8_list and ns.float8_all_gather:  # the tensorwise rows all-gather in float8 (`SweepSpace`)
        overrides["float8_all_gather"] = listed["float8"][0] == "tensorwise"
    base = load_config(ns.config, overrides)
    spanned = {k: values if values and len(values) > 1 else None for k, values in listed.items()}
    space = SweepSpace(
        strategies=ns.strategy or DEFAULT_SWEEP,
        degrees=ns.degree,
        pp=ns.pp,
        microbatches=ns.microbatches,
        schedules=ns.schedule or SCHEDULES,
        stages_per_rank=ns.stages_per_rank,
        topologies=ns.topology,
        nodes=ns.nodes,
        global_batch=ns.global_batch,
        reshard_after_forward=ns.reshard_after_forward,  # a ZeRO-2 base would contradict ddp and pipelines
        tp_degrees=ns.tp,
        sequence_parallel=ns.sequence_parallel,
        cp=ns.cp,
        ep=ns.ep,
        etp=ns.etp,
        checkpointing=spanned["checkpointing"],
        selective_ac_options=spanned["selective_ac_option"],
        reduce_dtypes=spanned["reduce_dtype"],
        optimizer_impls=spanned["optimizer_impl"],
        precisions=spanned["precision"],
        optimizers=spanned["optimizer"],
        attentions=spanned["attention"],
        compile=spanned["compile"],
        float8=spanned["float8"],
        float8_all_gather=bool(float8_list and ns.float8_all_gather),
        mlm_fractions=spanned["mlm_fraction"],
        moe_imbalances=spanned["moe_imbalance"],
        # one batch is the base's, unless a global batch or a search would override it: then it is held to
        batch_sizes=ns.batch_per_device if ns.global_batch or ns.max_batch else _several(ns.batch_per_device),
        grad_accums=_several(ns.grad_accum),
        max_batch=ns.max_batch,
    )
    return base, space


def _several(values: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """A listed flag's values where there are several (one value sets the base alone)."""
    return values if values and len(values) > 1 else None


def _progress_mode(ns: argparse.Namespace):
    """How a sweep shows its progress on stderr: a bar on a terminal, lines with -v elsewhere."""
    if ns.no_progress:
        return None
    if sys.stderr.isatty() and not ns.json and ns.verbose >= ns.quiet:
        return "bar"
    return "lines" if ns.verbose > ns.quiet else None


def _workers(asked: int | None) -> int | None:
    """--workers, capped at the cores this process may run on (with a note when asked for more)."""
    from shardsim.sweep.task import default_workers

    cores = default_workers()
    if asked is not None and asked > cores:
        log.info("--workers %d: this machine has %d cores; the sweep runs %d processes", asked, cores, cores)
        return cores
    return asked


def _confirmation(yes: bool, pruned: bool = False) -> Callable[[int, float], None]:
    """What a sweep of more than `SWEEP_CONFIRM_ABOVE` configurations needs before it starts:
    --yes, or a yes typed on the terminal; its size and estimated time are said first (a pruned
    search's as at most the exhaustive one's: what it simulates is known only as it goes)."""

    def confirm(n: int, seconds: float) -> None:
        from shardsim.sweep.progress import format_duration

        if n <= SWEEP_CONFIRM_ABOVE:
            return
        took = f"{'at most ' if pruned else ''}about {format_duration(seconds)}"
        size = f"{n:,} configurations ({took} on this machine)"
        if yes:
            log.info("sweeping %s", size)
            return
        if sys.stdin is None or not sys.stdin.isatty():
            raise ConfigError(
                f"a sweep of {size} needs --yes to start (over {SWEEP_CONFIRM_ABOVE:,} configurations, "
                "and stdin is not a terminal to ask)"
            )
        sys.stderr.write(f"shardsim: a sweep of {size} (over {SWEEP_CONFIRM_ABOVE:,}); start it? [y/N] ")
        sys.stderr.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            raise ConfigError(f"the sweep of {n:,} configurations was not started (--yes starts it without asking)")

    return confirm


def _cache(ns: argparse.Namespace):
    """The result cache the sweep reads and writes (--cache-dir; none with --no-cache)."""
    if ns.no_cache:
        return contextlib.nullcontext()
    from shardsim.sweep.cache import ResultCache

    return ResultCache(ns.cache_dir)


def _executor(ns: argparse.Namespace):
    """Where the predictions run: None here (--executor local), or a `RayExecutor`."""
    if ns.executor != "ray":
        return contextlib.nullcontext()
    from shardsim.sweep.ray_executor import RayExecutor

    return RayExecutor(ns.address, _workers(ns.workers) if ns.address is None else None)


def _report_dropped(result) -> None:
    """What the requested space holds that the simulator cannot do, on stderr: one line with a
    count per kind of reason; with -v, a line per reason."""
    line = result.dropped_line()
    if line is None:
        return
    listed = log.isEnabledFor(logging.DEBUG)
    log.info("%s%s", line, "" if listed else " (-v lists them)")
    for why, n in result.dropped.items():
        log.debug("dropped %d configuration%s: %s", n, "s" if n > 1 else "", why)


def _cmd_sweep(ns: argparse.Namespace) -> int:
    from shardsim.sweep.output import sweep_folder

    if ns.address is not None and ns.executor != "ray":
        raise ConfigError("--address names a Ray cluster: it needs --executor ray", field="address")
    if ns.force and not ns.out:
        raise ConfigError("--force lets --out write into a folder of other files: it needs --out", field="force")
    if ns.executor == "ray":
        from shardsim.sweep.ray_executor import require_ray

        require_ray()  # one line naming the extra, before any work
    base, space = _build(ns)
    if base.calibration:
        from shardsim.simulator.calibration.apply import load_calibration

        load_calibration(base.calibration)  # read (and a forced one told) once, before the workers fork
    folder = None
    if ns.out:
        from shardsim.cli.inputs import config_inputs

        inputs = config_inputs(ns, base, *(ns.topology or ()))
        folder = sweep_folder(ns.out, ns.command_line, force=ns.force, inputs=inputs)
    with folder or contextlib.nullcontext() as out:
        return _sweep(ns, base, space, out)


def _attention_choices(table: Any, base: Any) -> list[tuple[str, str]]:
    """The (attention, precision) pairs of the rows a sweep ran (a column the table leaves out,
    a setting no row varies: the base's)."""
    n = len(table)
    attention = table["attention"] if "attention" in table else [base.attention] * n
    precision = table["precision"] if "precision" in table else [base.precision] * n
    return list(zip(attention, precision, strict=True))


def _pruned(ns: argparse.Namespace) -> bool:
    """Prune the search? Where the table's leading rows are printed, with --out or not (they, the
    recommendation, the scaling tables and the plotted rows are the exhaustive search's; the files
    hold every row, a pruned one with its bound and why), or when asked; never with --top 0
    (every row shown), --json (every row's figures) unless --prune, or --exhaustive."""
    if ns.top == 0 or ns.exhaustive:
        return False
    return ns.prune or not ns.json


def _sweep(ns: argparse.Namespace, base, space, out: Path | None) -> int:
    from shardsim.report.tables import print_report
    from shardsim.simulator.attention_impl import warn_slower_rates
    from shardsim.sweep.output import publish, to_records, write_recommendation, write_tables
    from shardsim.sweep.progress import SweepProgress
    from shardsim.sweep.search import sweep

    with _cache(ns) as cache, _executor(ns) as executor, SweepProgress(_progress_mode(ns)) as progress:
        result = sweep(
            base,
            space,
            algo=ns.algo,
            workers=None if executor is not None else _workers(ns.workers),
            progress=progress,
            confirm=_confirmation(ns.yes, _pruned(ns)),
            prune=_pruned(ns),
            keep=max(ns.top, 2),
            plots=bool(ns.out) and not ns.no_plots,
            cache=cache,
            executor=executor,
        )
        if cache is not None and cache.usable:  # an unusable one said so, once
            # a line where the cache served something (-v: always); a first sweep stays quiet
            say = log.info if cache.hits else log.debug
            say("cache: %d hits, %d simulated", cache.hits, cache.simulated)
    _report_dropped(result)
    warn_slower_rates(_attention_choices(result.table, base))
    if (line := result.pruned_line()) and not ns.json:
        log.info("%s", line)
    df, rec, skipped = result.table, result.recommendation, list(result.skipped)
    files: list[str] = []
    failed: WriteError | None = None
    if out is not None:
        from shardsim.report.html_page import write_html_report
        from shardsim.report.plots import plot_all

        def make(folder: Path) -> list[Path]:
            made = [*write_tables(df, folder), write_recommendation(rec, folder)]
            if ns.no_plots:
                return made
            plots = plot_all(df, folder)
            return [*made, *plots, write_html_report(df, rec, folder, plots, ns.command_line)]

        try:
            files = [str(p) for p in publish(out, ns.command_line, make)]
        except WriteError as exc:  # the results are printed all the same, and the files that were written
            failed, files = exc, [str(out / name) for name in exc.written]
    if ns.json:
        record = {
            "rows": to_records(df),
            "recommended": rec,
            "skipped": skipped,
            "dropped": result.dropped,
            "pruned": result.pruned,
            "files": files,
        }
        print(json.dumps(record))
    else:
        kw = {"global_batch": ns.global_batch, "top": ns.top, "skipped": skipped, "files": files, "wide": ns.wide}
        kw["max_batch"] = ns.max_batch
        print_report(df, rec, base, out_dir=ns.out, **kw)
    if failed is not None:  # the results are printed all the same; the line says which files are missing
        raise failed
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="predict every valid configuration and recommend one (default: the seed scenario)",
        description="Enumerate ddp, zero, zero2d at every degree, pipelines (x sharding) at every valid degree, "
        "microbatch count and schedule; predict each; rank; recommend. Lists are comma-separated. Settings listed "
        "with several values (ZeRO-2, checkpointing, reduce dtype, Adam's implementation) multiply the space; "
        "the first is the base's and a configuration's label names those that differ from it.",
    )
    add_config_arguments(
        p,
        exclude=SPANNED,
        listed=("topology", "nodes", *BATCH_LISTED),
        config_help="YAML config file: workload, topology, nodes, batch... (flags override)",
    )
    p.add_argument(
        "--global-batch",
        type=Count(MAX_BATCH * MAX_WORLD),
        dest="global_batch",
        help="strong scaling: one global batch on every cluster, batch per device = N / (world / tp x grad_accum), "
        "or with --batch-per-device grad_accum = N / (world / tp x batch) (default: each cluster's data-parallel "
        "layout's, batch per device x world x grad_accum, run by every layout of it: weak scaling across clusters; "
        "with lists of batches, each row's own)",
    )
    p.add_argument(
        "--max-batch",
        type=Count(MAX_BATCH),
        nargs="?",
        const=MAX_BATCH_SEARCH,
        metavar="N",
        help="per configuration, the largest batch per device that fits in memory, up to N (default N: "
        f"{MAX_BATCH_SEARCH:,}), found by the memory model (doubling, then bisection) and predicted at it; with "
        "--global-batch, grad_accum makes up the rest (default: none, --batch-per-device)",
    )
    add_axis_arguments(p, {"strategies": DEFAULT_SWEEP_TEXT})
    add_algo_argument(p, auto=True)
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write sweep.csv, sweep.parquet, recommended.json, plots and manifest.json here (made if missing), in "
        "place of the files of the sweep its manifest names; one sweep at a time; a folder that holds files and no "
        "manifest is refused (default: none, print only)",
    )
    p.add_argument("--no-plots", action="store_true", help="with --out: tables only")
    p.add_argument(
        "--force",
        action="store_true",
        help="with --out: write into a folder that holds files and no sweep manifest, replacing those of the "
        "sweep's names (default: refused)",
    )
    search = p.add_mutually_exclusive_group()
    search.add_argument(
        "--prune",
        action="store_true",
        help="a pruned search with --json too: its recommendation, leading --top rows and plotted rows "
        "are the exhaustive search's, the rows pruned have no times (default: pruned when the table is printed, "
        "with --out too, whose files give a pruned row's bound and why; exhaustive with --json or --top 0)",
    )
    search.add_argument(
        "--exhaustive", action="store_true", help="simulate every configuration that fits, whatever is printed"
    )
    p.add_argument("--json", action="store_true", help='print {"rows": [...], "recommended": {...}}')
    p.add_argument(
        "--top",
        type=Count(MAX_SWEEP_SPACE, 0),
        default=25,
        help="rows shown in the table (0: all; default: %(default)s)",
    )
    p.add_argument(
        "--wide",
        action="store_true",
        help="every column of the table whatever the width (default: the breakdown columns are left out, "
        "with a note, where the table would not fit COLUMNS or the terminal)",
    )
    p.add_argument(
        "--workers",
        type=Count(MAX_WORKERS),
        default=None,
        help="processes, at most the machine's cores (default: the machine's cores)",
    )
    p.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where the predictions run: local processes, or Ray tasks (pip install 'shardsim[ray]'; a local Ray "
        "instance of --workers CPUs unless --address names a cluster) (default: %(default)s)",
    )
    p.add_argument(
        "--address",
        metavar="ADDR",
        default=None,
        help="with --executor ray: the Ray cluster to run on (ray://head:10001, auto) (default: a local instance)",
    )
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=None,
        help="the result cache's folder (default: $SHARDSIM_CACHE_DIR, else $XDG_CACHE_HOME/shardsim, else "
        "~/.cache/shardsim)",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="predict every configuration, reading and writing no cached row (default: rows cached by configuration "
        "are reused)",
    )
    p.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help=f"start a sweep of more than {SWEEP_CONFIRM_ABOVE:,} configurations without asking (default: ask on a "
        "terminal, refuse elsewhere)",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress on stderr (by default a bar with the time left on a terminal; lines with -v elsewhere)",
    )
    p.set_defaults(func=_cmd_sweep)
