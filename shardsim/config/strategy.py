"""The strategy's configuration: a discriminated union on ``kind`` whose members carry only their
kind's fields (`DdpConfig`, `ZeroConfig`, `Zero2DConfig`, `PipelineConfig`, `Zero1Config`);
`Strategy(kind, **fields)` builds the member, `strategy_fields` and `strategy_from_dict` build it
from flat fields (a file's, flags', a record's), which `check_flat` checks against the kind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import BeforeValidator, Field, TypeAdapter, model_serializer
from pydantic import ValidationError as _ValidationError

from shardsim.config.cp import check_cp_kind
from shardsim.config.ep import check_ep_kind
from shardsim.config.errors import config_error
from shardsim.config.frozen import Frozen
from shardsim.config.setting import Setting, bounded
from shardsim.core.errors import ConfigError
from shardsim.specs import schedules
from shardsim.specs.parallel_dims import ORDERS, ParallelDims
from shardsim.specs.stage_split import layers_per_stage_text
from shardsim.specs.strategies import (
    DDP,
    DEFAULT_KIND,
    PIPELINE,
    ZERO,
    ZERO1,
    ZERO2D,
    StrategySpec,
    kind_name,
)
from shardsim.specs.strategies import STRATEGIES as KINDS

Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev"]
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b")  # a sweep's default: the one-stage-a-rank schedules
assert get_args(Schedule) == schedules.ALL, "the schedule choices and specs.schedules disagree"

DEGREE_HELP = Setting(
    "sharded data parallel degree (partition group size)",
    default_text="the world for zero, 1 for pipeline, a node's GPUs for zero2d (HYBRID_SHARD's default)",
    axis="degrees",
    axis_help="shard degrees for zero2d and for pipeline stages, 1 = unsharded stages (default: every divisor); "
    "ddp (1) and zero (world) are kept when selected",
)
RESHARD_HELP = Setting(
    "zero/zero2d: free gathered blocks after forward (false: ZeRO-2)",
    axis="reshard_after_forward",
    axis_help="zero/zero2d: true (ZeRO-3), false (ZeRO-2) or both (default: the file's, else true)",
)
Degree = Annotated[int, bounded("degree"), DEGREE_HELP]
Reshard = Annotated[bool, RESHARD_HELP]
Stages = Annotated[
    int,
    bounded("pp"),
    Setting(
        "pipeline stages", axis="pp", axis_help="pipeline degrees (default: every divisor of the world, 2..layers)"
    ),
]
Microbatches = Annotated[
    int,
    bounded("microbatches"),
    Setting(
        "microbatches per pipeline replica and step",
        axis="microbatches",
        axis_help="microbatch counts (default: pp, 2pp, 4pp where they divide the per-replica batch)",
    ),
]
ScheduleField = Annotated[
    Schedule,
    Setting(
        "pipeline schedule (PyTorch's: gpipe, 1f1b; with virtual stages interleaved-1f1b, looped-bfs, "
        "interleaved-zb, zbv, dualpipev)",
        axis="schedules",
        axis_help="pipeline schedules (default gpipe,1f1b)",
    ),
]
StagesPerRank = Annotated[
    int,
    bounded("stages_per_rank"),
    Setting(
        "pipeline stages each rank holds (virtual stages: 2+ for interleaved-1f1b and interleaved-zb, "
        "2 for zbv and dualpipev)",
        axis="stages_per_rank",
        axis_help="stages per rank (default 1 for gpipe and 1f1b, 2 for the others)",
    ),
]
LayersPerStage = Annotated[
    str,
    BeforeValidator(layers_per_stage_text),
    Setting(
        "layers of each pipeline stage, first to last (3,4,4,3: pp x stages_per_rank of them, summing to the "
        "model's layers), or auto: balanced by predicted stage time with the embedding and the head "
        "(default: as even as possible)"
    ),
]
TpDegree = Annotated[
    int,
    bounded("tp"),
    Setting(
        "tensor-parallel degree: Megatron-style column / row parallel layers (DTensor) over groups of tp ranks",
        axis="tp_degrees",
        axis_help="tensor-parallel degrees (default: each divisor of the GPUs per node that divides the heads and FFN)",
    ),
]
SequenceParallel = Annotated[
    bool,
    Setting(
        "tensor parallelism with sequence parallelism: norms and residuals sharded along the sequence "
        "(all-gather / reduce-scatter instead of all-reduce)",
        axis="sequence_parallel",
        axis_help="sequence parallelism for tp > 1: true, false or both (default: true where tp divides the tokens)",
    ),
]
AsyncTp = Annotated[
    bool,
    Setting(
        "asyncTP: the all-gather -> matmul and matmul -> reduce-scatter pairs fused, each matmul in chunks beside the "
        "next chunk's transfer (inductor's micro-pipeline pass; needs sequence parallelism and compile)"
    ),
]
# the device mesh's dimensions, outermost first: tensor parallelism innermost (consecutive ranks, on
# one node's NVLink) by default; "pp,tp,dp" puts data parallelism innermost
MeshOrder = Literal[tuple(ORDERS)]  # type: ignore[valid-type]
MESH_ORDERS: tuple[str, ...] = get_args(MeshOrder)
MeshOrderField = Annotated[MeshOrder, Setting("device mesh order, outermost first (tp innermost: on NVLink)")]
TpAcrossNodes = Annotated[
    bool, Setting("allow a tensor-parallel group to span nodes (by default tp must divide the GPUs per node)")
]
CpDegree = Annotated[
    int,
    bounded("cp"),
    Setting(
        "context-parallel degree: each sample's sequence split over cp ranks, attention as PyTorch's ring "
        "attention (context_parallel); parameters sharded over dp_shard x cp",
        axis="cp",
        axis_help="context-parallel degrees (default 1)",
    ),
]
CpRotate = Literal["allgather", "alltoall"]
CpRotateField = Annotated[
    CpRotate,
    Setting(
        "how ring attention passes keys and values between the cp ranks (PyTorch's set_rotate_method): "
        "one all-gather before the rounds, or a ring exchange each round"
    ),
]
EpDegree = Annotated[
    int,
    bounded("ep"),
    Setting(
        "expert-parallel degree (a model with experts): each MoE layer's experts sharded over groups of ep "
        "data-parallel ranks, tokens sent to them and back by all-to-all; the rest sharded with FSDP2 over all "
        "of them, the experts over the data-parallel ranks left after EP (zero, zero2d, a pipeline's sharded "
        "stages)",
        axis="ep",
        axis_help="expert-parallel degrees (default 1), each with the zero, zero2d and sharded-stage pipeline "
        "rows it divides",
    ),
]
EtpDegree = Annotated[
    int,
    bounded("etp"),
    Setting(
        "the routed experts' tensor-parallel degree with ep > 1 and tp > 1, torchtitan's two: 1 (its default; "
        "EP borrows ranks from dp_shard x tp, each tensor-parallel rank dispatching a tp-th of the tokens to whole "
        "experts) or tp (EP borrows from dp_shard only, the experts also tensor-parallel over tp)",
        axis="etp",
        axis_help="the experts' tensor-parallel degrees, 1 or tp (default: both, where ep > 1 and tp > 1)",
    ),
]
KIND_HELP = Setting(
    "how the model is distributed",
    axis="strategies",
    axis_help="kinds to include",  # with its default, which the sweep knows (`add_axis_arguments`)
)


TP_FIELDS = ("tp", "sequence_parallel", "async_tp", "mesh_order", "tp_across_nodes")
CP_FIELDS = ("cp", "cp_rotate")
CP_DEFAULTS = {"cp": 1, "cp_rotate": "allgather"}  # PyTorch's default rotate method
EP_FIELDS = ("ep", "etp")


class StrategyBase(Frozen):
    """What every kind's model answers, whatever fields it carries; tensor parallelism, which
    composes with every kind (the mesh: pp × dp × tp, `mesh_order`), and context parallelism
    (`config.cp`: with the kinds that shard with FSDP2 and pipelines), and expert parallelism
    (`config.ep`: with the kinds that shard with FSDP2)."""

    tp: TpDegree = 1
    sequence_parallel: SequenceParallel = False
    async_tp: AsyncTp = False
    mesh_order: MeshOrderField = "pp,dp,tp"
    tp_across_nodes: TpAcrossNodes = False
    cp: CpDegree = 1
    cp_rotate: CpRotateField = "allgather"
    ep: EpDegree = 1
    etp: EtpDegree = 1

    @model_serializer(mode="wrap")
    def _kind_first(self, handler: Any) -> dict[str, Any]:
        """The kind and its own fields first, tensor parallelism's after them, then context
        parallelism's where cp > 1 and expert parallelism's where ep > 1, etp where not 1 (a
        configuration without them reads as it did before them)."""
        d = handler(self)
        tp = {k: d.pop(k) for k in TP_FIELDS if k in d}
        cp = {k: d.pop(k) for k in CP_FIELDS if k in d}
        ep = {k: d.pop(k) for k in EP_FIELDS if k in d}
        if ep.get("etp") == 1:  # torchtitan's default etp: left out, as before it was a field
            del ep["etp"]
        return d | tp | (cp if cp.get("cp", 1) > 1 else {}) | (ep if ep.get("ep", 1) > 1 else {})

    @property
    def spec(self) -> StrategySpec:
        """The kind's checks, label and capabilities (`specs.strategies`)."""
        return KINDS[self.kind]  # type: ignore[attr-defined]

    @property
    def mesh(self) -> ParallelDims:
        """The mesh dimensions this strategy sets by itself (pp, tp, the order); the data-parallel
        sizes, which take the world, are `resolve`'s (`Resolved.dims`)."""
        etp = self.etp if self.ep > 1 and self.tp > 1 else None  # type: ignore[attr-defined]
        return ParallelDims(pp=self.pp, cp=self.cp, ep=self.ep, tp=self.tp, mesh_order=self.mesh_order, etp=etp)  # type: ignore[attr-defined]

    def label(self) -> str:
        """The kind's label, with its tensor parallelism where tp > 1 (``zero2d d=4 tp=2 sp``)."""
        return self.spec.label(self) + self.tp_label()  # type: ignore[arg-type]

    def tp_label(self) -> str:
        """`` cp=2 alltoall tp=2 sp async`` (the mesh's dimensions the kind does not name,
        `ParallelDims.label`, the rotate method when not PyTorch's default, and the mesh order when
        not the default): "" without tensor or context parallelism."""
        dims = self.mesh.label()
        if self.cp > 1 and self.cp_rotate != CP_DEFAULTS["cp_rotate"]:
            dims = dims.replace(f"cp={self.cp}", f"cp={self.cp} {self.cp_rotate}")
        if self.tp == 1:
            return dims
        sp = " sp" if self.sequence_parallel else ""
        overlap = " async" if self.async_tp else ""
        order = f" mesh {self.mesh_order}" if self.mesh_order != MESH_ORDERS[0] else ""
        return f"{dims}{sp}{overlap}{order}"

    def sharded_degree(self, world: int) -> int:
        """Ranks a parameter is sharded over, as SageMaker's `sharded_data_parallel_degree`
        counts it: 1 for ddp, the world for zero, the degree for zero2d and pipeline stages."""
        return self.spec.sharded_degree(self, world)  # type: ignore[arg-type]

    def replace(self, **changes: Any) -> StrategyConfig:
        """This strategy with `changes` (a ``kind`` among them builds that kind), validated."""
        return Strategy(**{**self.model_dump(), **changes})


