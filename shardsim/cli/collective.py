"""`shardsim collective`: one collective on a cluster, nccl-tests style (time, algbw, busbw); a
size sweep printed in nccl-tests' columns; a comparison with a measured nccl-tests output."""

from __future__ import annotations

import argparse
import json
import math
import sys

from shardsim.config.flags import add_algo_argument, setting_type
from shardsim.config.schema import BACKENDS, PROTOCOLS
from shardsim.core.errors import ConfigError
from shardsim.core.flagtypes import Count, Real, Size, SizeSweep
from shardsim.core.units import COMPACT_UP_TO, parse_size
from shardsim.simulator.scale import MAX_MESSAGE_BYTES
from shardsim.specs.bounds import MAX_WORLD

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all")
_SWEEP_LINE = "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {}"  # nccl-tests' widths
_COMPARE_LINE = "{:>12}  {:>16}  {:>9}  {:>9}  {:>7}  {:>12}  {:>9}  {:>7}"


def _cmd_collective(ns: argparse.Namespace) -> int:
    if ns.plot and not ns.compare:
        raise ConfigError("--plot draws a comparison: give --compare FILE", field="plot")
    if ns.imbalance != 1.0 and (ns.compare or (ns.op or "all_reduce") != "all_to_all"):
        what = "--compare's sizes are nccl-tests' even ones" if ns.compare else f"not {ns.op}'s"
        raise ConfigError(
            f"--imbalance is an all_to_all's busiest rank's share over the mean; {what}", field="imbalance"
        )
    if ns.compare:
        return _compare(ns)
    cluster = _cluster(ns, ns.nodes)
    if ns.sizes:
        return _sweep(ns, cluster)
    from shardsim.core.units import format_bytes, format_seconds
    from shardsim.simulator.collective import simulate_collective

    op, size = ns.op or "all_reduce", ns.size or parse_size("1GiB")
    r = simulate_collective(cluster, op, size, ns.algo, ns.backend, ns.ranks, ns.protocol, ns.imbalance)
    band = _band(ns, cluster)
    if ns.json:  # a bandwidth that is no number (one rank moves nothing, in no time) is null: JSON has no Infinity
        fields = ("op", "ranks", "size_bytes", "time_s", "algbw_GBps", "busbw_GBps", "algo", "protocol", "backend")
        doc = {k: _finite_or_none(getattr(r, k)) for k in fields}
        print(json.dumps(doc | {"band": band.to_dict()}, allow_nan=False))
        return 0
    print(f"{r.op} of {format_bytes(r.size_bytes)} over {r.ranks} ranks on {r.cluster} ({_algo(r)}, {r.backend})")
    if ns.imbalance != 1.0:
        print(f"  uneven: rank 0 receives {ns.imbalance:g} x the mean, the others the rest evenly")
    print(f"  time   {format_seconds(r.time_s)}")
    print(f"  algbw  {_bandwidth(r.algbw_GBps)}")
    print(f"  busbw  {_bandwidth(r.busbw_GBps)}")
    print(f"  band   {band.short()} of the time, one sigma")
    print(f"         {band.source}")
    return 0


def _band(ns: argparse.Namespace, cluster):
    """The model's own error for a collective on `cluster` (`model_error.collective_error`), or the
    one a calibration file fitted to nccl-tests output states (``fit.model_error``)."""
    from shardsim.simulator.model_error import ModelError, collective_error

    if ns.calibration and ns.backend == "nccl":
        from shardsim.simulator.calibration.apply import load_calibration

        saved = load_calibration(ns.calibration).fit.get("model_error") or {}
        if saved.get("library") == "nccl" and isinstance(saved.get("sigma_log"), int | float):
            measured, source = bool(saved.get("measured")), f"{ns.calibration}: {saved.get('source')}"
            return ModelError(float(saved["sigma_log"]), measured, source, str(saved.get("stack")))
    return collective_error(cluster.instance.name, cluster.nodes, ns.backend)


def _cluster(ns: argparse.Namespace, nodes: int | None):
    """The topology's cluster, with the calibration file's fitted figures over its own (``--calibration``)."""
    from shardsim.specs.hardware.topology import make_cluster

    cluster = make_cluster(ns.topology, nodes)
    if ns.calibration is None:
        return cluster
    from shardsim.simulator.calibration.apply import calibrated

    return calibrated(cluster, ns.calibration)


def _algo_text(algo: str, protocol: str) -> str:
    """ring/LL128 (NCCL), ring (gloo, SageMaker's hierarchical)."""
    return f"{algo}/{protocol}" if protocol else algo


def _algo(r) -> str:
    return _algo_text(r.algo, r.protocol)


def _progress(ns: argparse.Namespace):
    """A counter on stderr when it is a terminal (rewritten in place, cleared at the end)."""
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        sys.stderr.write(f"\rsize {done}/{total}" if done < total else "\r" + " " * 24 + "\r")
        sys.stderr.flush()

    return show


