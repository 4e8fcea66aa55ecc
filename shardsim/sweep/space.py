"""The space a sweep searches: which configurations to try, and their enumeration.

`enumerate_configs(base, space)` lists the strategies each cluster admits — ddp, zero, zero2d
at every degree that divides the world, pipelines at every valid degree × microbatch count ×
schedule, alone or with sharded stages — and keeps those `resolve()` accepts, in a fixed order,
each with a rough cost estimate for scheduling the predictions. The settings (ZeRO-2,
checkpointing, reduce dtype, Adam's implementation) are the base configuration's unless the
space lists several: then every strategy is tried with every combination, and its label names
the settings that differ from the base's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shardsim.config import (
    SCHEDULES,
    RunConfig,
    Strategy,
    resolve,
)
from shardsim.config.schema import AXES, RUN_SETTING_AXES, axis_values
from shardsim.config.strategy import CP_DEFAULTS
from shardsim.core.errors import ConfigError
from shardsim.simulator.attention_impl import cudnn_refusal
from shardsim.simulator.scale import MAX_SWEEP_SPACE, plan_ops_estimate, plan_refusal
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.bounds import MAX_BATCH, MAX_GRAD_ACCUM, world_refusal
from shardsim.specs.hardware.topology import Cluster, InstanceType, make_cluster
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.workload import Workload
from shardsim.specs.parallel_dims import ParallelDims
from shardsim.specs.schedules import ZERO_BUBBLE
from shardsim.specs.stage_split import AUTO
from shardsim.sweep.faces import DEFAULT_SWEEP, FACES, Face, divisors


@dataclass(frozen=True)
class SweepSpace:
    """Which configurations to try. None means "all valid" for that axis.

    strategies: kinds to include (default ddp, zero, zero2d, pipeline; zero1 when listed).
    degrees: shard degrees where a kind has a choice — zero2d's partition group size and a
      pipeline stage's shard degree (1 = unsharded stages). ddp (1) and zero (the world)
      have no choice and are kept whenever their kind is selected.
    pp: pipeline degrees; default every divisor of the world from 2 up to the layer count.
    microbatches: default pp, 2·pp, 4·pp where they divide the per-replica batch; given
      explicitly, every listed count that divides it.
    schedules: pipeline schedules (gpipe, 1f1b).
    stages_per_rank: a pipeline rank's virtual stages; default 1 for gpipe and 1f1b, 2 for the
      others; a (schedule, stages per rank, microbatches) PyTorch refuses is left out. A base
      pipeline's layers_per_stage auto splits every pipeline row so; a list is refused (it
      fits one stage count).
    topologies / nodes: the clusters (product of both); None = the base config's.
    global_batch: strong scaling — batch_per_device = global_batch / (world × grad_accum),
      clusters where it does not divide are skipped. None = each cluster's own, as
      `hold_global_batch` says (weak scaling across clusters).
    hold_global_batch: where no global batch is given and the space lists no batch axis nor
      searches the batch, every layout of a cluster runs the global batch of the data-parallel
      layout (batch_per_device × world × grad_accum: `held_global_batch`), so a tensor-parallel
      group of t devices gets t times the batch per group; False: batch_per_device per group
      whatever the layout, so layouts run different global batches.

    The settings, None = the base configuration's only (opt-in lists, each a dimension more):
    reshard_after_forward: for zero and zero2d (False: ZeRO-2); other kinds keep True.
    checkpointing: none | full | selective; selective_ac_options: "op" or k (every k-th
      block) for its selective rows.
    reduce_dtypes: gradient reduction dtypes (DDP rows: None and fp32 are its fp32, fp16 / bf16
      its compression hook; sharded rows: None is the precision).
    optimizer_impls: the optimizer's foreach | fused | per-parameter.
    precisions, optimizers, attentions, compile, mlm_fractions, float8, moe_imbalances (a mixture of
      experts' load imbalance, a what-if: `RunConfig.moe_imbalance`): the training stack's
      settings (`STACK_AXES`); a precision the cluster's device lacks drops its rows, and so does
      Float8 on a device without FP8 tensor cores.
    float8_all_gather: with `float8` listed, its tensorwise rows all-gather in float8 (FSDP2's
      float8 all-gather, which torchao allows with tensorwise scaling only); its other rows cannot.
    tp_degrees: tensor-parallel degrees; default every divisor of the GPUs per node that the
      model admits (heads, key/value heads, FFN: `config.tp.check_tp`), 1 for models without heads.
    sequence_parallel: for the rows with tp > 1; default true (torchtitan's practice: the same
      bytes as all-reduces, a tp-th of the norms' work and activations) where tp divides a
      sample's tokens, false where it does not.
    cp: context-parallel degrees; default the base's (1): each with every tp, for the kinds
      context parallelism composes with (`config.cp`: zero, zero2d, pipeline), the base's rotate method.
    ep: expert-parallel degrees; default the base's (1): each above 1 with the kinds expert
      parallelism composes with (`config.ep`: zero, zero2d, pipelines of sharded stages under a
      schedule without a split backward), where it divides the shard degree and the model's
      experts (resolve drops the rest); with tp > 1 where the mesh is torchtitan's (tp innermost).
    etp: the experts' tensor-parallel degrees of the rows with ep > 1 and tp > 1, each used where
      it is 1 or the row's tp (`config.ep.check_etp`); default both, 1 (torchtitan's) first.

    The batch (`batch_pairs`), None = the base configuration's:
    batch_sizes: micro-batches per device to try; grad_accums: accumulation steps to try (each
      a dimension more). Under `global_batch` what is not listed follows from it: the batch from
      the accumulation steps, or the steps from the batch; a pair whose product over the
      data-parallel ranks is not the global batch is left out.
    max_batch: search, per configuration, the largest micro-batch per device that fits in memory,
      up to this many (the memory model alone: doubling, then bisection; `batch.largest_fitting`);
      the row is predicted at the batch found (the smallest tried where none fits). Under
      `global_batch` the candidates are the batches it divides into, the accumulation steps
      making up the rest. Not with `batch_sizes`.
    """

    strategies: tuple[str, ...] = DEFAULT_SWEEP
    degrees: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    microbatches: tuple[int, ...] | None = None
    schedules: tuple[str, ...] = SCHEDULES
    stages_per_rank: tuple[int, ...] | None = None
    topologies: tuple[str | InstanceType, ...] | None = None
    nodes: tuple[int | None, ...] | None = None
    global_batch: int | None = None
    hold_global_batch: bool = True
    reshard_after_forward: tuple[bool, ...] | None = None
    checkpointing: tuple[str, ...] | None = None
    selective_ac_options: tuple[str, ...] | None = None
    reduce_dtypes: tuple[str, ...] | None = None
    optimizer_impls: tuple[str, ...] | None = None
    precisions: tuple[str, ...] | None = None
    optimizers: tuple[str, ...] | None = None
    attentions: tuple[str, ...] | None = None
    compile: tuple[bool, ...] | None = None
    float8: tuple[str, ...] | None = None
    float8_all_gather: bool = False
    mlm_fractions: tuple[float, ...] | None = None
    moe_imbalances: tuple[float, ...] | None = None
    tp_degrees: tuple[int, ...] | None = None
    sequence_parallel: tuple[bool, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    etp: tuple[int, ...] | None = None
    batch_sizes: tuple[int, ...] | None = None
    grad_accums: tuple[int, ...] | None = None
    max_batch: int | None = None

    def __post_init__(self) -> None:
        for axis in AXES:  # the axes of the configuration's settings, each value checked as the setting is
            if getattr(self, axis.axis) is not None:
                object.__setattr__(self, axis.axis, axis_values(axis, getattr(self, axis.axis)))
        for v in self.nodes or ():
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"expected integers >= 1, got {v!r}", field="nodes")
        if not isinstance(self.float8_all_gather, bool):
            raise ConfigError(f"expected true or false, got {self.float8_all_gather!r}", field="float8_all_gather")
        if not isinstance(self.hold_global_batch, bool):
            raise ConfigError(f"expected true or false, got {self.hold_global_batch!r}", field="hold_global_batch")
        gb = self.global_batch
        if gb is not None and (isinstance(gb, bool) or not isinstance(gb, int) or gb < 1):
            raise ConfigError(f"expected an integer >= 1, got {self.global_batch!r}", field="global_batch")
        for name in ("topologies", "nodes"):
            if getattr(self, name) is not None and not getattr(self, name):
                raise ConfigError("empty list", field=name)
        for t in self.topologies or ():
            if not isinstance(t, str | InstanceType):
                raise ConfigError(f"expected topology names or YAML paths, got {t!r}", field="topologies")
        for name, bound in (("batch_sizes", MAX_BATCH), ("grad_accums", MAX_GRAD_ACCUM)):
            values = getattr(self, name)
            if values is None:
                continue
            if isinstance(values, str | bytes) or not isinstance(values, tuple | list) or not values:
                raise ConfigError(f"expected a non-empty list, got {values!r}", field=name)
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= bound:
                    raise ConfigError(f"expected integers from 1 to {bound:,}, got {v!r}", field=name)
            object.__setattr__(self, name, tuple(dict.fromkeys(values)))
        if self.max_batch is not None:
            m = self.max_batch
            if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= MAX_BATCH:
                raise ConfigError(f"expected an integer from 1 to {MAX_BATCH:,}, got {m!r}", field="max_batch")
            if self.batch_sizes is not None:
                raise ConfigError("searches the batch: give batch sizes or the search, not both", field="max_batch")
            if self.global_batch is not None and self.grad_accums is not None:
                raise ConfigError(
                    "under a fixed global batch the accumulation steps follow from the batch found: "
                    "give grad accumulation steps or the search, not both",
                    field="max_batch",
                )

    @property
    def spans_settings(self) -> bool:
        """Whether the space lists any setting (then rows carry `SETTING_COLUMNS`)."""
        return any(getattr(self, name) is not None for name in SETTING_AXES)


# the axes of the settings, each a dimension more where listed (rows carry `SETTING_COLUMNS` when
# the space lists any); the other axes choose the strategies
SETTING_AXES = ("reshard_after_forward", *(s.axis for s in RUN_SETTING_AXES))


@dataclass(frozen=True)
class Candidate:
    """One configuration to predict: a checked RunConfig on a known cluster."""

    index: int  # enumeration order (the deterministic tie-break)
    cfg: RunConfig  # normalized by resolve()
    cluster: Cluster
    cost_estimate: float  # relative cost of predicting it (for scheduling work on the pool)
    label: str  # the row's configuration: the strategy's label, and the settings that differ from the base's


# what kind of reason drops a configuration of a kept cluster (`Enumeration.dropped_kinds`)
OVER_OP_BOUND = "over the simulator's op bound"
INVALID_LAYOUT = "invalid layout"
NO_PRECISION = "precision the device lacks"  # or a kernel it cannot run in it (float8, cudnn)


@dataclass
class Enumeration:
    """The candidates in enumeration order, and what was dropped on the way: whole clusters or
    axes (`skipped`, a line each, with the reasons of a cluster where nothing was valid) and single
    configurations of the clusters kept (`dropped`, how many for each reason, in the order first met;
    `dropped_kinds`, the same configurations counted by kind of reason: `OVER_OP_BOUND`,
    `INVALID_LAYOUT`, `NO_PRECISION`)."""

    candidates: list[Candidate] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one line per cluster or axis value dropped
    dropped: Counter[str] = field(default_factory=Counter)  # reason -> configurations dropped for it
    dropped_kinds: Counter[str] = field(default_factory=Counter)  # kind of reason -> configurations


def dropped_line(kinds: dict[str, int]) -> str | None:
    """One line: how many configurations were dropped, and how many of each kind of reason
    (None when none was): ``dropped 1,234 configurations: 1,100 over the simulator's op bound,
    134 invalid layout``."""
    total = sum(kinds.values())
    if not total:
        return None
    each = ", ".join(f"{n:,} {kind}" for kind, n in kinds.items())
    return f"dropped {total:,} configuration{'s' if total > 1 else ''}: {each}"


SETUP_COST = 1600  # cost units (~ plan ops) of a prediction's set-up: block times, memory, the summary
WORLD_COST = 0.5  # cost units per device: planning the collectives over the cluster's links (cached per layout)


def _cost_estimate(cfg: RunConfig, n_layers: int, world: int, simulated: bool = True) -> float:
    """Relative cost of one prediction, for load balancing and the estimate of the time left
    only: the plan's ops (`scale.plan_ops_estimate`; none where it is not `simulated`), a set-up,
    and the cluster's links. Fitted to the timings of sweeps of 32 to 4,096 devices: the time
    left they give is within a quarter or so of the real one from a tenth of the way on."""
    ops = plan_ops_estimate(cfg, n_layers) if simulated else 0
    return float(ops + SETUP_COST + WORLD_COST * world)


def unfit(cfg: RunConfig, cluster: Cluster, w: Workload) -> bool:
    """Does `cfg` (normalized by resolve) not fit in memory on `cluster`, as its row will say? A
    sweep's row of a step that does not fit is its memory alone, never simulated, so the op
    bound does not drop it (False where its checks refuse it: the bound drops it as before)."""
    from shardsim.simulator.predict import prepare

    try:
        return not prepare(cfg, workload=w, cluster=cluster).fits
    except ConfigError:
        return False


def _clusters(base: RunConfig, space: SweepSpace) -> list[tuple[str | InstanceType, int | None]]:
    tops = space.topologies or (base.topology,)
    nodes = space.nodes or (base.nodes,)
    return [(t, n) for t in tops for n in nodes]


def _kinds(space: SweepSpace) -> list[Face]:
    """The space's kinds' faces, in the registry's order."""
    return [f for name, f in FACES.items() if name in space.strategies]


def _strategies_for(
    world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...] = (True,)
) -> Iterable[Strategy]:
    """The data-parallel and pipeline strategies of `world` ranks (a tensor-parallel group counts as one)."""
    for kind in _kinds(space):
        yield from kind.sweep(world, n_layers, batch_per_device, space, reshard)


