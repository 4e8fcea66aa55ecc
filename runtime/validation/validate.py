"""`shardsim validate`: predicted vs measured step times on emulated clusters.

A *matrix* names a workload and its settings, and per emulated topology the configurations
to check. For every configuration the runtime runs it for real inside the emulated cluster
(a network namespace per node, tc-shaped NICs), the simulator predicts it from a measured
profile (blocks at each microbatch size, the cluster's links, the cores its ranks really
get), and the two are compared: error % per row, the mean absolute percentage error, the
largest error, and per topology whether the predicted-best configuration and the
predicted-best sharded data-parallel degree are the measured-best ones.

Quiet steps: this VM's hypervisor runs other guests on its cores for minutes at a time (up to
45 % of their time in a run), which measures them as much as the configuration. A step in
which it took more than `max_steal` of the cores' time is set aside; a configuration with
fewer than half its steps quiet is run again after the others, at most `retries` more times,
and its quiet steps of every attempt are what is measured. One that never gets them is
measured over all its steps, predicted with the steal taken off the cores, and marked.

Resumable: every finished run is written at once (``validation.json``, ``validation.csv``);
a second call runs only what is missing, failed or still owed a quiet attempt, and
re-predicts every row (cheap), so a better model re-scores old measurements without running
them again.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from shardsim.runtime.hostspeed import QUIET_STEAL_SHARE
from shardsim.simulator.config import STRATEGIES, RunConfig, build_config, resolve
from shardsim.simulator.errors import ConfigError
from shardsim.simulator.hardware.topology import make_cluster
from shardsim.simulator.yamlio import load_yaml

MATRICES = Path(str(resources.files("shardsim.runtime.validation") / "matrices"))
DEFAULT_MATRIX = MATRICES / "default.yaml"
_BASE_KEYS = ("workload", "batch_per_device", "grad_accum", "precision", "checkpointing", "backend", "seed")
_RUN_KEYS = ("steps", "warmup", "timeout", "max_steal", "retries")
RETRY_PAUSE_S = 30.0  # before another round of a topology's stolen configurations: the hypervisor's turns last minutes
_STRATEGY_KEYS = ("strategy", "degree", "pp", "microbatches", "schedule")


@dataclass(frozen=True)
class Matrix:
    path: str
    base: dict[str, Any]  # config fields shared by every row (workload, batch, precision, ...)
    topologies: tuple[tuple[str, tuple[RunConfig, ...]], ...]  # per topology, its checked configurations
    steps: int = 4
    warmup: int = 1
    timeout: float = 60.0
    max_steal: float = QUIET_STEAL_SHARE  # a step where the hypervisor took more of the cores' time is set aside
    retries: int = 2  # more attempts at a configuration with fewer than half its steps quiet

    @property
    def quiet_steps_needed(self) -> int:
        return max(1, math.ceil(self.steps / 2))

    @property
    def configs(self) -> list[RunConfig]:
        return [c for _, cs in self.topologies for c in cs]

    def microbatch_sizes(self) -> list[int]:
        """Every microbatch size a row runs (the profile times each)."""
        out = set()
        for cfg in self.configs:
            cluster = make_cluster(cfg.topology, cfg.nodes)
            out.add(_resolve(cfg, cluster.world)[1].microbatch_size)
        return sorted(out)


def _resolve(cfg: RunConfig, world: int):
    from shardsim.runtime.models.build import n_blocks

    return resolve(cfg, world, n_blocks(cfg.workload, pipeline=cfg.strategy.kind == "pipeline"))


def _expand(entry: Any, world: int, where: str, key: str) -> list[dict[str, Any]]:
    """One matrix entry → strategy fields. Shorthands: ddp, zero, zero2d (every degree strictly
    between 1 and the world), pipeline (pp 2, microbatches 2·pp, gpipe and 1f1b)."""
    if isinstance(entry, str):
        if entry not in STRATEGIES:
            raise ConfigError(
                f"unknown strategy {entry!r}; expected one of {', '.join(STRATEGIES)}", where=where, field=key
            )
        if entry == "zero2d":
            return [{"strategy": "zero2d", "degree": d} for d in range(2, world) if world % d == 0]
        if entry == "pipeline":
            return [{"strategy": "pipeline", "pp": 2, "microbatches": 4, "schedule": s} for s in ("gpipe", "1f1b")]
        return [{"strategy": entry}]
    if isinstance(entry, dict):
        unknown = sorted(set(entry) - set(_STRATEGY_KEYS))
        if unknown:
            raise ConfigError(
                f"unknown key; expected {', '.join(_STRATEGY_KEYS)}", where=where, field=f"{key}.{unknown[0]}"
            )
        return [dict(entry)]
    raise ConfigError(f"expected a strategy name or a mapping, got {entry!r}", where=where, field=key)


def load_matrix(path: str | Path | None = None) -> Matrix:
    """Read and check a matrix file (default: the shipped one). Every configuration is resolved
    against its cluster here, so bad input fails before anything runs."""
    p = Path(path) if path is not None else DEFAULT_MATRIX
    where = str(p)
    data = load_yaml(p)
    unknown = sorted(set(data) - set(_BASE_KEYS) - set(_RUN_KEYS) - {"topologies", "description"})
    if unknown:
        raise ConfigError(
            f"unknown key; expected {', '.join(_BASE_KEYS + _RUN_KEYS)} or topologies", where=where, field=unknown[0]
        )
    base = {k: data[k] for k in _BASE_KEYS if k in data}
    base.setdefault("backend", "gloo")
    tops = data.get("topologies")
    if not isinstance(tops, dict) or not tops:
        raise ConfigError("expected a mapping of emulated topology → configurations", where=where, field="topologies")
    out = []
    for top, entries in tops.items():
        key = f"topologies.{top}"
        try:
            cluster = make_cluster(str(top))
        except ConfigError as exc:
            raise ConfigError(exc.message, where=where, field=key) from None
        if cluster.instance.emulated is None:
            raise ConfigError(
                f"topology {top!r} is not emulated; validate runs on emulated clusters", where=where, field=key
            )
        if not isinstance(entries, list) or not entries:
            raise ConfigError("expected a list of configurations", where=where, field=key)
        cfgs: list[RunConfig] = []
        for i, entry in enumerate(entries):
            for fields in _expand(entry, cluster.world, where, f"{key}[{i}]"):
                at = f"{key}[{i}]"
                try:
                    cfg = build_config(
                        {**base, **fields, "topology": str(top), "nodes": cluster.nodes}, f"{where} {at}"
                    )
                    cfg = _resolve(cfg, cluster.world)[0]
                except ConfigError as exc:
                    if exc.where is not None:
                        raise
                    raise ConfigError(exc.message, where=where, field=exc.field or at) from None
                if cfg not in cfgs:
                    cfgs.append(cfg)
        out.append((str(top), tuple(cfgs)))
    run = {}
    for k, kind, low in (("steps", int, 1), ("warmup", int, 0), ("timeout", float, 1), ("retries", int, 0)):
        if k in data:
            v = data[k]
            if isinstance(v, bool) or not isinstance(v, int | float) or v < low or (kind is int and v != int(v)):
                what = "a whole number" if kind is int else "a number"
                raise ConfigError(f"expected {what} >= {low}, got {v!r}", where=where, field=k)
            run[k] = kind(v)
    if "max_steal" in data:
        run["max_steal"] = steal_bound(data["max_steal"], where, "max_steal")
    return Matrix(where, base, tuple(out), **run)


def steal_bound(v: Any, where: str | None, name: str) -> float:
    """A part of the host's cores' time, 0 < v <= 1 (the quiet-step bound)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
        raise ConfigError(f"expected a part of the cores' time, 0 < {name} <= 1, got {v!r}", where=where, field=name)
    return float(v)


