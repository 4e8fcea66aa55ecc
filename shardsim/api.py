"""The public API, what `import shardsim` gives: load a configuration, predict a step, sweep a
space and recommend, calibrate to measurements, time a collective (docs/api.md).

Each function takes what the command of the same name takes, as Python values, and checks it as
the command does: bad input is one `ConfigError` naming the field. A configuration is given one
way at a time: a `RunConfig` is complete, so settings beside one are refused; a file path or a
mapping of settings takes keyword settings over it, as a file takes flags.

This module imports only the error type at import time; the simulator (simpy, numpy), pandas
and scipy are imported by the function that needs them.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from os import PathLike
from typing import TYPE_CHECKING, Any

from shardsim.core.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from shardsim.config import RunConfig
    from shardsim.simulator.calibration.calibrate import CalibrationResult
    from shardsim.simulator.collective import CollectiveResult
    from shardsim.simulator.predict import StepPrediction
    from shardsim.sweep.recommendation import Recommendation
    from shardsim.sweep.search import SweepResult
    from shardsim.sweep.space import SweepSpace


def _unknown(name: str, known: Iterable[str], what: str, field: str | None = None) -> ConfigError:
    near = difflib.get_close_matches(name, list(known), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else f"; expected one of {', '.join(known)}"
    return ConfigError(f"unknown {what}{hint}", field=field or name)


def _merged(mapping: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping of settings and keyword settings as one; a key the two give different values is refused."""
    for k, v in settings.items():
        if k in mapping and mapping[k] is not None and v is not None and mapping[k] != v:
            raise ConfigError(f"given twice: {mapping[k]!r} in the mapping, {v!r} as a keyword", field=k)
    return {**mapping, **settings}