def strategies_count(
    world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...] = (True,)
) -> int:
    """How many strategies `_strategies_for` yields, counted without making them."""
    return sum(kind.sweep_count(world, n_layers, batch_per_device, space, reshard) for kind in _kinds(space))


def default_tp_degrees(base: RunConfig, cluster: Cluster, arch: Arch | None) -> list[int]:
    """Every divisor of the cluster's GPUs per node that the model admits (heads, key/value heads,
    FFN: `config.tp.check_tp`, tensor-parallel groups within a node); [1] where none above 1 does."""
    from shardsim.config.tp import check_tp

    def admitted(t: int) -> bool:
        try:
            check_tp(
                tp=t, sequence_parallel=False, async_tp=False, tp_inner=True, across_nodes=False,
                world=cluster.world, pp=1, arch=arch, devices_per_node=cluster.devices_per_node,
                backend=base.backend, where=None,
            )  # fmt: skip
        except ConfigError:
            return False
        return True

    return [t for t in divisors(cluster.devices_per_node) if t == 1 or admitted(t)]


@dataclass(frozen=True)
class MeshLayout:
    """The model-parallel dimensions of a sweep's rows (`dims`: tp and cp, in the base's mesh
    order; pp and the data-parallel sizes are the kinds' to enumerate) and their sequence parallelism."""

    dims: ParallelDims
    sequence_parallel: bool = False

    @property
    def group(self) -> int:
        """Ranks that act as one data-parallel rank (a tensor- and context-parallel group)."""
        return self.dims.world

    def fields(self, s: Strategy) -> dict[str, Any]:
        """The strategy fields of this layout (asyncTP, the mesh order, tp_across_nodes and the
        rotate method the base's)."""
        cp = self.dims.cp
        cps = {"cp": cp, "cp_rotate": s.cp_rotate} if cp > 1 else {"cp": 1, "cp_rotate": CP_DEFAULTS["cp_rotate"]}
        tp = self.dims.tp
        if tp == 1:
            return {"tp": 1, "sequence_parallel": False, "async_tp": False} | cps
        sp = self.sequence_parallel
        return (
            {"tp": tp, "sequence_parallel": sp, "async_tp": s.async_tp and sp}
            | cps
            | {
                "mesh_order": s.mesh_order,
                "tp_across_nodes": s.tp_across_nodes,
            }
        )