# -- rows ------------------------------------------------------------------------------------


@dataclass
class Row:
    topology: str
    config: str  # the strategy label
    strategy: str
    degree: int
    pp: int
    microbatches: int
    schedule: str
    world: int
    predicted_s: float = math.nan
    measured_s: float = math.nan
    error_pct: float = math.nan  # (predicted - measured) / measured
    measured_min_s: float = math.nan
    measured_max_s: float = math.nan
    step_times_s: list[float] = field(default_factory=list)
    predicted_compute_s: float = math.nan
    predicted_comm_s: float = math.nan
    predicted_memory_gib: float = math.nan
    measured_memory_gib: float = math.nan
    status: str = "pending"  # ok | failed: <why>
    run_id: str = ""
    host_slowdown: float = 1.0  # the host's speed the prediction assumes, over its speed when profiled
    host_slowdown_before: float = math.nan  # the yardstick just before the run / when profiled
    host_slowdown_after: float = math.nan  # ... and just after it (NaN: not timed)
    host_probe_s: float = math.nan  # runtime.hostspeed's probe on every rank before every measured step
    host_speed_from: str = ""  # probe: the run's own probe | yardstick: the validation's pooled yardsticks
    host_steal_share: float = math.nan  # the part of the host's cores' time the hypervisor took (hostspeed.Steal)
    steps_kept: int = 0  # measured steps where it took at most the matrix's max_steal (what measured_s is of)
    host_quiet: bool = True  # quiet steps (of every attempt) >= half a run's; else all measured, steal corrected
    attempts: int = 0  # runs of this configuration
    run_ids: list[str] = field(default_factory=list)  # every attempt's run; run_id is the last
    step_steal_share: list[float] = field(default_factory=list)  # per step of every attempt, as step_times_s
    step_probe_s: list[float] = field(default_factory=list)  # the probe before each step (mean over ranks)

    @property
    def key(self) -> tuple[str, str]:
        return (self.topology, self.config)


