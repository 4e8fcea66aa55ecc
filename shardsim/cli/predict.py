"""`shardsim predict`: one configuration, one step, where the time goes, does it fit."""

from __future__ import annotations

import argparse
import json

from shardsim.config import add_config_arguments, config_from_args
from shardsim.config.flags import add_algo_argument
from shardsim.core.console import labelled, output_width
from shardsim.core.files import check_output_file
from shardsim.core.units import GIB, format_bytes, format_flops_rate, format_seconds


def gib(x: float) -> str:
    """A size given in GiB, in the unit that suits it."""
    return format_bytes(x * GIB)


def _cmd_predict(ns: argparse.Namespace) -> int:
    from shardsim.simulator.predict import predict, save_trace

    cfg = config_from_args(ns)
    if ns.trace:
        check_output_file(ns.trace, "trace")
    pred = predict(cfg, algo=ns.algo)
    if ns.trace:
        save_trace(pred, ns.trace)
    band = None
    if cfg.calibration:
        from shardsim.simulator.calibration.band import prediction_band

        band = prediction_band(cfg)
    if ns.json:
        print(pred.to_json() if band is None else json.dumps(pred.to_dict() | {"calibration_band": band.to_dict()}))
        return 0
    b, m, width = pred.breakdown, pred.memory, output_width()
    fit = "fits" if pred.fits else f"DOES NOT FIT: {pred.fit_reason}"
    lines = [
        ("step time", f"{format_seconds(pred.step_time_s)}   ({pred.samples_per_s:.1f} samples/s)"),
        (
            "breakdown",
            f"compute {format_seconds(b['compute_s'])}, exposed comm {format_seconds(b['exposed_comm_s'])}, "
            f"bubble {format_seconds(b['bubble_s'])}, optimizer {format_seconds(b['optimizer_s'])}",
        ),
        ("throughput", f"{format_flops_rate(pred.tflops_per_device * 1e12)} per device, MFU {pred.mfu * 100:.1f}%"),
        (
            "memory per rank",
            f"{gib(pred.memory_required_gib)} of {gib(pred.device_memory_gib)} ({fit}): "
            + ", ".join(
                f"{k} {gib(m[f'{k}_gib'])}" for k in ("params", "grads", "optimizer", "gathered", "activations")
            ),
        ),
        ("collectives", json.dumps(pred.collectives)),
    ]
    k = pred.strategy
    if k.tp > 1 or k.pp > 1:  # a data-parallel layout: the label says it all
        dp = pred.world // (k.tp * k.pp)
        text = f"tp {k.tp} x pp {k.pp} x dp {dp}, sharded over {k.degree} (SageMaker: tensor_parallel_degree {k.tp}"
        lines.insert(0, ("layout", text + f", pipeline_parallel_degree {k.pp}, hybrid_shard_degree {k.degree})"))
    proc = pred.memory_process
    if proc.get("cuda_context_gib", 0.0) > 0:  # a GPU: the three figures tools report differ
        lines.insert(
            len(lines) - 1,
            (
                "memory as tools",
                f"allocated {gib(pred.memory_allocated_gib)} (torch max_memory_allocated), reserved "
                f"{gib(pred.memory_reserved_gib)} (max_memory_reserved), process {gib(pred.memory_process_gib)} "
                f"(nvidia-smi: + CUDA context {gib(proc['cuda_context_gib'])}, NCCL buffers "
                f"{gib(proc['nccl_buffers_gib'])})",
            ),
        )
    if band is not None:
        text = (
            f"±{band.pct:.1f} % step time (one sigma of the fitted parameters, {cfg.calibration})"
            if band.pct is not None
            else band.why
        )
        lines.insert(1, ("calibration band", text))
    if ns.trace:
        lines.append(("trace", f"{ns.trace}, open in https://ui.perfetto.dev or chrome://tracing"))
    print(f"{pred.workload} on {pred.cluster}, {pred.label}, global batch {pred.global_batch}")
    for label, text in lines:
        print(labelled(label, text, width))
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
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="write a Chrome trace of the step to FILE; its folder must exist (default: none)",
    )
    p.set_defaults(func=_cmd_predict)