def _sweep(ns: argparse.Namespace, cluster) -> int:
    from shardsim.simulator.collective import nccl_tests_row, sweep_collective

    op = ns.op or "all_reduce"
    results = sweep_collective(
        cluster, op, ns.sizes, ns.algo, ns.backend, ns.ranks, _progress(ns), ns.protocol, ns.imbalance
    )
    rows = [nccl_tests_row(r) for r in results]
    busbw = [r["busbw_GBps"] for r in rows if math.isfinite(r["busbw_GBps"])]
    avg = sum(busbw) / len(busbw) if busbw else None
    r0 = results[0]
    if ns.json:
        doc = {
            "op": op,
            "ranks": r0.ranks,
            "cluster": r0.cluster,
            "backend": ns.backend,
            "rows": [{k: _finite_or_none(v) for k, v in row.items()} for row in rows],
            "avg_busbw_GBps": avg,
            "band": _band(ns, cluster).to_dict(),
        }
        print(json.dumps(doc, allow_nan=False))
        return 0
    print(
        f"# shardsim collective: {op} over {r0.ranks} ranks on {r0.cluster}"
        f" ({ns.backend}, --algo {ns.algo}, --protocol {ns.protocol})"
    )
    print(f"# calibrated: {ns.calibration}'s fitted figures over the topology's" if ns.calibration else "#")
    band = _band(ns, cluster)
    print(f"# band: {band.short()} of each time, one sigma; {band.source}")
    if ns.imbalance != 1.0:
        print(f"# uneven: rank 0 receives {ns.imbalance:g} x the mean, the others the rest evenly")
    print(_header(_SWEEP_LINE, "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "algo"))
    print(_header(_SWEEP_LINE, "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""))
    for row in rows:
        t, algbw, busbw = _time_us(row["time_s"] * 1e6), _gbps(row["algbw_GBps"]), _gbps(row["busbw_GBps"])
        cells = (row["size_bytes"], row["count"], row["type"], row["redop"], row["root"], t, algbw, busbw)
        print(_SWEEP_LINE.format(*cells, _algo_text(row["algo"], row["protocol"])))
    print(f"# Avg bus bandwidth    : {'-' if avg is None else f'{avg:.3f}'}")
    return 0


def _compare(ns: argparse.Namespace) -> int:
    from shardsim.simulator.collective import compare_collective
    from shardsim.simulator.network.nccl_tests import NO_NODES, dropped_line, read_nccl_tests

    if ns.ranks:  # --size and --sizes are refused beside --compare by the parser
        raise ConfigError("--compare takes its ranks from the file: leave out --ranks", field="ranks")
    if ns.plot:  # a path that cannot be written is refused before any work
        from shardsim.core.files import check_output_file, input_files

        check_output_file(ns.plot, "plot", inputs=input_files(ns.compare, ns.topology, ns.calibration))
    measured = read_nccl_tests(ns.compare, ns.op)
    if ns.nodes is None and measured.nodes is None:
        raise ConfigError(f"{measured.path}: {NO_NODES}", field="nodes")
    if ns.nodes is not None and measured.nodes is not None and ns.nodes != measured.nodes:
        raise ConfigError(f"{measured.path}: measured on {measured.nodes} nodes, not --nodes {ns.nodes}", field="nodes")
    cluster = _cluster(ns, ns.nodes if ns.nodes is not None else measured.nodes)
    doc = compare_collective(cluster, measured, ns.algo, ns.backend, _progress(ns), ns.protocol)
    if line := dropped_line([measured]):  # once the comparison stands: a refusal stays one line
        print(line, file=sys.stderr)
    if ns.plot:
        plot_comparison(doc, ns.plot)
    if ns.json:
        print(json.dumps(doc, allow_nan=False))
        return 0
    print(
        f"# {doc['op']} over {doc['ranks']} ranks on {doc['cluster']}"
        f" ({doc['backend']}, --algo {ns.algo}, --protocol {ns.protocol})"
    )
    print(f"# measured: {doc['file']} (out of place); error = predicted / measured - 1")
    if ns.calibration:
        print(f"# calibrated: {ns.calibration}'s fitted figures over the topology's")
    print(_header(_COMPARE_LINE, "size", "algo", "time (us)", "measured", "error", "busbw (GB/s)", "measured", "error"))
    for r in doc["rows"]:
        times = (_time_us(r["predicted_time_us"]), _time_us(r["measured_time_us"]), _pct(r["time_error_pct"]))
        busbw = (_gbps(r["predicted_busbw_GBps"]), _gbps(r["measured_busbw_GBps"]), _pct(r["busbw_error_pct"]))
        print(_COMPARE_LINE.format(r["size_bytes"], _algo_text(r["algo"], r["protocol"]), *times, *busbw))
    s = {k: _pct(v, sign=False) for k, v in doc["summary"].items() if k != "sizes"}
    print(
        f"# {doc['summary']['sizes']} sizes; busbw from 1 MiB: mean |error| {s['mean_abs_busbw_error_pct_from_1MiB']}"
        f" (max {s['max_abs_busbw_error_pct_from_1MiB']}); time below 1 MiB: mean |error|"
        f" {s['mean_abs_time_error_pct_below_1MiB']} (max {s['max_abs_time_error_pct_below_1MiB']})"
    )
    return 0


def plot_comparison(doc: dict, path: str) -> None:
    """Predicted and measured busbw against size (log x), one PNG (matplotlib's Figure, Agg)."""
    from matplotlib.figure import Figure

    from shardsim.core.files import atomic_path

    rows = doc["rows"]
    sizes = [r["size_bytes"] for r in rows]
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(sizes, [r["measured_busbw_GBps"] for r in rows], "o-", label="measured (nccl-tests)")
    ax.plot(sizes, [_finite_or_none(r["predicted_busbw_GBps"]) for r in rows], "s--", label="predicted (shardsim)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"{doc['op']}, {doc['ranks']} ranks on {doc['cluster']}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def _header(line: str, *names: str) -> str:
    """A header line of a table: its column names under the same widths, after ``#``."""
    return "#" + line.format(*names)[1:].rstrip()


def _time_us(us: float) -> str:
    """As nccl-tests prints a time: 2 decimals below 100 us, 1 below 10 ms, none above."""
    return f"{us:.2f}" if us < 100 else f"{us:.1f}" if us < 10_000 else f"{us:.0f}"


def _gbps(gbps: float) -> str:
    return "-" if gbps is None or not math.isfinite(gbps) else f"{gbps:.2f}"


def _pct(p: float | None, sign: bool = True) -> str:
    return "-" if p is None else (f"{p:+.1f}%" if sign else f"{p:.1f}%")


def _finite_or_none(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _bandwidth(gbps: float) -> str:
    """``230.79 GB/s``; ``- (no time)`` where nothing was timed; a huge one in scientific notation."""
    if not math.isfinite(gbps):
        return "- (no time)"
    return f"{gbps:.3e} GB/s" if abs(gbps) >= COMPACT_UP_TO else f"{gbps:.2f} GB/s"


def register(sub) -> None:
    c = sub.add_parser(
        "collective",
        help="time collectives on a cluster (nccl-tests style), or compare with nccl-tests output",
        description="Time one collective on a described cluster with the simulator's network: "
        "time, algorithm bandwidth and bus bandwidth as nccl-tests reports them; a size sweep "
        "(--sizes) in nccl-tests' columns; or predicted against measured per size (--compare).",
    )
    c.add_argument("--topology", default="p4d.24xlarge", help="instance type or YAML path (default: p4d.24xlarge)")
    c.add_argument(
        "--nodes",
        type=setting_type("nodes"),
        default=None,
        help="number of nodes (default 1, or the emulated count; with --compare, from the file's '# Rank' lines;"
        " needed where it has none)",
    )
    c.add_argument(
        "--op",
        default=None,
        choices=OPS,
        help="the collective (default: all_reduce; with --compare, the one the file measured)",
    )
    sizes = c.add_mutually_exclusive_group()
    sizes.add_argument(
        "--size",
        type=Size(MAX_MESSAGE_BYTES),
        default=None,
        help="message size S as nccl-tests counts it, e.g. 1GiB, 25MB (default: 1GiB)",
    )
    sizes.add_argument(
        "--sizes",
        type=SizeSweep(MAX_MESSAGE_BYTES),
        default=None,
        help="a size sweep in nccl-tests' columns: FROM:TO doubling (8B:16GiB) or a list (1MiB,64MiB,1GiB)"
        " (default: none, one --size)",
    )
    sizes.add_argument(
        "--compare",
        metavar="FILE",
        default=None,
        help="nccl-tests output (its text, or the CSV form of experiments/calibration/data): predicted vs measured"
        " (default: none)",
    )
    c.add_argument(
        "--plot",
        metavar="OUT.png",
        default=None,
        help="with --compare: busbw predicted vs measured (PNG, its folder made if missing; never an input of the "
        "command) (default: none)",
    )
    add_algo_argument(c, auto=True)
    c.add_argument(
        "--protocol",
        default="auto",
        choices=("auto", *PROTOCOLS),
        help="NCCL's protocol, forced as NCCL_PROTO would (auto: what NCCL's tuner picks; default: auto)",
    )
    c.add_argument("--backend", default="nccl", choices=BACKENDS, help="communication library (default: nccl)")
    c.add_argument(
        "--imbalance",
        type=Real(1.0, inclusive=True),
        default=1.0,
        metavar="F",
        help="all_to_all only: rank 0 receives F times the mean bytes, the others the rest evenly (an MoE dispatch"
        " whose busiest expert rank takes F x the mean tokens), at most the ranks (default: 1.0, even)",
    )
    c.add_argument(
        "--ranks",
        type=Count(MAX_WORLD, minimum=2),
        default=None,
        help="use only the first N ranks of the cluster, at least 2 (default: all)",
    )
    c.add_argument(
        "--calibration",
        metavar="FILE",
        default=None,
        help="a calibration file (shardsim calibrate): its fitted figures over the topology's (default: none)",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=_cmd_collective)