def mesh_layouts(base: RunConfig, space: SweepSpace, cluster: Cluster, arch: Arch | None) -> list[MeshLayout]:
    """The mesh layouts of the rows the space tries on `cluster`: tp the listed degrees or
    `default_tp_degrees`, each tp > 1 with the listed sequence parallelism, by default on where
    tp divides a sample's tokens and off where it does not (a ViT's 197)."""
    tps = space.tp_degrees if space.tp_degrees is not None else default_tp_degrees(base, cluster, arch)

    def sps(t: int) -> tuple[bool, ...]:
        if t == 1:
            return (False,)
        return space.sequence_parallel or (arch is None or arch.tokens % t == 0,)

    order = base.strategy.mesh_order
    cps = space.cp or (base.strategy.cp,)
    return [
        MeshLayout(ParallelDims(tp=t, cp=c, mesh_order=order), sp)
        for c in cps
        for t in tps
        if cluster.world % (t * c) == 0
        for sp in sps(t)
    ]


# the training stack's settings a sweep may list: (axis, setting), each a dimension more, innermost
STACK_AXES = (
    ("precisions", "precision"),
    ("optimizers", "optimizer"),
    ("attentions", "attention"),
    ("compile", "compile"),
    ("mlm_fractions", "mlm_fraction"),
    ("float8", "float8"),
    ("moe_imbalances", "moe_imbalance"),
)