def _row_for(cfg: RunConfig, world: int) -> Row:
    s = cfg.strategy
    degree = 1 if s.kind == "ddp" else (s.degree or 1)
    return Row(cfg.topology, s.label(), s.kind, degree, s.pp, s.microbatches, s.schedule, world)


def add_attempt(row: Row, result: dict[str, Any]) -> None:
    """Append one run's measured steps, and the host's readings in each, to `row`."""
    times = [float(t) for t in result["step_times_s"]]
    n = len(times)
    steal = result.get("host_steal_share_by_step") or [result.get("host_steal_share", math.nan)] * n
    probe = result.get("host_probe_by_step_s") or [result.get("host_probe_s") or math.nan] * n
    row.step_times_s += times
    row.step_steal_share += [math.nan if v is None else float(v) for v in steal]
    row.step_probe_s += [math.nan if v is None else float(v) for v in probe]
    row.attempts += 1
    row.run_id = result.get("run_id", "")
    row.run_ids.append(row.run_id)
    mem = result.get("memory_per_rank_gib")
    if mem is not None:
        row.measured_memory_gib = mem if math.isnan(row.measured_memory_gib) else max(row.measured_memory_gib, mem)
    row.status = "ok"


def quiet_steps(steal: list[float], max_steal: float) -> list[int]:
    """Indices of the steps where the hypervisor took at most `max_steal` (no reading: kept)."""
    return [i for i, s in enumerate(steal) if not s > max_steal]


def settle(row: Row, max_steal: float, needed: int) -> None:
    """Set what `row` measured from its steps: the median of its quiet steps, and the probe and
    steal over them, when it has `needed` of them; else over all its steps (`host_quiet` False).
    A row without per-step readings (an older file) keeps what it has."""
    n = len(row.step_times_s)
    if n == 0 or len(row.step_steal_share) != n or len(row.step_probe_s) != n:
        return
    kept = quiet_steps(row.step_steal_share, max_steal)
    row.steps_kept, row.host_quiet = len(kept), len(kept) >= needed
    use = kept if row.host_quiet else list(range(n))
    times = [row.step_times_s[i] for i in use]
    row.measured_s, row.measured_min_s, row.measured_max_s = statistics.median(times), min(times), max(times)

    def mean(values: list[float]) -> float:
        finite = [values[i] for i in use if math.isfinite(values[i])]
        return statistics.fmean(finite) if finite else math.nan

    row.host_probe_s, row.host_steal_share = mean(row.step_probe_s), mean(row.step_steal_share)


def owes_attempt(row: Row, matrix: Matrix) -> bool:
    """Not measured yet, failed, or stolen with attempts left."""
    return row.status != "ok" or (not row.host_quiet and row.attempts < 1 + matrix.retries)


def _rescore(row: Row, pred) -> None:
    row.predicted_s = pred.step_time_s
    row.predicted_compute_s = pred.breakdown["compute_s"]
    row.predicted_comm_s = pred.breakdown["exposed_comm_s"]
    row.predicted_memory_gib = pred.memory_per_rank_gib
    if row.status == "ok" and row.measured_s > 0:
        row.error_pct = 100 * (row.predicted_s - row.measured_s) / row.measured_s


# -- summary ---------------------------------------------------------------------------------