class _OneStage(StrategyBase):
    """A kind without pipeline stages: one stage, one microbatch (its schedule says nothing)."""

    pp = property(lambda self: 1)
    microbatches = property(lambda self: 1)
    schedule = property(lambda self: "1f1b")
    stages_per_rank = property(lambda self: 1)
    layers_per_stage = property(lambda self: None)


class DdpConfig(_OneStage):
    """DistributedDataParallel: no field of its own (replicated; one stage; ZeRO-3 not applicable)."""

    kind: Annotated[Literal[DDP.name], KIND_HELP] = DDP.name

    degree = property(lambda self: None)
    reshard_after_forward = property(lambda self: True)


class ZeroConfig(_OneStage):
    """FSDP2 over the whole world; `degree` None or the world (resolve settles it to the world)."""

    kind: Annotated[Literal[ZERO.name], KIND_HELP] = ZERO.name
    degree: Degree | None = None
    reshard_after_forward: Reshard = True  # False: ZeRO-2 (FSDP2 keeps gathered blocks from forward to backward)


class Zero2DConfig(_OneStage):
    """FSDP2 sharded within groups of `degree` consecutive ranks, replicated across them (None:
    within each node)."""

    kind: Annotated[Literal[ZERO2D.name], KIND_HELP] = ZERO2D.name
    degree: Degree | None = None  # None: the data-parallel ranks of one node (HYBRID_SHARD's default), by resolve
    reshard_after_forward: Reshard = True