def _stack_variants(base: RunConfig, space: SweepSpace) -> list[dict[str, Any]]:
    """Every combination of the listed stack settings (`STACK_AXES`), the base's where not listed."""
    out: list[dict[str, Any]] = [{}]
    for axis, name in STACK_AXES:
        values = getattr(space, axis) or (getattr(base, name),)
        out = [v | {name: x} for v in out for x in values]
    if space.float8 is not None:  # float8 all-gather where it applies: the tensorwise rows
        out = [v | {"float8_all_gather": space.float8_all_gather and v["float8"] == "tensorwise"} for v in out]
    return out


def _settings_variants(base: RunConfig, space: SweepSpace) -> list[dict[str, Any]]:
    """The RunConfig fields of every combination of the listed settings, in the order listed
    (the base's value where a setting is not listed); a selective option only with selective
    checkpointing. Reduce dtypes that mean the same for a row (the precision and None where
    sharded, fp32 and None for DDP) are one row by `settings_key`."""
    options = space.selective_ac_options or (base.selective_ac_option,)
    reduce = space.reduce_dtypes or (base.reduce_dtype,)
    return [
        {"checkpointing": ck, "selective_ac_option": opt, "reduce_dtype": rd, "optimizer_impl": impl} | stack
        for ck in space.checkpointing or (base.checkpointing,)
        for opt in (options if ck == "selective" else (base.selective_ac_option,))
        for rd in reduce
        for impl in space.optimizer_impls or (base.optimizer_impl,)
        for stack in _stack_variants(base, space)
    ]