def _best(rows: list[Row], col: str) -> Row:
    return min(rows, key=lambda r: (getattr(r, col), r.config))


def summarize(rows: list[Row]) -> dict[str, Any]:
    """MAPE, largest error, and per topology whether the predicted best (configuration, and
    data-parallel degree) is the measured best."""
    ok = [r for r in rows if r.status == "ok" and not math.isnan(r.error_pct)]
    errs = [abs(r.error_pct) for r in ok]
    per_top = {}
    for top in dict.fromkeys(r.topology for r in ok):
        mine = [r for r in ok if r.topology == top]
        pb, mb = _best(mine, "predicted_s"), _best(mine, "measured_s")
        entry = {
            "predicted_best": pb.config,
            "measured_best": mb.config,
            "best_agrees": pb.config == mb.config,
            # how much slower, measured, the predicted-best configuration is than the measured best
            "regret_pct": 100 * (pb.measured_s - mb.measured_s) / mb.measured_s,
        }
        dp = [r for r in mine if r.strategy in ("ddp", "zero", "zero2d")]
        if dp:
            pd_, md = _best(dp, "predicted_s"), _best(dp, "measured_s")
            entry |= {
                "predicted_best_degree": pd_.degree,
                "measured_best_degree": md.degree,
                "degree_agrees": pd_.degree == md.degree,
            }
        per_top[top] = entry
    return {
        "rows_ok": len(ok),
        "rows_stolen": sum(1 for r in ok if not r.host_quiet),
        "rows_failed": sum(1 for r in rows if r.status.startswith("failed")),
        "mape_pct": sum(errs) / len(errs) if errs else math.nan,
        "max_error_pct": max(errs) if errs else math.nan,
        "best_agrees": bool(per_top) and all(t["best_agrees"] for t in per_top.values()),
        "degree_agrees": bool(per_top) and all(t.get("degree_agrees", True) for t in per_top.values()),
        "topologies": per_top,
    }


# -- files -----------------------------------------------------------------------------------


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def save(out: Path, matrix: Matrix, rows: list[Row], summary: dict[str, Any]) -> None:
    where = Path(matrix.path).resolve()
    shown = where.relative_to(Path.cwd()) if where.is_relative_to(Path.cwd()) else where
    doc = {"matrix": str(shown), "base": matrix.base, "steps": matrix.steps, "warmup": matrix.warmup}
    doc |= {"rows": [asdict(r) for r in rows], **summary}
    _write_atomic(out / "validation.json", json.dumps(doc, indent=1, allow_nan=True) + "\n")
    cols = [f for f, spec in Row.__dataclass_fields__.items() if not str(spec.type).startswith("list[")]  # per step
    lines = [",".join(cols)]
    for r in rows:
        lines.append(",".join(_csv_cell(getattr(r, c)) for c in cols))
    _write_atomic(out / "validation.csv", "\n".join(lines) + "\n")
    _write_atomic(out / "validation.md", markdown(rows, summary))


def _csv_cell(v: Any) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    text = str(v)
    return f'"{text}"' if "," in text or '"' in text else text


def load_rows(out: Path) -> list[Row]:
    """Rows of an earlier call (resuming); a missing or unreadable file is no rows."""
    try:
        doc = json.loads((out / "validation.json").read_text())
        return [Row(**r) for r in doc.get("rows", [])]
    except (OSError, ValueError, TypeError):
        return []