def _flat_strategy(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` with a ``strategy`` given as a mapping (``{"kind": "pipeline", "pp": 2}``, as
    a file's strategy block) or a `Strategy` as the flat keys a flag gives (``strategy``,
    ``pp``, ...); a key of it that is no strategy field, or given flat too with another value, is refused."""
    from shardsim.config.strategy import STRATEGY_FIELDS, StrategyBase

    strategy = settings.get("strategy")
    if isinstance(strategy, StrategyBase):
        strategy = strategy.model_dump()
    if not isinstance(strategy, Mapping):
        return dict(settings)
    for k in strategy:
        if k not in ("kind", *STRATEGY_FIELDS):
            raise _unknown(str(k), ("kind", *STRATEGY_FIELDS), "strategy field", f"strategy.{k}")
    flat = {("strategy" if k == "kind" else k): v for k, v in strategy.items()}
    rest = {k: v for k, v in settings.items() if k != "strategy"}
    return _merged(flat, rest)


def load_config(
    path: str | PathLike | None = None, overrides: Mapping[str, Any] | None = None, /, **settings: Any
) -> RunConfig:
    """A checked configuration: the file at `path` (YAML; SageMaker keys accepted; default: the
    seed scenario's defaults), with `overrides` and keyword `settings` over it (the file's flat
    keys: ``workload``, ``topology``, ``nodes``, ``strategy``, ``degree``, ``batch_per_device``,
    ...; None leaves a key as the file has it), exactly as the command line's flags override it.
    ``strategy`` may be a name, a mapping as a file's strategy block, or a `Strategy`."""
    from shardsim.config import load_config as load

    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(f"expected a mapping of settings, got {type(overrides).__name__}", field="overrides")
    if path is not None and not isinstance(path, str | PathLike):
        raise ConfigError(f"expected a file path, got {type(path).__name__}", field="path")
    return load(path, _merged(_flat_strategy(overrides or {}), _flat_strategy(settings)))


def _config_of(config: Any = None, settings: Mapping[str, Any] | None = None) -> RunConfig:
    """The `RunConfig` that `config` (a RunConfig, a file path, a mapping of settings or None: the
    seed scenario) and keyword `settings` describe. Settings beside a RunConfig are refused: it
    is complete, and a value beside it could only repeat or contradict it."""
    from shardsim.config import RunConfig

    settings = dict(settings or {})
    if isinstance(config, RunConfig):
        if settings:
            first = next(iter(settings))
            raise ConfigError(
                "a RunConfig is complete: give settings to load_config(path, ...) or with a path or a mapping, "
                "not beside a RunConfig",
                field=first,
            )
        return config
    if config is None or isinstance(config, str | PathLike):
        return load_config(config, settings)
    if isinstance(config, Mapping):
        return load_config(None, _merged(config, settings))
    why = f"expected a RunConfig, a file path or a mapping of settings, got {type(config).__name__}"
    raise ConfigError(why, field="config")


def _algo(algo: Any) -> str:
    from shardsim.config.schema import ALGOS

    if algo not in ("auto", *ALGOS):
        raise ConfigError(f"expected one of auto, {', '.join(ALGOS)}, got {algo!r}", field="algo")
    return algo


def _path(value: Any, field: str) -> str | None:
    """A file path given as `str` or `PathLike` (None: none)."""
    if value is None:
        return None
    if not isinstance(value, str | PathLike):
        raise ConfigError(f"expected a file path, got {type(value).__name__}", field=field)
    return str(value)


def _count(value: Any, field: str, minimum: int = 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"expected an integer >= {minimum}, got {value!r}", field=field)
    return value


def predict(
    config: Any = None, /, *, algo: str = "auto", trace: str | PathLike | None = None, **settings: Any
) -> StepPrediction:
    """One optimizer step of a configuration, predicted (`StepPrediction`: step time,
    breakdown, memory per rank and whether it fits, collectives, throughput, MFU).

    config: a `RunConfig`, a configuration file, a mapping of settings, or None (the seed
    scenario); settings: keyword settings over a file or mapping (refused beside a RunConfig);
    algo: the collective algorithm (auto, ring, tree, hierarchical); trace: a Chrome trace
    file of the step to write (its folder made if missing; never the configuration file)."""
    from shardsim.core.files import check_output_file, input_files
    from shardsim.simulator.predict import predict as simulate
    from shardsim.simulator.predict import save_trace

    cfg = _config_of(config, settings)
    algo = _algo(algo)
    trace = _path(trace, "trace")
    if trace is not None:
        check_output_file(str(trace), "trace", inputs=input_files(config))
    pred = simulate(cfg, algo=algo)
    if trace is not None:
        save_trace(pred, trace)
    return pred


SCALAR_AXES = ("global_batch", "max_batch", "hold_global_batch")  # a sweep's axes that take one value, not a list


def _space(space: Any, axes: Mapping[str, Any]) -> SweepSpace:
    """The sweep's space: a `SweepSpace`, a mapping of its axes, or keyword axes (not two of them)."""
    from dataclasses import fields

    from shardsim.sweep.space import SweepSpace

    if space is not None and axes:
        raise ConfigError("give the space or its axes as keywords, not both", field=next(iter(axes)))
    if isinstance(space, SweepSpace):
        return space
    if space is not None and not isinstance(space, Mapping):
        raise ConfigError(f"expected a SweepSpace or a mapping of its axes, got {type(space).__name__}", field="space")
    given = dict(space or axes)
    names = [f.name for f in fields(SweepSpace)]
    for k, v in given.items():
        if not isinstance(k, str) or k not in names:
            raise _unknown(str(k), names, "sweep axis")
        if v is None:  # left out
            continue
        if k in SCALAR_AXES:  # one number; a list of one is that number
            if isinstance(v, list | tuple):
                if len(v) != 1:
                    raise ConfigError(f"expected one number (or a list of one), got {v!r}", field=k)
                given[k] = v[0]
        elif isinstance(v, Mapping) or not isinstance(v, Iterable) or isinstance(v, str):
            given[k] = (v,)  # a list axis: one value is a list of one
        else:
            given[k] = tuple(v)
    return SweepSpace(**{k: v for k, v in given.items() if v is not None})


def _takes_three(f: Any) -> bool:
    """Whether `f` can be called with three positional arguments."""
    import inspect

    if not callable(f):
        return False
    try:
        inspect.signature(f).bind(0, 0, 0.0)
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins): called as it is
        return True
    return True


def sweep(
    config: Any = None,
    space: SweepSpace | Mapping[str, Any] | None = None,
    /,
    *,
    algo: str = "auto",
    workers: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    **axes: Any,
) -> SweepResult:
    """Every valid configuration of a space around a base configuration, predicted, ranked and
    recommended (`SweepResult`: `table`, `recommendation`, `skipped`, `dropped`).

    config: the base, as `predict` takes it (a RunConfig, a file, a mapping of settings, None:
    the seed scenario); space: a `SweepSpace` or a mapping of its axes, or the axes as keywords
    (``strategies``, ``degrees``, ``pp``, ``microbatches``, ``schedules``, ``topologies``,
    ``nodes``, ``global_batch``, ``reshard_after_forward``, ``checkpointing``,
    ``selective_ac_options``, ``reduce_dtypes``, ``optimizer_impls``, ``precisions``,
    ``optimizers``, ``attentions``, ``compile``, ``mlm_fractions``, ``batch_sizes``,
    ``grad_accums``, ``max_batch``, ``tp_degrees``, ``cp``, ``hold_global_batch``; a list each, one value
    being a list of one, but ``global_batch``, ``max_batch`` (one number) and ``hold_global_batch``
    (true, the default: every layout at the data-parallel layout's global batch); an axis left out:
    every valid value, or the base's setting); algo: as `predict` takes it; workers:
    processes (default: the machine's cores, serial when the sweep is small); progress:
    called as ``progress(done, total, share_of_work_done)``."""
    from shardsim.sweep.search import sweep as run

    base = _config_of(config)
    sp = _space(space, axes)
    algo = _algo(algo)
    workers = _count(workers, "workers")
    if progress is not None and not _takes_three(progress):
        raise ConfigError(f"expected a function progress(done, total, work), got {progress!r}", field="progress")
    return run(base, sp, algo=algo, workers=workers, progress=progress)


# The columns `recommend` reads, by the type a sweep's table holds there
TEXT_COLUMNS = ("topology", "label", "strategy_kind")
NUMBER_COLUMNS = (
    "nodes",
    "world",
    "strategy_degree",
    "samples_per_s",
    "memory_required_gib",
    "device_memory_gib",
    "cost_per_million_samples_usd",
)


def _check_columns(table: pd.DataFrame) -> None:
    """Each column `recommend` reads holds what a sweep's table holds there: `fits` True or
    False, numbers (NaN where none) and text; else one ConfigError naming the column."""
    from pandas.api import types

    def refuse(col: str, what: str) -> ConfigError:
        shown = table[col].iloc[0]
        return ConfigError(f"expected {what} in every row, got {table[col].dtype} (e.g. {shown!r})", field=col)

    if not types.is_bool_dtype(table["fits"]):
        raise refuse("fits", "True or False")
    for col in NUMBER_COLUMNS:
        if types.is_bool_dtype(table[col]) or not types.is_numeric_dtype(table[col]):
            raise refuse(col, "numbers")
    for col in TEXT_COLUMNS:
        if not table[col].map(lambda v: isinstance(v, str)).all():
            raise refuse(col, "text")


def recommend(table_or_result: pd.DataFrame | SweepResult, library: str | None = None) -> Recommendation:
    """What to use, from a sweep's table (or a `SweepResult`: its table), never a configuration
    that does not fit: `sharded_data_parallel_degree`, `best`, `runner_up`, `margin`, `sdp`,
    `cheapest`, `reason` (and `clusters` over several clusters). A table filtered from a
    sweep's works: the recommendation over the rows kept. `library`: the one the table's rows
    ran (the model's error is the device's with it; default: a SweepResult's, else pytorch)."""
    import pandas as pd

    from shardsim.sweep.recommendation import recommend as rec
    from shardsim.sweep.search import SweepResult

    table = table_or_result.table if isinstance(table_or_result, SweepResult) else table_or_result
    if library is None:
        library = table_or_result.library if isinstance(table_or_result, SweepResult) else "pytorch"
    if not isinstance(table, pd.DataFrame):
        why = f"expected a sweep's table (a pandas DataFrame) or a SweepResult, got {type(table).__name__}"
        raise ConfigError(why, field="table")
    for col in (*TEXT_COLUMNS, *NUMBER_COLUMNS, "fits"):
        if col not in table.columns:
            raise ConfigError("the table lacks this column of a sweep's table", field=col)
    if table.empty:
        raise ConfigError("no rows: nothing to recommend", field="table")
    _check_columns(table)
    return rec(table, library)


def _paths(value: Any, field: str) -> tuple[str, ...]:
    """File paths given as one path or an iterable of paths (None: none)."""
    if value is None:
        return ()
    if isinstance(value, str | PathLike):
        return (str(value),)
    if isinstance(value, Iterable) and not isinstance(value, Mapping):
        items = tuple(value)
        if all(isinstance(v, str | PathLike) for v in items):
            return tuple(str(v) for v in items)
    raise ConfigError(f"expected a file path or a list of them, got {value!r}", field=field)


def calibrate(
    measurements: str | PathLike | pd.DataFrame | None,
    topology: str,
    *,
    params: str | Iterable[str] | None = None,
    folds: int | None = None,
    force: bool = False,
    out: str | PathLike | None = None,
    nccl_tests: str | PathLike | Iterable[str | PathLike] | None = None,
    nodes: int | None = None,
) -> CalibrationResult:
    """The model's named parameters fitted to measured runs and nccl-tests output
    (`CalibrationResult`: `values`, `fit`, `errors` before / after / cross-validated,
    `calibration`), as `shardsim calibrate`.

    measurements: a CSV of measurements, a runs.csv, a run JSON file or a folder of them, or a
    pandas DataFrame with a CSV's columns (e.g. some rows of one); None with `nccl_tests`;
    topology: the topology they ran on (a name or YAML path); params: the parameters to fit
    (default: `parameters.DEFAULT_FIT` to runs, `parameters.NETWORK_FIT` to nccl-tests files);
    folds: k of the k-fold cross-validation (0: none; default: leave-one-out below 10 rows, else
    5; more than the rows: leave-one-out); force: keep a fit at a bound that misses the rows by
    far (marked forced); out: write the calibration file (YAML) that predict, sweep
    and validate take as ``calibration``; nccl_tests: nccl-tests output files (one path or
    several), each size a row; nodes: the nodes of a file that names no ranks (the CSV form)."""
    import pandas as pd

    from shardsim.core.files import check_output_file, input_files
    from shardsim.simulator.calibration.apply import write_calibration
    from shardsim.simulator.calibration.calibrate import DEFAULT_FOLDS
    from shardsim.simulator.calibration.calibrate import calibrate as fit

    if measurements is not None and not isinstance(measurements, str | PathLike | pd.DataFrame):
        why = f"expected a file or folder path or a pandas DataFrame, got {type(measurements).__name__}"
        raise ConfigError(why, field="measurements")
    if not isinstance(topology, str):
        raise ConfigError(f"expected a topology name or YAML path, got {type(topology).__name__}", field="topology")
    files = _paths(nccl_tests, "nccl_tests")
    if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1):
        raise ConfigError(f"expected a node count of 1 or more, got {nodes!r}", field="nodes")
    if params is None:
        names = None
    elif isinstance(params, str):
        names = tuple(p.strip() for p in params.split(",") if p.strip())
    elif isinstance(params, Iterable) and not isinstance(params, Mapping):
        names = tuple(params)
    else:
        names = ()
    if names is not None and (not names or not all(isinstance(n, str) for n in names)):
        raise ConfigError(f"expected parameter names, got {params!r}", field="params")
    if folds is not None and (isinstance(folds, bool) or not isinstance(folds, int)):
        raise ConfigError(f"expected an integer (0: no cross-validation), got {folds!r}", field="folds")
    if not isinstance(force, bool):
        raise ConfigError(f"expected True or False, got {force!r}", field="force")
    out = _path(out, "out")
    if out is not None:
        check_output_file(str(out), "out", inputs=input_files(measurements, topology, *files))
    folds = DEFAULT_FOLDS if folds is None else folds
    source = measurements if isinstance(measurements, pd.DataFrame) or measurements is None else str(measurements)
    result = fit(source, topology, params=names, folds=folds, force=force, nccl_tests=files, nodes=nodes)
    if out is not None:
        write_calibration(out, result.calibration)
    return result


def collective(
    op: str = "all_reduce",
    size: int | str = "1GiB",
    *,
    topology: str = "p4d.24xlarge",
    nodes: int | None = None,
    algo: str = "auto",
    backend: str = "nccl",
    ranks: int | None = None,
) -> CollectiveResult:
    """One collective on a cluster, timed as nccl-tests reports it (`CollectiveResult`: time,
    algbw, busbw, the algorithm used), as `shardsim collective`.

    op: all_reduce, all_gather, reduce_scatter, broadcast, send_recv or all_to_all; size: bytes, or text
    such as ``1GiB`` or ``25MB``; nodes: default 1, or an emulated topology's count; ranks: the
    first N ranks of the cluster (default: all)."""
    from shardsim.config.schema import BACKENDS
    from shardsim.core.units import format_bytes, parse_size
    from shardsim.simulator.collective import OPS, simulate_collective
    from shardsim.simulator.scale import MAX_MESSAGE_BYTES
    from shardsim.specs.hardware.topology import make_cluster

    if op not in OPS:
        raise ConfigError(f"expected one of {', '.join(OPS)}, got {op!r}", field="op")
    nbytes = parse_size(size, field="size")
    if not 1 <= nbytes <= MAX_MESSAGE_BYTES:
        raise ConfigError(f"expected 1 byte to {format_bytes(MAX_MESSAGE_BYTES)}, got {size!r}", field="size")
    if backend not in BACKENDS:
        raise ConfigError(f"expected one of {', '.join(BACKENDS)}, got {backend!r}", field="backend")
    if not isinstance(topology, str):
        raise ConfigError(f"expected a topology name or YAML path, got {type(topology).__name__}", field="topology")
    cluster = make_cluster(topology, _count(nodes, "nodes"))
    return simulate_collective(cluster, op, nbytes, _algo(algo), backend, _count(ranks, "ranks", 2))