def settings_key(cfg: RunConfig, shard: int) -> tuple:
    """The settings that change a prediction: a selective option only with selective
    checkpointing, the reduce dtype as the row reduces in (FSDP2's, or DDP's: `ddp_reduce_dtype`)."""
    option = cfg.selective_ac_option if cfg.checkpointing == "selective" else None
    reduce = cfg.grad_dtype if shard > 1 else cfg.ddp_reduce_dtype
    stack = tuple(getattr(cfg, name) for _, name in STACK_AXES)
    return cfg.checkpointing, option, reduce, cfg.optimizer, cfg.optimizer_impl, *stack


def settings_suffix(cfg: RunConfig, shard: int, base: RunConfig) -> str:
    """ ", ckpt selective op, reduce fp32, adam fused": the settings of `cfg` that differ from
    the base's ("" when none do; ZeRO-2 is in the strategy's own label)."""
    ck, option, reduce, optimizer, impl, *_ = settings_key(cfg, shard)
    base_ck, base_option, base_reduce, base_optimizer, base_impl, *_ = settings_key(base, shard)
    parts = []
    if (ck, option) != (base_ck, base_option):
        parts.append(f"ckpt {cfg.checkpointing_label()}")
    if reduce != base_reduce:
        parts.append(f"reduce {reduce}")
    if impl != base_impl:
        parts.append(f"{optimizer} {impl}")
    elif optimizer != base_optimizer:
        parts.append(optimizer)
    parts += stack_suffix(cfg, base)
    return "".join(", " + p for p in parts)


def stack_suffix(cfg: RunConfig, base: RunConfig) -> list[str]:
    """The label's parts of the stack settings (but the optimizer) that differ from the base's:
    ``tf32``, ``attn math``, ``compiled`` / ``eager``, ``mlm 0.15`` / ``mlm off``."""
    parts = []
    if cfg.precision != base.precision:
        parts.append(cfg.precision)
    if cfg.attention != base.attention:
        parts.append(f"attn {cfg.attention}")
    if cfg.compile != base.compile:
        parts.append("compiled" if cfg.compile else "eager")
    if cfg.mlm_fraction != base.mlm_fraction:
        parts.append(f"mlm {cfg.mlm_fraction:g}" if cfg.mlm_fraction is not None else "mlm off")
    if cfg.float8 != base.float8:
        parts.append(f"float8 {cfg.float8}")
    if cfg.float8_all_gather and not base.float8_all_gather:
        parts.append("float8 all-gather")
    if cfg.moe_imbalance != base.moe_imbalance:
        parts.append(f"imbalance {cfg.moe_imbalance:g}")
    return parts


def _check_cluster(cfg: RunConfig, cluster: Cluster) -> str | None:
    """Why a whole cluster is out (the checks predict() makes beyond resolve), or None."""
    too_big = world_refusal(cluster.world)
    if too_big:
        return too_big
    dev = cluster.instance.device
    if not dev.supports(cfg.precision):
        return f"{dev.model} has no {cfg.precision} support (peak_tflops lists {', '.join(dev.peak_tflops)})"
    return dev.backend_refusal(cfg.backend)


def _cluster_base(
    base: RunConfig, space: SweepSpace, topology: str | InstanceType, nodes: int | None, arch: Arch | None
) -> tuple[str, Cluster, RunConfig, str | None, list[MeshLayout]]:
    """A cluster of the space: its name, the base configuration on it, why it is skipped (or
    None), and its mesh layouts (`mesh_layouts`; under a fixed global batch,
    those whose data-parallel ranks it divides over)."""
    cluster = make_cluster(topology, nodes, base.gpus_per_node)
    name = f"{cluster.nodes} x {cluster.instance.name}"
    too_big = world_refusal(cluster.world)  # before a configuration is built of its sizes
    if too_big:
        return name, cluster, base, too_big, []
    cfg0 = base.replace(topology=cluster.instance.path if isinstance(topology, InstanceType) else topology)
    cfg0 = cfg0.replace(nodes=cluster.nodes)
    tried = mesh_layouts(base, space, cluster, arch)
    if space.global_batch is None:
        return name, cluster, cfg0, _check_cluster(cfg0, cluster), tried
    layouts = [lay for lay in tried if batch_pairs(base, space, cluster.world, lay.group)]
    if not layouts:
        ga = base.grad_accum
        why = f"global batch {space.global_batch} does not divide over {cluster.world} devices" + (
            f" x grad_accum {ga}" if ga > 1 and space.grad_accums is None and space.batch_sizes is None else ""
        )
        if space.batch_sizes is not None or space.grad_accums is not None:
            why += " at the listed batch sizes and accumulation steps"
        tps = sorted({lay.dims.tp for lay in tried})
        if tps != [1]:  # nor over the data-parallel ranks that tensor parallelism leaves
            why += " (data-parallel ranks: " + ", ".join(f"{cluster.world // t} at tp {t}" for t in tps) + ")"
        return name, cluster, cfg0, why, []
    b, ga = batch_pairs(base, space, cluster.world, layouts[0].group)[0]
    cfg0 = cfg0.replace(batch_per_device=b or PROBE_BATCH, grad_accum=ga)
    return name, cluster, cfg0, _check_cluster(cfg0, cluster), layouts


