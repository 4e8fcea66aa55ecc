"""`shardsim predict`: one configuration, one step, where the time goes, does it fit."""

from __future__ import annotations

import argparse
import json
import textwrap

from shardsim.cli.inputs import config_inputs
from shardsim.config import add_config_arguments, config_from_args
from shardsim.config.flags import add_algo_argument
from shardsim.config.model_defaults import library_text
from shardsim.core.console import labelled, output_width
from shardsim.core.files import check_output_file
from shardsim.core.units import (
    GIB,
    format_bytes,
    format_flops_rate,
    format_percent,
    format_rate_unit,
    format_seconds,
    format_usd,
)
from shardsim.specs.parallel_dims import ParallelDims


def gib(x: float) -> str:
    """A size given in GiB, in the unit that suits it."""
    return format_bytes(x * GIB)


def _header(text: str, width: int | None) -> str:
    """The first line, wrapped to `width` at its ``, `` separators (an item stays whole)."""
    if width is None:
        return text
    glued = ", ".join(item.replace(" ", "\0") for item in text.split(", "))
    wrapped = textwrap.fill(glued, width=max(width, 40), subsequent_indent="  ", break_long_words=False)
    return wrapped.replace("\0", " ")


def _hint(cfg) -> str:
    """What would make `cfg` fit (`sweep.hints.fit_hint`), by the memory model alone."""
    from shardsim.simulator.workload.resolve import load_workload
    from shardsim.specs.hardware.topology import make_cluster
    from shardsim.sweep.hints import fit_hint

    cluster = make_cluster(cfg.topology, cfg.nodes)
    return fit_hint(cfg, cluster, load_workload(cfg.workload, cfg.shape, cfg.source))


def _cost(pred) -> str:
    """$ per step and per million tokens (samples for a model without a sequence), and the price
    they come from; or why there is none."""
    if pred.cost_per_hour_usd is None:
        return f"unknown: {pred.topology} has no price"
    price = f"{pred.nodes} x ${pred.cost_per_hour_usd / pred.nodes:,.2f}/h on demand"
    if pred.cost_per_step_usd != pred.cost_per_step_usd:  # NaN: not simulated
        return f"- (not simulated; {price})"
    per_m = (
        f"{format_usd(pred.cost_per_million_tokens_usd)} per million tokens"
        if pred.cost_per_million_tokens_usd is not None
        else f"{format_usd(pred.cost_per_million_samples_usd)} per million samples"
    )
    return f"${pred.cost_per_step_usd:,.4g} per step, {per_m} ({price})"


def _float8_lines(pred) -> list[tuple[str, str]]:
    """A Float8 prediction's line: its recipe and the MFU against the FP8 dense peak."""
    if pred.float8 is None:
        return []
    rate = format_flops_rate(pred.peak_tflops_fp8 * 1e12)
    return [
        ("float8", f"{pred.float8} linears, MFU {format_percent(pred.mfu_fp8_peak)} of the fp8 dense peak ({rate})")
    ]


def _moe_lines(pred) -> list[tuple[str, str]]:
    """A mixture of experts' lines: its active parameters (what the MFU counts) and its MoE
    layers' parts per microbatch (router, permutation, grouped GEMMs, shared expert) with the
    load they were costed at; with expert parallelism its all-to-alls and the busiest EP rank's load."""
    if pred.moe is None:
        return []
    from shardsim.core.units import format_count

    moe = pred.moe
    count = [format_count(n).replace(" G", " B") for n in (pred.active_params, pred.params)]
    active = f"{count[0]} of {count[1]} parameters a token"
    parts = [("router", "router_s"), ("permute", "permute_s"), ("grouped GEMM", "grouped_gemm_s"),
             ("shared expert", "shared_expert_s")]  # fmt: skip
    load = (
        f"{moe['tokens_per_expert_busiest']:,.0f} tokens on the busiest expert, {moe['tokens_per_expert_mean']:,.0f} "
        f"on the mean, {moe['bytes_per_token_dispatched']:,.0f} B a token copy"
    )
    timed = ", ".join(f"{name} {format_seconds(moe[key])}" for name, key in parts if key in moe)
    what = f"{moe['moe_layers']:.0f} MoE layers per microbatch, forward + backward"
    lines = [("active params", active), ("moe layers", f"{timed + ' (' if timed else '('}{what}); {load}")]
    if "ep" in moe:
        a2a, exposed = format_seconds(moe["all_to_all_s"]), format_seconds(moe["all_to_all_exposed_s"])
        ranks = f"the busiest of {moe['ep']:.0f} EP ranks gets {moe['ep_rank_imbalance']:.2f} x the mean's rows"
        lines.append(("expert parallel", f"all-to-all {a2a} per microbatch, {exposed} of it exposed; {ranks}"))
    return lines