class PipelineConfig(StrategyBase):
    """`pp` stages of consecutive blocks, `microbatches` under a `schedule`; `degree` shards
    each stage over its replicas (None: 1, plain data parallel)."""

    kind: Annotated[Literal[PIPELINE.name], KIND_HELP] = PIPELINE.name
    pp: Stages = 1
    microbatches: Microbatches = 1
    schedule: ScheduleField = "1f1b"
    degree: Degree | None = None
    stages_per_rank: StagesPerRank = 1
    layers_per_stage: LayersPerStage | None = None

    reshard_after_forward = property(lambda self: True)


class Zero1Config(_OneStage):
    """DDP with ZeroRedundancyOptimizer (ZeRO-1): replicated like ddp, Adam's state partitioned
    over the data-parallel ranks; no field of its own."""

    kind: Annotated[Literal[ZERO1.name], KIND_HELP] = ZERO1.name

    degree = property(lambda self: None)
    reshard_after_forward = property(lambda self: True)


StrategyConfig = Annotated[
    Union[DdpConfig, ZeroConfig, Zero2DConfig, PipelineConfig, Zero1Config],  # noqa: UP007 (a discriminated union)
    Field(discriminator="kind"),
]
MODELS: dict[str, type[StrategyBase]] = {
    m.model_fields["kind"].default: m for m in (DdpConfig, ZeroConfig, Zero2DConfig, PipelineConfig, Zero1Config)
}
assert set(MODELS) == set(KINDS), "a strategy kind without its configuration model, or the reverse"
_STRATEGY = TypeAdapter(StrategyConfig)
# the strategy's fields besides the kind, in the order flags list them
STRATEGY_FIELDS = (
    "degree",
    "pp",
    "microbatches",
    "schedule",
    "stages_per_rank",
    "layers_per_stage",
    "reshard_after_forward",
    *TP_FIELDS,
    *CP_FIELDS,
    *EP_FIELDS,
)
assert set(STRATEGY_FIELDS) == {f for m in MODELS.values() for f in m.model_fields if f != "kind"}