# Under a batch search, the batch the strategies are enumerated with: pipelines' default microbatch
# counts (pp, 2·pp, 4·pp) all divide its per-replica batch; each is then searched over the batches
# its count divides (`batch_step`).
PROBE_BATCH = 4


def held_global_batch(base: RunConfig, space: SweepSpace, world: int) -> int | None:
    """The global batch every layout on `world` devices runs: the space's `global_batch`, else
    (`hold_global_batch`, no batch axis listed, no search) the data-parallel layout's,
    batch_per_device × world × grad_accum; None where the rows take the batches as listed."""
    if space.global_batch is not None:
        return space.global_batch
    if not space.hold_global_batch or space.max_batch or space.batch_sizes or space.grad_accums:
        return None
    return base.batch_per_device * world * base.grad_accum


def batch_pairs(base: RunConfig, space: SweepSpace, world: int, tp: int) -> list[tuple[int | None, int]]:
    """The (batch per device, grad_accum) pairs the space tries at tensor-parallel degree `tp`
    (batch None: searched, `SweepSpace.max_batch`). Without a global batch every listed batch
    with every listed accumulation count (the base's where not listed); under a global batch N
    (`held_global_batch`)
    over the world / tp data-parallel ranks, those whose batch × grad_accum × ranks is N: the
    batch follows from the steps (or, listed, the steps from the batch); searched, the steps
    follow from the batch found."""
    gas = space.grad_accums or (base.grad_accum,)
    n = held_global_batch(base, space, world)
    if n is None:
        batches: tuple[int | None, ...] = (None,) if space.max_batch else space.batch_sizes or (base.batch_per_device,)
        return [(b, ga) for b in batches for ga in gas]
    dp = world // tp
    if space.max_batch:
        return [(None, 1)] if n % dp == 0 else []
    if space.batch_sizes is None:
        return [(n // (dp * ga), ga) for ga in gas if n % (dp * ga) == 0]
    if space.grad_accums is None:
        return [(b, n // (dp * b)) for b in space.batch_sizes if n % (dp * b) == 0]
    return [(b, ga) for b in space.batch_sizes for ga in gas if b * ga * dp == n]


def batch_candidates(space: SweepSpace, world: int, tp: int, step: int) -> list[int] | range:
    """The batches per device a search tries, ascending: the multiples of `step` up to
    `max_batch`, or under a global batch those of them it divides into over the data-parallel ranks."""
    assert space.max_batch is not None
    if space.global_batch is None:
        return range(step, space.max_batch + 1, step)
    per_rank = space.global_batch // (world // tp)
    return [b for b in range(step, min(per_rank, space.max_batch) + 1, step) if per_rank % b == 0]


def batch_step(cfg: RunConfig) -> int:
    """What a batch per device must be a multiple of for `cfg`'s strategy: a pipeline's microbatch
    count m must divide the per-replica batch (batch × pp), so m / gcd(m, pp); 1 otherwise."""
    from math import gcd

    s = cfg.strategy
    if not s.spec.is_pipeline:
        return 1
    return s.microbatches // gcd(s.microbatches, s.pp)


def batch_suffix(cfg: RunConfig, base: RunConfig, space: SweepSpace) -> str:
    """ ", batch 8, ga 2": the listed batch and accumulation values of `cfg` that differ from the
    base's ("" when the space lists neither)."""
    parts = []
    if space.batch_sizes is not None and cfg.batch_per_device != base.batch_per_device:
        parts.append(f"batch {cfg.batch_per_device}")
    if space.grad_accums is not None and cfg.grad_accum != base.grad_accum:
        parts.append(f"ga {cfg.grad_accum}")
    return "".join(", " + p for p in parts)


def _layout_strategies(
    base: RunConfig,
    cfg0: RunConfig,
    space: SweepSpace,
    cluster: Cluster,
    layouts: list[MeshLayout],
    n_layers: int,
    reshard: tuple[bool, ...],
) -> Iterable[tuple[Strategy, int | None, int]]:
    """Every strategy of the space on `cluster` with every mesh layout of `layouts` and every
    (batch per device, grad_accum) of `batch_pairs` (batch None: searched)."""
    split = {"layers_per_stage": AUTO} if cfg0.strategy.layers_per_stage == AUTO else {}  # the base's auto
    for lay in layouts:
        extra = lay.fields(cfg0.strategy)
        for batch, ga in batch_pairs(base, space, cluster.world, lay.group):
            for strat in _strategies_for(cluster.world // lay.group, n_layers, batch or PROBE_BATCH, space, reshard):
                if lay.dims.cp > 1 and not (strat.spec.fsdp or strat.spec.is_pipeline):
                    continue  # context parallelism shards with FSDP2 (`config.cp`)
                split_ = split if strat.spec.is_pipeline else {}
                for ep in space.ep or (base.strategy.ep,):
                    if ep > 1 and not (
                        _ep_composes(strat) and lay.dims.cp == 1 and (lay.dims.tp == 1 or lay.dims.tp_inner)
                    ):
                        continue  # expert parallelism: FSDP2's ranks, tp innermost, no cp (`config.ep.check_ep_kind`)
                    for etp in _etps(space, ep, lay.dims.tp):
                        expert = {"ep": ep, "etp": etp} if ep > 1 else {}
                        yield strat.replace(**extra, **split_, **expert), batch, ga


def _etps(space: SweepSpace, ep: int, tp: int) -> tuple[int, ...]:
    """The experts' tensor-parallel degrees of a row of `ep` and `tp` (`SweepSpace.etp`)."""
    if ep == 1 or tp == 1:
        return (1,)
    return tuple(e for e in space.etp or (1, tp) if e in (1, tp) and (e == tp or ep % tp == 0 or tp % ep == 0))


def _ep_composes(strat: Strategy) -> bool:
    """Whether expert parallelism composes with `strat` (`config.ep`): FSDP2's kinds, and pipelines
    of sharded stages whose schedule runs whole backward passes."""
    if strat.spec.is_pipeline:
        return (strat.degree or 1) > 1 and strat.schedule not in ZERO_BUBBLE
    return strat.spec.fsdp


def with_batch(cfg: RunConfig, batch: int, space: SweepSpace, world: int) -> RunConfig:
    """`cfg` at `batch` per device; under a global batch with the accumulation steps that make it up."""
    n = space.global_batch
    if n is None:
        return cfg.replace(batch_per_device=batch)
    group = cfg.strategy.tp * cfg.strategy.cp  # ranks that share their samples
    return cfg.replace(batch_per_device=batch, grad_accum=n // (world // group * batch))


def search_batch(cfg: RunConfig, space: SweepSpace, cluster: Cluster, w: Workload) -> int:
    """The largest batch per device of `batch_candidates` at which `cfg` fits in memory (the
    memory model alone, `batch.largest_fitting`), or the smallest candidate where none does;
    ConfigError where there is no candidate (under a global batch, none of its divisors is a
    batch the strategy takes)."""
    from shardsim.sweep.batch import fits_at, largest_fitting

    group = cfg.strategy.tp * cfg.strategy.cp  # ranks that share their samples
    candidates = batch_candidates(space, cluster.world, group, batch_step(cfg))
    if not candidates:
        raise ConfigError(
            f"no batch per device up to {space.max_batch:,} that the global batch divides into and "
            f"{cfg.strategy.label()} takes",
            field="max_batch",
        )

    def fits(b: int) -> bool:
        return fits_at(with_batch(cfg, b, space, cluster.world), cluster, w)

    found = largest_fitting(candidates, fits)
    return candidates[0] if found is None else found


def enumerate_configs(
    base: RunConfig, space: SweepSpace | None = None, workload: Workload | None = None
) -> Enumeration:
    """Every configuration of `space` that resolve() accepts, in a fixed order: clusters in the
    order given (topology, then nodes), then ddp, zero, zero2d by degree (ZeRO-3 before ZeRO-2
    where listed so), pipelines by pp, shard degree, microbatches, schedule; each strategy with
    every combination of the listed settings (checkpointing, selective option, reduce dtype,
    Adam's implementation, in that nesting). Duplicates after normalization are dropped. A
    requested space of more than `MAX_SWEEP_SPACE` configurations, valid or not, is refused
    (ConfigError) before any is checked."""
    space = space or SweepSpace()
    w = workload or load_workload(base.workload, base.shape, base.source)
    n_layers = len(w.layers) or len(w.blocks)
    tied = w.tied_embeddings
    out = Enumeration()
    seen: set[tuple] = set()
    if space.selective_ac_options is not None and "selective" not in (space.checkpointing or (base.checkpointing,)):
        raise ConfigError("selective options need selective checkpointing", field="selective_ac_options")
    if base.strategy.layers_per_stage not in (None, AUTO):
        why = "a sweep splits its pipelines evenly or by auto; a list of counts fits one stage count (predict it)"
        raise ConfigError(why, field="layers_per_stage")
    reshard = space.reshard_after_forward or (base.strategy.reshard_after_forward,)
    variants = _settings_variants(base, space) if space.spans_settings else [{}]
    clusters = [_cluster_base(base, space, topology, nodes, w.arch) for topology, nodes in _clusters(base, space)]
    requested = (
        len(variants)
        * len(space.ep or (1,))
        * (len(space.etp or (1, 2)) if max(space.ep or (1,)) > 1 else 1)
        * sum(
            strategies_count(cluster.world // lay.group, n_layers, batch or PROBE_BATCH, space, reshard)
            for _, cluster, cfg0, why, layouts in clusters
            if not why
            for lay in layouts
            for batch, _ in batch_pairs(base, space, cluster.world, lay.group)
        )
    )
    if requested > MAX_SWEEP_SPACE:
        raise ConfigError(
            f"the requested space holds {requested:,} configurations, beyond the sweep's bound of "
            f"{MAX_SWEEP_SPACE:,}; narrow it (--strategies, --degrees, --pp, --microbatches, fewer clusters or "
            "settings)"
        )
    for name, cluster, cfg0, why, layouts in clusters:
        if why:
            out.skipped.append(f"{name}: {why}")
            continue
        before = len(out.candidates)
        here: Counter[tuple[str, str]] = Counter()  # this cluster's dropped configurations, by (kind, reason)
        for strat, batch, ga in _layout_strategies(base, cfg0, space, cluster, layouts, n_layers, reshard):
            for settings in variants:
                prec = settings.get("precision", cfg0.precision)
                if not cluster.instance.device.supports(prec):  # a listed precision this device lacks
                    here[NO_PRECISION, f"{cluster.instance.device.model} has no {prec} support"] += 1
                    continue
                if settings.get("float8", "none") != "none" and cluster.instance.device.float8 is None:
                    here[NO_PRECISION, f"{cluster.instance.device.model} has no FP8 tensor cores"] += 1
                    continue
                if settings.get("attention", cfg0.attention) == "cudnn" and (
                    no_cudnn := cudnn_refusal(cluster.instance.device.model, prec, w.arch and w.arch.head_dim)
                ):
                    here[NO_PRECISION, no_cudnn.message] += 1
                    continue
                try:
                    compiled = settings.get("compile", cfg0.compile)  # asyncTP needs it (`config.tp`)
                    row = strat if compiled or not strat.async_tp else strat.replace(async_tp=False)
                    cfg = cfg0.replace(strategy=row, grad_accum=ga, **settings)
                    if batch is None:  # searched: the largest that fits (or the smallest tried)
                        cfg = with_batch(cfg, search_batch(cfg, space, cluster, w), space, cluster.world)
                    else:
                        cfg = cfg.replace(batch_per_device=batch)
                    cfg, res = resolve(
                        cfg,
                        cluster.world,
                        n_layers,
                        tied_embeddings=tied,
                        arch=w.arch,
                        devices_per_node=cluster.devices_per_node,
                    )
                except ConfigError as exc:
                    here[INVALID_LAYOUT, exc.message] += 1
                    continue
                key = (cluster.instance.name, cluster.instance.path, cluster.nodes, cfg.strategy)
                key += (cfg.batch_per_device, cfg.grad_accum)
                if settings:
                    key += settings_key(cfg, res.shard)
                if key in seen:
                    continue
                seen.add(key)
                too_big = plan_refusal(cfg, n_layers)
                if too_big and not unfit(cfg, cluster, w):  # one that does not fit is never planned: kept
                    here[OVER_OP_BOUND, too_big.message] += 1
                    continue
                label = cfg.strategy.label() + (settings_suffix(cfg, res.shard, base) if settings else "")
                label += batch_suffix(cfg, base, space)
                cost = _cost_estimate(cfg, n_layers, cluster.world, simulated=not too_big)
                out.candidates.append(Candidate(len(out.candidates), cfg, cluster, cost, label))
        if len(out.candidates) == before:  # the whole cluster is out: one line with the reasons
            reasons = "; ".join(f"{why} ({n} configuration{'s' if n > 1 else ''})" for (_, why), n in here.items())
            nothing = f"the requested strategies have no configuration on {cluster.world} devices"
            out.skipped.append(f"{name}: {reasons or nothing}")
            continue
        for (kind, why), n in here.items():
            out.dropped[why] += n
            out.dropped_kinds[kind] += n
    return out