def markdown(rows: list[Row], summary: dict[str, Any]) -> str:
    lines = [
        "| topology | configuration | predicted | measured (min–max) | steps | steal | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.status != "ok":
            lines.append(f"| {r.topology} | {r.config} | {r.predicted_s:.3f} s | {r.status} | – | – | – |")
            continue
        n = len(r.step_times_s)
        steps = f"{r.steps_kept} of {n}" + ("" if r.host_quiet else " †") if n else "–"
        steal = f"{100 * r.host_steal_share:.0f} %" if math.isfinite(r.host_steal_share) else "–"
        lines.append(
            f"| {r.topology} | {r.config} | {r.predicted_s:.3f} s | {r.measured_s:.3f} s "
            f"({r.measured_min_s:.3f}–{r.measured_max_s:.3f}) | {steps} | {steal} | {r.error_pct:+.1f} % |"
        )
    lines += [
        "",
        "steps: the quiet steps measured, of all run (every attempt); steal: the hypervisor's part of the",
        "host's cores' time in the steps measured. † too few quiet steps: measured over every step.",
        "",
        f"Mean absolute error {summary['mape_pct']:.1f} %, largest {summary['max_error_pct']:.1f} % "
        f"({summary['rows_ok']} configurations, {summary.get('rows_stolen', 0)} of them †).",
        "",
        "| topology | predicted best | measured best | agrees | regret | best degree (pred / meas) |",
        "|---|---|---|---|---|---|",
    ]
    for top, t in summary["topologies"].items():
        deg = f"{t.get('predicted_best_degree', '–')} / {t.get('measured_best_degree', '–')}"
        lines.append(
            f"| {top} | {t['predicted_best']} | {t['measured_best']} | {'yes' if t['best_agrees'] else 'no'} "
            f"| {t['regret_pct']:.1f} % | {deg} |"
        )
    return "\n".join(lines) + "\n"


# -- the loop --------------------------------------------------------------------------------


def _measure(cfg: RunConfig, matrix: Matrix, cluster, runs: Path, threads: int) -> tuple[dict | None, str]:
    """Run `cfg` for real in the emulated cluster (which is up). Returns (result, error)."""
    from shardsim.runtime.launch import launch
    from shardsim.runtime.run_cli import plan_run, run_flags
    from shardsim.runtime.train import default_run_id

    plan = plan_run(cfg, None, emulate=True)
    run_id = default_run_id(plan.resolved_cfg)
    args = run_flags(plan.cfg, matrix.steps, matrix.warmup, runs, matrix.timeout, threads, 0, run_id)
    result = launch(plan.nproc, args, timeout_s=matrix.timeout, threads=threads, stdout=sys.stderr, cluster=cluster)
    if not result.ok:
        return None, result.message
    try:
        return json.loads((runs / f"{run_id}.json").read_text()), ""
    except (OSError, ValueError) as exc:
        return None, f"the run finished but its result is unreadable: {exc}"


def pooled_slowdown(rows: list[Row]) -> float:
    """The host's slowdown since profiling that every prediction of a validation assumes: the
    mean of all yardsticks timed around its runs (1.0 when none was).

    Pooled, not per run: this shared VM flips between a fast and a slow state (the same work
    takes about 0.36 or 0.51 s) every few seconds, so a yardstick of a few seconds before or
    after a 30-s run says little about that run, while the mean over the whole validation
    follows a lasting drift (a host that slowed by half after profiling)."""
    samples = [x for r in rows for x in (r.host_slowdown_before, r.host_slowdown_after) if math.isfinite(x)]
    return statistics.fmean(samples) if samples else 1.0


def row_slowdown(row: Row, profile_probe_s: float | None, pooled: float) -> tuple[float, str]:
    """(the host's slowdown since profiling that `row`'s prediction assumes, where it comes
    from): its run's own probe over the profile's when both were timed, else `pooled`.

    The probe was timed on every rank before every step of the run, so it saw the states the
    run ran in; the profile states its figures at the speed of its own probe."""
    if profile_probe_s and math.isfinite(row.host_probe_s) and row.host_probe_s > 0:
        return row.host_probe_s / profile_probe_s, "probe"
    return pooled, "yardstick"


def _steal_note(share: float) -> str:
    return f"; the hypervisor took {100 * share:.0f} % of the cores' time" if math.isfinite(share) else ""


def _host_slowdown(profile, batch: int) -> float:
    """How much slower this host is now than when the profile was measured (1.0 when the
    profile has no yardstick), timed with the profile's own yardstick."""
    if profile.yardstick_s is None:
        return 1.0
    from shardsim.runtime.profile import yardstick

    return yardstick(profile.workload, batch) / profile.yardstick_s


def ensure_profile(matrix: Matrix, out: Path, given: str | None, log: Callable[[str], None]) -> str:
    """The profile to predict from: `given`, or out/profile.json when it covers the matrix, or a
    new one measured now (blocks at every microbatch size, each topology's links, core sharing)."""
    from shardsim.simulator.hardware.profile import load_profile

    workload = matrix.base.get("workload", RunConfig().workload)
    if given:
        load_profile(given, workload)  # fails here, once, if it is for another workload
        return given
    path = out / "profile.json"
    sizes = matrix.microbatch_sizes()
    worlds = sorted({make_cluster(t).world for t, _ in matrix.topologies})
    if path.exists():
        try:
            prof = load_profile(path, workload)
            covered = (
                all(b in prof.blocks for b in sizes)
                and all(t in prof.links for t, _ in matrix.topologies)
                and all(w in prof.effective_cores for w in worlds)
            )
            if covered:
                log(f"profile: reusing {path}")
                return str(path)
        except ConfigError:
            pass
    from shardsim.runtime.profile import build_profile, write_json_atomic

    log(f"profile: timing {workload}'s blocks at microbatch {sizes}, the links of each topology, core sharing")
    doc = build_profile(
        workload,
        sizes,
        precision=matrix.base.get("precision", "fp32"),
        topologies=[(t, None) for t, _ in matrix.topologies],
        ranks=worlds,
    )
    write_json_atomic(path, doc)
    return str(path)


def validate(
    matrix: Matrix,
    out: Path,
    *,
    profile: str | None = None,
    threads: int = 1,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> tuple[list[Row], dict[str, Any]]:
    """Run what is missing, predict everything, write the table and plots; returns (rows, summary)."""
    from shardsim.runtime.emulation.cluster import check_privileges, emulated, plan_cluster
    from shardsim.simulator.hardware.profile import load_profile
    from shardsim.simulator.predict import predict

    out.mkdir(parents=True, exist_ok=True)
    runs = out / "runs"
    runs.mkdir(exist_ok=True)
    prof = ensure_profile(matrix, out, profile, log)
    earlier = {r.key: r for r in load_rows(out) if r.status == "ok"}
    profile_obj = load_profile(prof, matrix.base.get("workload", RunConfig().workload))
    rows: list[Row] = []
    configs = matrix.configs
    for top, cfgs in matrix.topologies:
        world = make_cluster(top).world
        for cfg in cfgs:
            rows.append(earlier.get((top, cfg.strategy.label())) or _row_for(cfg, world))

    def rescore(i: int, pooled: float) -> None:
        rows[i].host_slowdown, rows[i].host_speed_from = row_slowdown(rows[i], profile_obj.probe_s, pooled)
        among = rows[i].host_speed_from == "probe"  # read among the ranks: their cache sharing included
        steal = rows[i].host_steal_share if math.isfinite(rows[i].host_steal_share) else None
        slowed = profile_obj.slowed(rows[i].host_slowdown, among_ranks=among, steal_share=steal)
        _rescore(rows[i], predict(configs[i], profile=slowed))

    def rescore_all() -> None:
        pooled = pooled_slowdown(rows)
        for i in range(len(rows)):
            rescore(i, pooled)

    needed = matrix.quiet_steps_needed
    for r in rows:
        settle(r, matrix.max_steal, needed)  # the bound may differ from the earlier call's
    rescore_all()
    todo = [(i, c) for i, c in enumerate(matrix.configs) if owes_attempt(rows[i], matrix)]
    if todo:
        check_privileges()
    log(
        f"validate: {len(rows)} configurations, {len(rows) - len(todo)} measured, {len(todo)} to run; "
        f"steps where the hypervisor takes more than {100 * matrix.max_steal:g} % of the cores are set aside"
    )
    done = 0
    yard_batch = max(matrix.microbatch_sizes())  # the size the profile's yardstick was timed at

    def attempt(i: int, cfg: RunConfig, cluster, tag: str) -> None:
        r = rows[i]
        r.host_slowdown_before = before = _host_slowdown(profile_obj, yard_batch)
        log(f"{tag} {cfg.topology} {r.config}: running (host speed x{1 / before:.2f}) ...")
        result, err = _measure(cfg, matrix, cluster, runs, threads)
        r.host_slowdown_after = _host_slowdown(profile_obj, yard_batch)
        if result is None:
            if r.attempts == 0:
                r.status = f"failed: {err}"
            log(f"{tag} {cfg.topology} {r.config}: FAILED: {err}")
        else:
            add_attempt(r, result)
            settle(r, matrix.max_steal, needed)
            rescore(i, pooled_slowdown(rows))  # the pool so far; every row is rescored at the end
            quiet = f"{r.steps_kept} of {len(r.step_times_s)} steps quiet" + ("" if r.host_quiet else ", too few")
            log(
                f"{tag} {cfg.topology} {r.config}: measured {r.measured_s:.3f} s ({quiet}), "
                f"predicted {r.predicted_s:.3f} s ({r.error_pct:+.1f} %; host speed x"
                f"{1 / r.host_slowdown:.2f} by its {r.host_speed_from}, x{1 / r.host_slowdown_after:.2f} after"
                f"{_steal_note(r.host_steal_share)})"
            )
        save(out, matrix, rows, summarize(rows))

    for top, _ in matrix.topologies:
        pending = [(i, c) for i, c in todo if c.topology == top]
        if not pending:
            continue
        cluster = plan_cluster(top)
        with emulated(cluster):
            for i, cfg in pending:
                if rows[i].status != "ok":  # a stolen row of an earlier call waits for the retries
                    done += 1
                    attempt(i, cfg, cluster, f"[{done}/{len(todo)}]")
            for again in range(1, matrix.retries + 1):
                pending = [(i, c) for i, c in pending if rows[i].status == "ok" and owes_attempt(rows[i], matrix)]
                if not pending:
                    break
                names = ", ".join(rows[i].config for i, _ in pending)
                log(f"{top}: too few quiet steps in {names}; again in {RETRY_PAUSE_S:g} s ({again}/{matrix.retries})")
                time.sleep(RETRY_PAUSE_S)
                for i, cfg in pending:
                    attempt(i, cfg, cluster, f"[retry {again}]")
    if todo:
        rescore_all()  # with the yardsticks of every run
    summary = summarize(rows)
    save(out, matrix, rows, summary)
    if summary["rows_ok"]:
        from shardsim.runtime.validation.plots import plot_validation

        plot_validation(rows, summary, out)
    return rows, summary


# -- command ---------------------------------------------------------------------------------


def _cmd_validate(ns) -> int:
    matrix = load_matrix(ns.matrix)
    out = Path(ns.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write the output folder: {exc.strerror}", where=str(out)) from None
    if ns.threads < 1:
        raise ConfigError(f"expected --threads >= 1, got {ns.threads}", field="threads")
    if ns.max_steal is not None:
        matrix = replace(matrix, max_steal=steal_bound(ns.max_steal, None, "max-steal"))
    if ns.retries is not None:
        if ns.retries < 0:
            raise ConfigError(f"expected --retries >= 0, got {ns.retries}", field="retries")
        matrix = replace(matrix, retries=ns.retries)
    rows, summary = validate(matrix, out, profile=ns.profile, threads=ns.threads)
    if ns.json:
        print(json.dumps({"rows": [asdict(r) for r in rows], **summary}))
    else:
        print(markdown(rows, summary), end="")
        print(f"written {out}/validation.{{json,csv,md}}, scatter.png, errors.png")
    failed = [r for r in rows if r.status.startswith("failed")]
    if failed:
        print(f"shardsim: {len(failed)} run(s) failed, e.g. {failed[0].key}: {failed[0].status}", file=sys.stderr)
        return 1
    bad = []
    if ns.max_mape is not None and not summary["mape_pct"] <= ns.max_mape:
        bad.append(f"mean error {summary['mape_pct']:.1f} % exceeds --max-mape {ns.max_mape:g} %")
    if ns.max_error is not None and not summary["max_error_pct"] <= ns.max_error:
        bad.append(f"largest error {summary['max_error_pct']:.1f} % exceeds --max-error {ns.max_error:g} %")
    if bad:
        print("shardsim: validation failed: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "validate",
        help="run configurations for real on emulated clusters and compare with predictions (needs root)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--matrix", default=None, help=f"matrix YAML (default: {DEFAULT_MATRIX.name}, shipped)")
    p.add_argument("--out", default="results/validation", help="output folder (resumable; default %(default)s)")
    p.add_argument("--profile", default=None, help="a profile to predict from (default: measured, out/profile.json)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument(
        "--max-steal",
        type=float,
        default=None,
        help="set aside steps where the hypervisor took more than this part of the cores' time "
        f"(default: the matrix's max_steal, else {QUIET_STEAL_SHARE:g})",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=None,
        help="more attempts at a configuration with fewer than half its steps quiet (default: the matrix's, else 2)",
    )
    p.add_argument("--max-mape", type=float, default=None, help="exit 1 when the mean absolute error (%%) is above")
    p.add_argument("--max-error", type=float, default=None, help="exit 1 when the largest error (%%) is above")
    p.add_argument("--json", action="store_true", help="print {rows, mape_pct, max_error_pct, best_agrees, ...}")
    p.set_defaults(func=_cmd_validate)