@dataclass(frozen=True)
class _FlatStrategy:
    """A strategy's fields as flat settings give them, before its kind's model is built: what
    a kind's `check` refuses (``specs.strategies``) is checked on it."""

    kind: str
    degree: Any = None
    pp: Any = 1
    microbatches: Any = 1
    schedule: Any = "1f1b"
    stages_per_rank: Any = 1
    layers_per_stage: Any = None
    reshard_after_forward: Any = True
    tp: Any = 1
    sequence_parallel: Any = False
    async_tp: Any = False
    mesh_order: Any = "pp,dp,tp"
    tp_across_nodes: Any = False
    cp: Any = 1
    cp_rotate: Any = "allgather"
    ep: Any = 1
    etp: Any = 1


def check_flat(s: _FlatStrategy, where: str | None) -> None:
    """Refuse (ConfigError naming the field) flat strategy fields that contradict the kind: what
    the kind's own `check` refuses, a pipeline's fields on another kind, ZeRO-2 on a kind that
    does not shard with FSDP2."""
    spec = KINDS[s.kind]
    spec.check(s, where)  # type: ignore[arg-type]
    if not spec.is_pipeline:
        if s.pp != 1:
            raise ConfigError(f"pp={s.pp} needs strategy pipeline, got {s.kind}", where=where, field="pp")
        for name, neutral in (
            ("microbatches", 1),
            ("schedule", "1f1b"),
            ("stages_per_rank", 1),
            ("layers_per_stage", None),
        ):
            if getattr(s, name) != neutral:
                why = f"{name} {getattr(s, name)!r} applies to a pipeline, not {s.kind}"
                raise ConfigError(why, where=where, field=name)
    if s.sequence_parallel is True and s.tp == 1:
        raise ConfigError("sequence parallelism applies with tp > 1", where=where, field="sequence_parallel")
    if s.async_tp is True and s.sequence_parallel is not True:
        why = "asyncTP overlaps sequence parallelism's all-gathers and reduce-scatters; set sequence_parallel"
        raise ConfigError(why, where=where, field="async_tp")
    check_cp_kind(s.cp, s.cp_rotate, spec, where)
    check_ep_kind(s.ep, s, spec, where)
    if s.reshard_after_forward is False and not spec.fsdp:
        fsdp = " and ".join(k for k, v in KINDS.items() if v.fsdp)
        why = f"reshard_after_forward false (ZeRO-2) applies to {fsdp}, not {s.kind}"
        raise ConfigError(why, where=where, field="reshard_after_forward")