def _cmd_predict(ns: argparse.Namespace) -> int:
    from shardsim.simulator.attention_impl import warn_slower_rates
    from shardsim.simulator.predict import predict, save_trace
    from shardsim.specs.model.load import display_name

    cfg = config_from_args(ns)
    warn_slower_rates([(cfg.attention, cfg.precision)])
    if ns.trace:
        check_output_file(ns.trace, "trace", inputs=config_inputs(ns, cfg))
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
    rates = format_rate_unit(pred.samples_per_s, "samples")
    if pred.tokens_per_s_per_gpu is not None:
        rates += f", {format_rate_unit(pred.tokens_per_s_per_gpu, 'tokens')} per GPU"
    rate = format_flops_rate(pred.peak_tflops * 1e12)
    peak = f"{pred.mfu_peak_precision} dense peak ({rate})"
    if pred.mfu_peak_precision != pred.config["precision"]:  # fp32 against the tensor cores it leaves idle
        peak = f"{pred.mfu_peak_precision} tensor-core peak ({rate}), which {pred.config['precision']} leaves idle"
    lines = [
        ("step time", f"{format_seconds(pred.step_time_s)}   ({rates})"),
        (
            "breakdown",
            f"compute {format_seconds(b['compute_s'])}, exposed comm {format_seconds(b['exposed_comm_s'])}, "
            f"bubble {format_seconds(b['bubble_s'])}, optimizer {format_seconds(b['optimizer_s'])}",
        ),
        (
            "throughput",
            f"{format_flops_rate(pred.tflops_per_device * 1e12)} per device, MFU {format_percent(pred.mfu)} of the "
            f"{peak}, model FLOPs {pred.mfu_formula}",
        ),
        *_float8_lines(pred),
        *_moe_lines(pred),
        ("cost", _cost(pred)),
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
    if k.tp > 1 or k.pp > 1 or k.cp > 1:  # a data-parallel layout: the label says it all
        dims = ParallelDims.of_world(pred.world, tp=k.tp, pp=k.pp, dp_shard=k.degree, cp=k.cp)
        text = f"{dims.spelled} (SageMaker: tensor_parallel_degree {k.tp}"
        cp = f", context_parallel_degree {k.cp}" if k.cp > 1 else ""
        lines.insert(0, ("layout", text + f", pipeline_parallel_degree {k.pp}{cp}, hybrid_shard_degree {k.degree})"))
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
        params = f"fitted parameters ±{band.parameters_pct:.1f} %" if band.parameters_pct is not None else band.why
        text = (
            f"±{band.pct:.1f} % step time (one sigma, {cfg.calibration}): {params}, the model's own error "
            f"{band.model.text()}"
        )
        lines.insert(1, ("calibration band", text))
    if not pred.fits:
        lines.append(("to fit", _hint(cfg)))
    if ns.trace:
        lines.append(("trace", f"{ns.trace}, open in https://ui.perfetto.dev or chrome://tracing"))
    batch = f"global batch {pred.global_batch}"
    if pred.seq_len is not None:
        batch = f"seq {pred.seq_len:,}, {batch} ({pred.global_batch * pred.seq_len:,} tokens)"
    head = (
        f"{display_name(cfg.workload, cfg.shape)} on {pred.cluster}, {pred.label}, {batch}, {library_text(cfg.library)}"
    )
    print(_header(head, width))
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
        help="write a Chrome trace of the step to FILE (its folder made if missing; never an input of the command) "
        "(default: none)",
    )
    p.set_defaults(func=_cmd_predict)
