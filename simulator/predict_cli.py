"""`shardsim predict`: one configuration, one step, where the time goes, does it fit."""

from __future__ import annotations

import argparse
import json

from shardsim.simulator.config import add_config_arguments, config_from_args
from shardsim.simulator.config.flags import add_algo_argument
from shardsim.simulator.files import check_output_file
from shardsim.simulator.units import format_seconds
from shardsim.simulator.workload.load import spec_name


def _cmd_predict(ns: argparse.Namespace) -> int:
    from shardsim.simulator.predict import predict, save_trace

    cfg = config_from_args(ns)
    if ns.trace:
        check_output_file(ns.trace, "trace")
    pred = predict(cfg, algo=ns.algo)
    if ns.trace:
        save_trace(pred, ns.trace)
    if ns.json:
        print(pred.to_json())
        return 0
    b = pred.breakdown
    print(f"{spec_name(cfg.workload)} on {pred.cluster}, {pred.strategy}, global batch {pred.global_batch}")
    print(f"  step time        {format_seconds(pred.step_time_s)}   ({pred.samples_per_s:.1f} samples/s)")
    print(
        f"  breakdown        compute {format_seconds(b['compute_s'])}, "
        f"exposed comm {format_seconds(b['exposed_comm_s'])}, bubble {format_seconds(b['bubble_s'])}, "
        f"optimizer {format_seconds(b['optimizer_s'])}"
    )
    print(f"  throughput       {pred.tflops_per_device:.2f} TFLOP/s per device, MFU {pred.mfu * 100:.1f}%")
    m = pred.memory
    fit = "fits" if pred.fits else f"DOES NOT FIT: {pred.fit_reason}"
    print(
        f"  memory per rank  {pred.memory_per_rank_gib:.2f} of {pred.device_memory_gib:g} GiB ({fit}): "
        f"params {m['params_gib']:.2f}, grads {m['grads_gib']:.2f}, optimizer {m['optimizer_gib']:.2f}, "
        f"gathered {m['gathered_gib']:.2f}, activations {m['activations_gib']:.2f}"
    )
    print(f"  collectives      {json.dumps(pred.collectives)}")
    if ns.trace:
        print(f"  trace            {ns.trace} (open in https://ui.perfetto.dev or chrome://tracing)")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "predict",
        help="predict one training step (default: the seed scenario)",
        description="Predict one training step of a configuration on a described cluster: step time, where "
        "the time goes, memory per rank and whether it fits.",
    )
    add_config_arguments(p)
    add_algo_argument(p, auto=True)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace of the step (its folder must exist)")
    p.set_defaults(func=_cmd_predict)