def strategy_fields(kind: str, flat: dict[str, Any], where: str | None) -> dict[str, Any]:
    """The fields of a `kind` strategy from flat settings (a file's, flags'): checked by
    `check_flat`, those the kind does not carry left out once they say nothing (pp 1, ...)."""
    check_flat(_FlatStrategy(kind, **flat), where)
    own = MODELS[kind].model_fields
    return {"kind": kind, **{k: v for k, v in flat.items() if k in own}}


def strategy_from_dict(d: dict[str, Any], where: str | None = None) -> StrategyConfig:
    """A strategy from a mapping of its kind and flat fields (a record's, older ones listing every
    field of every kind): ConfigError naming a field that no kind has or that contradicts the kind."""
    rest = {k: v for k, v in d.items() if k != "kind" and v is not None}
    for k in rest:
        if k not in STRATEGY_FIELDS:
            raise ConfigError(f"unknown key; expected kind or one of {', '.join(STRATEGY_FIELDS)}", field=k)
    kind = d.get("kind", DEFAULT_KIND)
    kind = kind_name(kind) if isinstance(kind, str) else kind
    if not isinstance(kind, str) or kind not in MODELS:
        raise ConfigError(f"unknown strategy {kind!r}; expected one of {', '.join(KINDS)}", field="strategy")
    return Strategy(**strategy_fields(kind, rest, where))


def Strategy(kind: str = DEFAULT_KIND, **fields: Any) -> StrategyConfig:  # noqa: N802 (builds a union member)
    """The strategy of `kind` with `fields` (None: not given); a field the kind does not carry,
    an unknown kind or a bad value is a ConfigError naming the field. `kind` may be an alias
    (``fsdp``, ``hsdp``: `specs.strategies.ALIASES`)."""
    kind = kind_name(kind) if isinstance(kind, str) else kind
    if not isinstance(kind, str) or kind not in MODELS:
        raise ConfigError(f"unknown strategy {kind!r}; expected one of {', '.join(KINDS)}", field="strategy")
    given = {k: v for k, v in fields.items() if v is not None}
    own = MODELS[kind].model_fields
    check_flat(_FlatStrategy(kind, **{k: v for k, v in given.items() if k in STRATEGY_FIELDS}), None)
    for k in given:
        if k not in own:
            carried = ", ".join(f for f in own if f != "kind") or "none"
            raise ConfigError(f"not a field of strategy {kind} (its fields: {carried})", field=k)
    try:
        return _STRATEGY.validate_python({"kind": kind, **given})
    except _ValidationError as exc:
        raise config_error(exc) from None
