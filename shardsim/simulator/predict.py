"""One step prediction: config → plan → simulated timeline → StepPrediction."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from shardsim.config import Resolved, RunConfig, resolve
from shardsim.core.errors import ConfigError
from shardsim.simulator.attention_impl import check_attention
from shardsim.simulator.calibration.apply import calibrated
from shardsim.simulator.checkpointing import checkpointing_of
from shardsim.simulator.compute import DTYPE_BYTES, ComputeModel
from shardsim.simulator.cp_workload import cp_rank_workload
from shardsim.simulator.economics import (
    economics,
    mfu_formula,
    mfu_peak,
    model_flops_per_sample,
    sequence_length,
)
from shardsim.simulator.engine import Span, chain_bound, simulate
from shardsim.simulator.float8 import check_float8, float8_layer_elems
from shardsim.simulator.fusion import compiled_saves
from shardsim.simulator.gcpause import paused_gc
from shardsim.simulator.hardware.profile import Profile, load_profile
from shardsim.simulator.memory import (
    MemoryBreakdown,
    ProcessMemory,
    attention_saves,
    cublas_workspace_bytes,
    process_memory,
    rank_memory,
    state_words,
)
from shardsim.simulator.network.links import links_for
from shardsim.simulator.plan import Plan
from shardsim.simulator.results import KEY_FIELDS, StrategyKey, result_key
from shardsim.simulator.scale import check_plan, check_world
from shardsim.simulator.strategies.build import build_plan
from shardsim.simulator.strategies.expert_parallel import ep_classes, rank_factor
from shardsim.simulator.strategies.steps import BlockTimes, ends_apart, pipeline_blocks, rank_classes, stage_blocks
from shardsim.simulator.strategies.virtual_pipeline import rank_held_activations
from shardsim.simulator.timeline import length, subtract, union, write_chrome_trace
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import Cluster, make_cluster
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import check_mlm, from_arch
from shardsim.specs.model.load import spec_name
from shardsim.specs.model.workload import Block, Workload
from shardsim.specs.stage_split import AUTO, balanced_split

FLOAT8_KEYS = ("float8", "peak_tflops_fp8", "mfu_fp8_peak")  # a Float8 prediction's keys
MOE_KEYS = ("active_params", "moe")  # a mixture-of-experts prediction's keys


@dataclass(frozen=True)
class StepPrediction:
    """One step's prediction. `tflops_per_device` and `mfu` count model FLOPs, 3 × the forward's
    (per token 6·N + 6·L·d·S for a causal text model: `economics`), over the dense peak of the
    tensor cores at the precision they run (`peak_tflops`, that of `mfu_peak_precision`:
    `economics.mfu_peak`). `params` is the model's parameter count. For a text model
    `seq_len` is its tokens per sample and `tokens_per_s_per_gpu` the step's tokens per second
    over the world; the costs are the cluster's on-demand price over the step (None without a
    price, or for tokens without a sequence). It starts
    with the key every result carries (`simulator.results.ResultKey`, docs/results.md); its memory is
    the worst rank's: `memory_allocated_gib` (tensors' peak), `memory_reserved_gib` (the caching
    allocator's peak) and `memory_required_gib` (that, the CUDA context and NCCL's buffers: the
    process total, `memory_process_gib`, what `fits` compares with `device_memory_gib`)."""

    topology: str
    nodes: int
    world: int
    device: str
    workload: str
    strategy: StrategyKey
    label: str
    config: dict
    cluster: str
    global_batch: int
    step_time_s: float
    samples_per_s: float
    breakdown: dict[str, float]
    tflops_per_device: float
    mfu: float
    memory_allocated_gib: float
    memory_reserved_gib: float
    memory_required_gib: float
    device_memory_gib: float
    fits: bool
    fit_reason: str
    memory: dict[str, float]
    collectives: dict[str, int]
    cost_per_hour_usd: float | None
    params: int = 0
    peak_tflops: float = 0.0
    mfu_peak_precision: str = ""
    mfu_formula: str = ""
    seq_len: int | None = None
    tokens_per_s_per_gpu: float | None = None
    cost_per_step_usd: float | None = None
    cost_per_million_samples_usd: float | None = None
    cost_per_million_tokens_usd: float | None = None
    # the process total as nvidia-smi shows it (`memory.process_memory`): reserved + CUDA context + NCCL buffers
    memory_process_gib: float = float("nan")
    memory_process: dict[str, float] = field(default_factory=dict)
    # Float8 training (`simulator.float8`): its recipe, the FP8 dense peak and the MFU against it
    # (`mfu` stays against the bf16 peak, as torchtitan reports it); absent from the JSON without Float8
    float8: str | None = None
    peak_tflops_fp8: float | None = None
    mfu_fp8_peak: float | None = None
    # a mixture of experts: the parameters a token uses (what the MFU's model FLOPs count), and its
    # MoE layers' parts (`moe_breakdown`); absent from the JSON for a model without experts
    active_params: int | None = None
    moe: dict[str, float] | None = None
    spans: list[Span] = field(default_factory=list, repr=False, compare=False)
    class_labels: list[str] = field(default_factory=list, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("spans")
        d.pop("class_labels")
        for k in (*FLOAT8_KEYS, *MOE_KEYS):
            if d[k] is None:
                del d[k]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def _critical_breakdown(p: Plan, spans: list[Span], rc: int) -> dict[str, float]:
    mine = [s for s in spans if s.rank_class == rc]
    end = max(s.end for s in mine)
    compute = [(s.start, s.end) for s in mine if s.kind == "compute"]
    opt = [(s.start, s.end) for s in mine if s.kind == "optimizer"]
    comm = [(s.start, s.end) for s in spans if s.kind == "comm" and (s.rank_class == rc or p.ops[s.op].peer == rc)]
    compute, comm = union(compute), union(comm)  # each sorted once (a union's union is itself)
    busy = union(compute + opt)
    idle = subtract([(0.0, end)], busy)
    exposed = length(idle) - length(subtract(idle, comm))
    return {
        "compute_s": float(length(compute)),
        "exposed_comm_s": float(exposed),
        "bubble_s": float(length(idle) - exposed),
        "optimizer_s": float(length(subtract(opt, compute))),
        "comm_total_s": float(length(comm)),
    }


def predict(
    cfg: RunConfig,
    *,
    algo: str = "auto",
    workload: Workload | None = None,
    cluster: Cluster | None = None,
    profile: Profile | None = None,
    prune_unfit: bool = False,
) -> StepPrediction:
    """Predict one optimizer step (all gradient-accumulation micro-steps) of `cfg`. Already
    built, `workload`, `cluster` and `profile` take the place of what `cfg.workload`,
    `cfg.topology` × `cfg.nodes` and `cfg.profile` name, unchecked: the sweep and the calibration
    pass the ones they built from the same configuration, tests pass synthetic ones. The public
    `shardsim.predict` (`shardsim.api`) takes none of them: there the configuration says it all.
    `prune_unfit` (the sweep's): a step that does not fit in memory, which memory says before
    anything is planned, is not simulated; its times are NaN."""
    with paused_gc():  # it makes no cycles; the collector would rescan the plan and its spans for nothing
        s = prepare(cfg, workload=workload, cluster=cluster, profile=profile)
        if prune_unfit and not s.fits:
            return s.unsimulated()
        return s.simulated(s.plan(), algo)


def _engine_options(s: Prepared) -> dict:
    """`simulate`'s keyword arguments for `s`."""
    cluster, profile = s.cluster, s.profile
    # an emulated cluster runs every rank on this one host: its cores are shared by all ranks
    shared = cluster.instance.host.cores if cluster.instance.emulated else None
    comm_cpu, wait = None, 0.0
    if shared is not None and profile:
        shared = profile.cores_for(cluster.world, shared)
        comm_cpu = profile.comm_cpu(cluster)
        wait = profile.call_wait_s(cluster)
    mics = s.cfg.library == "smp"  # SageMaker's collectives: MiCS's hierarchical all-gather under `auto`
    return {"shared_cores": shared, "comm_cpu": comm_cpu, "mics": mics, "call_wait_s": wait}


def chain_bound_s(s: Prepared, algo: str = "auto", plan: Plan | None = None) -> float:
    """A lower bound on `s`'s simulated step: its plan (`plan`, or built now), not simulated
    (`engine.chain_bound`)."""
    plan = plan or s.plan()
    return chain_bound(plan, links_for(s.cluster), algo, s.cfg.backend, **_engine_options(s))


@dataclass(frozen=True)
class Prepared:
    """What a prediction knows before it plans or simulates anything: the resolved configuration,
    the cluster (profiled, calibrated), the compute model, the model as one rank runs it, and
    the worst rank's memory (`step_memory`)."""

    cfg: RunConfig
    res: Resolved
    workload: Workload
    ranks_workload: Workload
    cluster: Cluster
    compute: ComputeModel
    memory: MemoryBreakdown
    profile: Profile | None

    @property
    def fits(self) -> bool:
        return self.memory.required_gib <= self.cluster.instance.device.memory_gib

    def unsimulated(self, config: bool = True) -> StepPrediction:
        """The prediction without a simulation: memory and fit, NaN times and rates; `config` False:
        its `config` left empty (a sweep's row, which does not hold it, of each configuration)."""
        return _summarize(self.cfg, self.res, self.workload, self.cluster, self.compute, self.memory, None, [], config)

    def plan(self) -> Plan:
        """The step's plan (`build_plan`); ConfigError in one line, before any of it is built, when
        it is beyond the simulator's op bound (`scale.check_plan`)."""
        check_plan(self.cfg, len(self.workload.layers) or len(self.workload.blocks))
        return build_plan(self.cfg, self.res, self.ranks_workload, self.compute, links_for(self.cluster))

    def simulated(self, plan: Plan, algo: str = "auto") -> StepPrediction:
        """The prediction: `plan` (this step's, from `plan()`) simulated on the cluster's network."""
        spans = simulate(plan, links_for(self.cluster), algo, self.cfg.backend, **_engine_options(self))
        return _summarize(self.cfg, self.res, self.workload, self.cluster, self.compute, self.memory, plan, spans)


def prepare(
    cfg: RunConfig,
    *,
    workload: Workload | None = None,
    cluster: Cluster | None = None,
    profile: Profile | None = None,
) -> Prepared:
    """Everything `predict` sets up before it plans the step (arguments as `predict`'s): the checks
    (one line each, ConfigError), the cluster as profiled and calibrated, the compute model and
    the memory."""
    cluster = cluster or make_cluster(cfg.topology, cfg.nodes, cfg.gpus_per_node)
    w = workload or load_workload(cfg.workload, cfg.shape, cfg.source)
    if cfg.mlm_fraction is not None:  # the masked-LM head on a fraction of the tokens
        check_mlm(w.arch, cfg.mlm_fraction, cfg.source)
        w = from_arch(w.name, w.arch, mlm_fraction=cfg.mlm_fraction)  # type: ignore[arg-type]
    n_layers = len(w.layers) or len(w.blocks)
    cfg, res = resolve(
        cfg,
        cluster.world,
        n_layers,
        tied_embeddings=w.tied_embeddings,
        arch=w.arch,
        devices_per_node=cluster.devices_per_node,
    )
    check_world(cluster.world)  # beyond the simulator's bounds: one line, before any work
    if refusal := cluster.instance.device.backend_refusal(cfg.backend):
        raise ConfigError(refusal, field="backend")
    if profile is None and cfg.profile:
        # a profile names the workload as given (a config.json by its path), shaped only by its file
        profile = load_profile(cfg.profile, w.name if cfg.shape.given() else spec_name(cfg.workload))
    check_float8(cfg, cluster.instance.device, w.arch, profile is not None)
    check_attention(cfg, cluster.instance.device.model, w.arch)
    if profile:
        cluster = profile.apply(cluster)  # the measured links of this topology, if profiled
    if cfg.calibration:
        cluster = calibrated(cluster, cfg.calibration)  # fitted figures over the topology's
    ranks_w = rank_workload(w, res.tp, cfg.strategy.sequence_parallel, cfg.mlm_fraction, res.cp, res.dims.expert_tp)
    cm = ComputeModel(
        cluster.instance.device,
        cfg.precision,
        profile,
        cfg.optimizer_impl,
        ranks_w.arch,  # the shape a rank's kernels see (a cp-th of the sequence with context parallelism)
        sync_ranks=cluster.world,
        reduce_dtype=cfg.grad_dtype,
        tp=res.tp,
        sequence_parallel=cfg.strategy.sequence_parallel,
        optimizer_kind=cfg.optimizer,
        attention=cfg.attention,
        compile=cfg.compile,
        float8=cfg.float8,
        float8_all_gather=cfg.float8_all_gather,
        cp=res.cp,
        moe_imbalance=cfg.moe_imbalance,
        moe_capacity=cfg.moe_capacity,
        ep=res.ep,
    )
    if cfg.strategy.spec.is_pipeline and cfg.strategy.layers_per_stage == AUTO:
        cfg, res = auto_split(cfg, res, ranks_w, cm)
    memory = step_memory(cfg, res, ranks_w, cluster)
    return Prepared(cfg, res, w, ranks_w, cluster, cm, memory, profile)


def auto_split(cfg: RunConfig, res: Resolved, w: Workload, cm: ComputeModel) -> tuple[RunConfig, Resolved]:
    """`cfg` and `res` with layers_per_stage auto settled: the split whose slowest stage is
    fastest (`stage_split.balanced_split`), each block's forward, backward and recomputation at
    the microbatch, the embedding on the first stage and the head (with the loss) on the last."""
    bt = BlockTimes(cm, checkpointing_of(cfg, w.layers))
    mb = res.microbatch_size

    def seconds(blocks: list[Block]) -> float:
        costs = [(bt.block(b, mb), bt.recompute_s(b, mb)) for b in blocks]
        return sum(c.fwd_s + c.bwd_s + again for c, again in costs)

    embed, layers, head = pipeline_blocks(w, ends_apart(res))
    counts = balanced_split([seconds([b]) for b in layers], seconds(embed), seconds(head), res.stages)
    text = ",".join(map(str, counts))
    return cfg.replace(strategy=cfg.strategy.replace(layers_per_stage=text)), replace(res, layer_counts=tuple(counts))


def rank_workload(
    w: Workload,
    tp: int,
    sequence_parallel: bool,
    mlm_fraction: float | None = None,
    cp: int = 1,
    expert_tp: int | None = None,
) -> Workload:
    """The model as one rank runs it: `w` itself, or one tensor-parallel rank's shards of it
    (with its masked-LM head where `mlm_fraction` is given; its routed experts split over
    `expert_tp` ranks, tp unless given: `ParallelDims.expert_tp`), on a cp-th of each sequence
    with context parallelism (`cp_workload`)."""
    if tp == 1 and cp == 1:
        return w
    assert w.arch is not None  # resolve refuses tensor and context parallelism of a model without an Arch
    if cp > 1:
        return cp_rank_workload(w.name, w.arch, tp, sequence_parallel and tp > 1, cp)
    return _tp_rank_workload(w.name, w.arch, tp, sequence_parallel, mlm_fraction, expert_tp)


@lru_cache(maxsize=64)
def _tp_rank_workload(
    name: str, arch: Arch, tp: int, sp: bool, mlm_fraction: float | None, expert_tp: int | None = None
) -> Workload:
    """`from_arch` of one tensor-parallel rank, once per process and argument values (pure, and a
    Workload is frozen: the sweep asks for the same few for many configurations)."""
    return from_arch(name, arch, tp, sp, mlm_fraction, expert_tp)


def _process_memory(reserved_gib: float, res: Resolved, cluster: Cluster) -> ProcessMemory:
    """A rank's process total as nvidia-smi shows it with the allocator's `reserved_gib`
    (`memory.process_memory`: with its CUDA context and NCCL's buffers on `cluster`)."""
    from shardsim.simulator.network.nccl_runs import channels, compute_capability

    dev = cluster.instance.device
    return process_memory(reserved_gib, res, dev, channels(cluster), compute_capability(dev.model))


def step_memory(cfg: RunConfig, res: Resolved, ranks_w: Workload, cluster: Cluster) -> MemoryBreakdown:
    """Memory of the worst rank class of `cfg`'s step on `cluster`, each rank running `ranks_w`:
    estimated before (and without) planning or simulating the step."""
    from shardsim.simulator.network.nccl_runs import compute_capability

    dev = cluster.instance.device
    overhead = _process_memory(0.0, res, cluster).runtime_gib
    workspace = cublas_workspace_bytes(compute_capability(dev.model)) if dev.kind == "gpu" else 0
    ranks_w = attention_saves(ranks_w, cfg.attention, DTYPE_BYTES[cfg.precision])
    ranks_w = compiled_saves(ranks_w, cfg.compile)
    ckpt = checkpointing_of(cfg, ranks_w.layers)
    classes = rank_classes(res, ranks_w, cfg.strategy.spec.is_pipeline)
    words = state_words(cfg.optimizer, ranks_w)
    f8_elems = float8_layer_elems(cfg, ranks_w, res.tp)
    held: list[float | None] = [None] * len(classes)
    if cfg.strategy.spec.is_pipeline and res.multi_stage:
        parts = [ckpt.saved_parts([b for part in bs for b in part]) for bs in stage_blocks(res, ranks_w)]
        saved = {s: kept for s, (kept, _) in enumerate(parts)}
        rebuilt = max(r for _, r in parts)  # one recomputation at a time on a rank
        held = [rank_held_activations(res, r, saved) + rebuilt for r in range(res.pp)]
    buffers = 0.0
    if res.ep > 1:  # the experts' units and activations of the busiest EP rank, its dispatch buffers
        classes, buffers = ep_classes(classes, res.ep, cfg.moe_imbalance, cfg.moe_capacity)
    mems = [
        rank_memory(
            cfg, res, rc, blocks, s, dev, ckpt, words, f8_elems, held[s], overhead, workspace, arch=ranks_w.arch
        )
        for s, (rc, blocks) in enumerate(classes)
    ]
    if buffers:
        extra = buffers * res.microbatch_size * DTYPE_BYTES[cfg.precision] / 2**30
        mems = [replace(m, activations_gib=m.activations_gib + extra) for m in mems]
    return max(mems, key=lambda m: m.required_gib)


def _summarize(
    cfg,
    res: Resolved,
    w: Workload,
    cluster: Cluster,
    cm: ComputeModel,
    worst: MemoryBreakdown,
    plan: Plan | None,
    spans,
    config: bool = True,
) -> StepPrediction:
    """The prediction of `w` (whose FLOPs the MFU counts); without a plan (not simulated: it does
    not fit in memory) its times are NaN; `config` False: its `config` empty."""
    dev = cluster.instance.device
    samples = res.global_batch
    if plan is not None:
        ends = {}
        for s in spans:
            ends[s.rank_class] = max(ends.get(s.rank_class, 0.0), s.end)
        critical = max(ends, key=lambda rc: ends[rc])
        step = ends[critical]
        bd = _critical_breakdown(plan, spans, critical)
        counts = Counter(op.coll for op in plan.ops if op.kind == "comm")
    else:
        step = float("nan")
        bd = dict.fromkeys(("compute_s", "exposed_comm_s", "bubble_s", "optimizer_s", "comm_total_s"), step)
        counts = Counter()
    flops = model_flops_per_sample(w) * samples  # model FLOPs, the MFU convention (`economics`)
    if plan is None:  # not simulated: no rate either
        tflops, rate = step, step
    else:
        tflops = flops / step / res.world / 1e12 if step > 0 else 0.0
        rate = samples / step if step > 0 else float("inf")
    fits = worst.required_gib <= dev.memory_gib
    reason = "" if fits else f"needs {worst.required_gib:.2f} GiB per rank, device has {dev.memory_gib:g} GiB"
    price = cluster.price_per_hour_usd
    money = economics(step, samples, res.world, sequence_length(w), price)
    peak_precision, peak_tflops = mfu_peak(dev.peak_tflops, cfg.precision)
    proc = _process_memory(worst.reserved_gib, res, cluster)
    fp8_peak = dev.float8.peak_tflops if cfg.float8 != "none" and dev.float8 is not None else None
    key = result_key(cfg, topology=cluster.instance.name, nodes=cluster.nodes, world=res.world, device=dev.model)
    return StepPrediction(
        **{name: getattr(key, name) for name in KEY_FIELDS},
        config=cfg.to_dict() if config else {},
        cluster=cluster.describe(),
        global_batch=samples,
        step_time_s=step,
        samples_per_s=rate,
        breakdown=bd,
        tflops_per_device=tflops,
        mfu=tflops / peak_tflops,
        memory_allocated_gib=worst.allocated_gib,
        memory_reserved_gib=worst.reserved_gib,
        memory_required_gib=worst.required_gib,
        device_memory_gib=dev.memory_gib,
        fits=fits,
        fit_reason=reason,
        memory=worst.to_dict(),
        collectives=dict(counts),
        cost_per_hour_usd=price,
        params=w.params,
        peak_tflops=peak_tflops,
        mfu_peak_precision=peak_precision,
        mfu_formula=mfu_formula(w),
        **asdict(money),
        memory_process_gib=proc.process_gib,
        memory_process={
            "reserved_gib": proc.reserved_gib,
            "cuda_context_gib": proc.cuda_context_gib,
            "nccl_buffers_gib": proc.nccl_buffers_gib,
        },
        float8=None if fp8_peak is None else cfg.float8,
        peak_tflops_fp8=fp8_peak,
        mfu_fp8_peak=None if fp8_peak is None else tflops / fp8_peak,
        active_params=w.active_params if w.moe else None,
        moe=_moe_summary(cfg, res, w, cm, plan, spans) if w.moe else None,
        spans=spans,
        class_labels=[f"{c.label} (ranks {c.first_rank}-{c.first_rank + c.count - 1})" for c in plan.classes]
        if plan is not None
        else [],
    )


def _moe_summary(cfg, res: Resolved, w: Workload, cm: ComputeModel, plan: Plan | None, spans) -> dict[str, float]:
    """`moe_breakdown` of the rank's workload; with expert parallelism its degree, the busiest EP
    rank's rows over the mean rank's, and the all-to-alls' seconds per microbatch on the critical
    rank class (summed over the step's MoE layers, forward, backward and recomputation) and the
    part of them no compute hides (`all_to_all_exposed_s`; NaN when not simulated)."""
    sp = cfg.strategy.sequence_parallel
    out = moe_breakdown(cm, res, rank_workload(w, res.tp, sp, cfg.mlm_fraction, res.cp, res.dims.expert_tp))
    if res.ep == 1:
        return out
    first = next(b.moe for b in w.blocks if b.moe is not None)
    out["ep"] = res.ep
    out["ep_rank_imbalance"] = rank_factor(first, 1, cm.moe_imbalance, cm.moe_capacity, res.ep)
    a2a, exposed = float("nan"), float("nan")
    if plan is not None:
        ends = {s.rank_class: s.end for s in spans}
        rc = max(ends, key=lambda c: ends[c])
        mine = [s for s in spans if s.rank_class == rc]
        busy = union([(s.start, s.end) for s in mine if s.kind != "comm"])
        comm = union([(s.start, s.end) for s in mine if s.kind == "comm" and plan.ops[s.op].coll == "all_to_all"])
        a2a = float(length(comm)) / cfg.grad_accum
        exposed = float(length(subtract(comm, busy))) / cfg.grad_accum
    out["all_to_all_s"], out["all_to_all_exposed_s"] = a2a, exposed
    return out


def moe_breakdown(cm: ComputeModel, res: Resolved, w: Workload) -> dict[str, float]:
    """An MoE model's layers in parts, per microbatch as one rank runs a layer (its tensor-parallel
    shards, all its experts), forward and backward, summed over the model's MoE layers (a
    pipeline's stages together; `ComputeModel.moe_parts`:
    each part alone, without the eager floor); beside them the load they were costed at: the
    busiest expert's token copies per microbatch and layer, the mean's, and the bytes one token
    copy carries to its expert (what an expert-parallel plan dispatches)."""
    out: dict[str, float] = {}
    moe_blocks = [b for b in w.blocks if b.moe is not None]
    for b in moe_blocks:
        for name, seconds in cm.moe_parts(b, res.microbatch_size).items():
            out[name] = out.get(name, 0.0) + seconds
    first = moe_blocks[0].moe
    assert first is not None
    out["moe_layers"] = len(moe_blocks)
    out["tokens_per_expert_mean"] = first.mean_rows * res.microbatch_size
    out["tokens_per_expert_busiest"] = (
        min(cm.moe_imbalance, cm.moe_capacity or math.inf) * out["tokens_per_expert_mean"]
    )
    out["bytes_per_token_dispatched"] = first.dispatch_elems_per_token * DTYPE_BYTES[cm.precision]
    return out


def save_trace(pred: StepPrediction, path: str | Path) -> None:
    write_chrome_trace(path, pred.spans, pred.class_labels, {"prediction": pred.to_dict()})
