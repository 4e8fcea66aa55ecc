"""The configuration tree shared by the simulator and the runtime: pydantic models, frozen and
closed (``extra="forbid"``), strict about types.

Each setting's type, bound (`specs.bounds.SETTING_BOUNDS`) and choices are in its annotation,
with a `Setting` that gives its help text, whether it has a flag, and the sweep's list flag where
a sweep spans it; `flags` generates the command line from them and `load` reads files into them.
`RunConfig`'s strategy is the discriminated union on ``kind`` of `strategy`; a file's flat form
is put in the tree by `file_form`. A wrong name or value is one `ConfigError` naming the field
(`errors.config_error`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    Field,
    InstanceOf,
    TypeAdapter,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic import ValidationError as _ValidationError

from shardsim.config.deepspeed_settings import DeepSpeedSettings
from shardsim.config.errors import config_error
from shardsim.config.file_form import FILE_FORM_KEYS, tree_of, workload_value
from shardsim.config.frozen import Frozen
from shardsim.config.setting import Setting, bounded
from shardsim.config.strategy import (
    MODELS,
    STRATEGY_FIELDS,
    DdpConfig,
    Strategy,
    StrategyBase,
    StrategyConfig,
    strategy_from_dict,
)
from shardsim.core.errors import ConfigError
from shardsim.specs.bounds import MAX_MOE_FACTOR, SETTING_BOUNDS
from shardsim.specs.model.arch import SHAPE_FIELDS, Arch, Shape, arch_dict
from shardsim.specs.parallel_dims import ParallelDims
from shardsim.specs.schedules import SINGLE
from shardsim.specs.stage_split import even_split
from shardsim.specs.strategies import ALIASES
from shardsim.specs.strategies import STRATEGIES as KINDS

# tf32: fp32 storage, matmuls on the TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32)
Precision = Literal["fp32", "fp16", "bf16", "tf32"]
ReduceDtype = Literal["fp32", "fp16", "bf16"]  # the dtypes gradients are reduced in (no tf32 storage type)
Backend = Literal["nccl", "gloo"]
# whose collectives: PyTorch's flat NCCL ones, SageMaker's (MiCS), or DeepSpeed's ZeRO (its partitioning and buckets)
Library = Literal["pytorch", "smp", "deepspeed"]
# torch.optim.Adam, AdamW, SGD(momentum=0.9), Adafactor; LAMB (NVIDIA apex / DeepSpeed) simulated only
Optimizer = Literal["adam", "adamw", "sgd", "lamb", "adafactor"]
# the scaled-dot-product-attention backend (torch.nn.attention.SDPBackend FLASH_ATTENTION,
# EFFICIENT_ATTENTION, CUDNN_ATTENTION, MATH): fused flash, fused memory-efficient (xformers'
# kernel), fused cuDNN, or unfused; or eager: no SDPA, the matmuls and softmax as Hugging Face's
# eager attention writes them
AttentionImpl = Literal["flash", "efficient", "cudnn", "math", "eager"]
# torch.optim.Adam(foreach=True) | Adam(fused=True) | Adam(foreach=False)
OptimizerImpl = Literal["foreach", "fused", "per-parameter"]
# of the layers; selective as torchtitan: every k-th layer, or op-level
Checkpointing = Literal["none", "full", "selective"]
# torchao's Float8 training recipes of the linears (Float8LinearRecipeName): none | tensorwise | rowwise
Float8 = Literal["none", "tensorwise", "rowwise"]

STRATEGIES = tuple(KINDS)
PRECISIONS: tuple[str, ...] = get_args(Precision)
REDUCE_DTYPES: tuple[str, ...] = get_args(ReduceDtype)
ATTENTIONS: tuple[str, ...] = get_args(AttentionImpl)
BACKENDS: tuple[str, ...] = get_args(Backend)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
OPTIMIZER_IMPLS: tuple[str, ...] = get_args(OptimizerImpl)
CHECKPOINTING: tuple[str, ...] = get_args(Checkpointing)
FLOAT8: tuple[str, ...] = get_args(Float8)
# collective algorithms (simulator/network/collectives.py)
ALGOS = ("ring", "tree", "nvls", "nvls_tree", "hierarchical")
PROTOCOLS = ("LL", "LL128", "Simple")  # NCCL's protocols (simulator/network/nccl_model.py)
SAC_OP = "op"  # selective_ac_option of op-level selective checkpointing (otherwise an integer k)
DATA_PARALLEL = tuple(
    k for k, v in KINDS.items() if not v.is_pipeline
)  # the kinds a `sharded_data_parallel_degree` names


def sac_option(value: Any, field: str) -> str:
    """selective_ac_option: op, or k >= 1 (every k-th layer), kept as text as torchtitan does."""
    text = str(value).strip() if isinstance(value, int | str) and not isinstance(value, bool) else ""
    if text != SAC_OP and not (text.isdigit() and int(text) >= 1):
        raise ConfigError(f"expected op or an integer k >= 1 (every k-th layer), got {value!r}", field=field)
    return text


def _shape(value: Any) -> Shape:
    """A `Shape`, or a mapping of shape fields (each bounded as its flag is) made into one."""
    if isinstance(value, Shape):
        value = value.given()
    if not isinstance(value, dict):
        raise ConfigError(f"expected a mapping of {', '.join(SHAPE_FIELDS)}, got {value!r}", field="shape")
    for k in value:
        if k not in SHAPE_FIELDS:
            raise ConfigError(f"unknown key; expected one of {', '.join(SHAPE_FIELDS)}", field=k)
    try:
        return Shape(**_SHAPE.validate_python({k: v for k, v in value.items() if v is not None}).model_dump())
    except _ValidationError as exc:
        raise config_error(exc) from None


def _over(name: str, what: str) -> Any:
    return Annotated[int, bounded(name), Setting(f"{what}, over the workload's", default_text="the workload's")]


class _ShapeFields(Frozen):
    """Shape fields given over the workload's (``--seq-len 8192``), bounded as the model's are."""

    seq_len: _over("seq_len", "tokens per sample") | None = None  # type: ignore[valid-type]
    hidden: _over("hidden", "hidden size") | None = None  # type: ignore[valid-type]
    layers: _over("layers", "transformer layers") | None = None  # type: ignore[valid-type]
    heads: _over("heads", "attention heads") | None = None  # type: ignore[valid-type]
    kv_heads: _over("kv_heads", "key/value heads (grouped-query attention)") | None = None  # type: ignore[valid-type]
    ffn: _over("ffn", "MLP inner size") | None = None  # type: ignore[valid-type]
    vocab: _over("vocab", "vocabulary size") | None = None  # type: ignore[valid-type]


_SHAPE = TypeAdapter(_ShapeFields)
assert tuple(_ShapeFields.model_fields) == SHAPE_FIELDS


class RunConfig(Frozen):
    """Everything that defines one training step, for prediction and for a real run."""

    workload: Annotated[
        str | InstanceOf[Arch],
        Setting(
            "library model name, model .yaml, Hugging Face config.json, inline {family: ..., hidden: ...}, "
            "or pkg.module:build_fn"
        ),
    ] = "vit-630m"
    topology: Annotated[str, Setting("instance type name (e.g. p4d.24xlarge) or a YAML path")] = "g4dn.12xlarge"
    nodes: Annotated[
        Annotated[int, bounded("nodes")] | None,
        Setting(
            "number of nodes (instances)",
            default_text="the file's, else 8 on the default topology, else the topology's own count",
        ),
    ] = 8
    gpus_per_node: Annotated[
        Annotated[int, bounded("gpus_per_node")] | None,
        Setting(
            "GPUs used on each node: part of an instance (1, 2 or 4 of 8), its NICs' share, the whole instance's price",
            default_text="all of the node's",
        ),
    ] = None
    strategy: StrategyConfig = Field(default_factory=lambda: Strategy())
    batch_per_device: Annotated[
        int,
        bounded("batch_per_device"),
        Setting(
            "samples per device per micro-step",
            default_text="4; a language model's, about 8,192 tokens: 8192 // its sequence length, 1 to 4",
        ),
    ] = 4
    grad_accum: Annotated[
        int, bounded("grad_accum"), Setting("micro-steps per optimizer step (gradient accumulation)")
    ] = 1
    # the parameters' compute dtype (FSDP2's param_dtype, autocast's dtype)
    precision: Annotated[
        Precision,
        Setting(
            "training precision (tf32: fp32 storage, matmuls on TF32 tensor cores: A100, H100 and later)",
            default_text="fp32; bf16 for a language model on a device with bf16 tensor cores",
            axis="precisions",
            axis_help=f"training precisions, some of {','.join(PRECISIONS)} (default: the file's, else fp32)",
        ),
    ] = "fp32"
    checkpointing: Annotated[
        Checkpointing,
        Setting(
            "activation checkpointing of the layers",
            axis="checkpointing",
            axis_help=f"activation checkpointing, some of {','.join(CHECKPOINTING)} (alone: full; default: the "
            "file's, else full)",
            alone="full",
            negated="none",
        ),
    ] = "full"
    selective_ac_option: Annotated[
        str,
        Setting(
            "selective checkpointing: op (keep matmul outputs) or k (every k-th layer)",
            axis="selective_ac_options",
            axis_help="selective checkpointing: op and/or k (every k-th layer), e.g. op,2 (default: the file's, "
            "else op)",
        ),
    ] = SAC_OP
    # dtype of gradient reduction and of held gradients; None: the precision
    reduce_dtype: Annotated[
        ReduceDtype | None,
        Setting(
            "dtype of gradient reduction and held gradients (DDP: of its bucket all-reduce, by a compression hook)",
            default_text="the precision; DDP: fp32",
            axis="reduce_dtypes",
            axis_help="gradient reduction dtypes (default: the file's, else the precision; DDP rows: fp32)",
        ),
    ] = None
    backend: Annotated[Backend, Setting("communication library")] = "nccl"
    library: Annotated[
        Library,
        Setting(
            "training library whose collectives are predicted: pytorch (FSDP2 / DDP: flat NCCL collectives), smp "
            "(SageMaker model parallel: MiCS's hierarchical all-gather across nodes; set by a distribution block) or "
            "deepspeed (DeepSpeed's ZeRO stages: its partitioning and buckets; set by a zero_optimization block)",
            default_text="pytorch; smp for the seed scenario (no workload and no topology named)",
        ),
    ] = "pytorch"
    deepspeed: Annotated[
        DeepSpeedSettings | None,
        Setting(
            "library deepspeed's ZeRO settings (bucket sizes, overlap_comm, stage 3's limits, train_batch_size), "
            "from a zero_optimization block and a ds_config's batch keys",
            flag=False,
            default_text="DeepSpeed's defaults",
        ),
    ] = None
    optimizer: Annotated[
        Optimizer,
        Setting(
            "the optimizer: adam, adamw, sgd (momentum 0.9), lamb (simulated only: not in PyTorch), adafactor",
            axis="optimizers",
            axis_help=f"optimizers, some of {','.join(get_args(Optimizer))} (default: the file's, else adam)",
        ),
    ] = "adam"
    optimizer_impl: Annotated[
        OptimizerImpl,
        Setting(
            "the optimizer's implementation (torch.optim's foreach, fused or per-parameter loop)",
            axis="optimizer_impls",
            axis_help=f"optimizer implementations, some of {','.join(OPTIMIZER_IMPLS)} (default: the file's, else "
            "foreach)",
        ),
    ] = "foreach"
    attention: Annotated[
        AttentionImpl,
        Setting(
            "attention kernel (SDPA backend): flash, efficient (memory-efficient), cudnn (cuDNN's fused kernel: "
            "sm80+ GPUs, fp16 / bf16) or math (unfused: the S x S scores in memory, in fp32); or eager (no SDPA: "
            "Hugging Face's eager attention, unfused in the training precision)",
            axis="attentions",
            axis_help=f"attention kernels, some of {','.join(ATTENTIONS)} (default: the file's, else flash)",
        ),
    ] = "flash"
    compile: Annotated[
        bool,
        Setting(
            "torch.compile the transformer blocks (memory-bound chains fused into fewer kernels)",
            axis="compile",
            axis_help="torch.compile: true, false or both (default: the file's, else false)",
        ),
    ] = False
    float8: Annotated[
        Float8,
        Setting(
            "Float8 training of the linears as torchao does it (convert_to_float8_training, torchtitan's filter): "
            "none, tensorwise or rowwise scaling; needs FP8 tensor cores (H100, H200) and bf16",
            axis="float8",
            axis_help=f"Float8 recipes, some of {','.join(FLOAT8)} (default: the file's, else none)",
        ),
    ] = "none"
    float8_all_gather: Annotated[
        bool,
        Setting(
            "FSDP2 all-gathers the Float8 linears' weights in float8 (torchao enable_fsdp_float8_all_gather, "
            "scales precomputed: precompute_float8_dynamic_scale_for_fsdp); tensorwise only"
        ),
    ] = False
    mlm_fraction: Annotated[
        Annotated[float, Field(gt=0, le=1)] | None,
        Setting(
            "masked-LM head: the LM head and loss on this fraction of each sequence's tokens (BERT: 0.15); "
            "bidirectional text models only",
            default_text="every token",
            axis="mlm_fractions",
            axis_help="masked-LM fractions (default: the file's, else every token)",
        ),
    ] = None
    moe_imbalance: Annotated[
        Annotated[float, Field(ge=1, le=MAX_MOE_FACTOR, allow_inf_nan=False)],
        Setting(
            "mixture of experts: the busiest expert's tokens over the mean, per MoE layer (1: the router spreads "
            "tokens evenly, stated as ideal; at most experts / top_k)",
            axis="moe_imbalances",
            axis_help="mixture of experts: imbalances to try, a what-if axis (default: the configuration's, 1.0)",
        ),
    ] = 1.0
    moe_capacity: Annotated[
        Annotated[float, Field(ge=0, le=MAX_MOE_FACTOR, allow_inf_nan=False)],
        Setting(
            "mixture of experts: the capacity factor (an expert takes at most this x the mean tokens, the rest "
            "dropped); 0: dropless",
            default_text="0 (dropless)",
        ),
    ] = 0.0
    profile: Annotated[str | None, Setting("measured profile file (shardsim profile)")] = None
    # a calibration file (shardsim calibrate): fitted figures over the topology's
    calibration: Annotated[
        str | None, Setting("calibration file (shardsim calibrate): fitted figures over the topology's")
    ] = None
    seed: Annotated[int, bounded("seed"), Setting("seed of the synthetic data and the model's initialization")] = 0
    shape: InstanceOf[Shape] = Field(default_factory=Shape)  # shape fields given over the workload's
    source: str = Field("defaults", exclude=True)  # where it was read from, as errors name it

    @model_validator(mode="before")
    @classmethod
    def _file_form(cls, data: Any) -> Any:
        """A file's form (the strategy's and shape's fields flat, SageMaker's and FSDP's keys)
        into the tree, as a file is read (`file_form.tree_of`). Without a node count: the seed's 8
        nodes on the default topology; on another topology, the topology decides (None: an
        emulated cluster has its own count, an instance type gives 1), as for a file or flags."""
        if isinstance(data, dict) and "topology" in data and "nodes" not in data:
            data = {**data, "nodes": None}
        if isinstance(data, dict) and not data.keys().isdisjoint(FILE_FORM_KEYS):
            return tree_of(data, data.get("source") if isinstance(data.get("source"), str) else None)
        return data

    @field_validator("strategy", mode="before")
    @classmethod
    def _strategy(cls, value: Any) -> Any:
        """A kind's name, or a mapping of flat strategy fields as records hold them: the fields
        its kind does not carry are left out once they say nothing (`strategy_fields`)."""
        if isinstance(value, str):
            return Strategy(value)
        if isinstance(value, dict):
            return strategy_from_dict(value)
        if not isinstance(value, StrategyBase):
            raise ConfigError(f"expected a kind's name, a mapping or Strategy(...), got {value!r}", field="strategy")
        return value

    @field_validator("workload", mode="before")
    @classmethod
    def _workload(cls, value: Any) -> Any:
        return workload_value(value, None)

    @field_validator("gpus_per_node")
    @classmethod
    def _part_of_node(cls, value: int | None) -> int | None:
        """A power of two (1, 2, 4 of an 8-GPU node), as an instance's GPUs split by its PCIe switches."""
        if value is not None and value & (value - 1):
            raise ConfigError(f"expected a power of two (1, 2, 4, ...), got {value}", field="gpus_per_node")
        return value

    @field_validator("checkpointing", mode="before")
    @classmethod
    def _checkpointing(cls, value: Any) -> Any:
        if isinstance(value, bool):  # the seed's spelling, as older records hold it: true = full, false = none
            return "full" if value else "none"
        return value

    @field_validator("selective_ac_option", mode="before")
    @classmethod
    def _sac_option(cls, value: Any) -> Any:
        return sac_option(value, "selective_ac_option")

    @field_validator("shape", mode="before")
    @classmethod
    def _shape_fields(cls, value: Any) -> Shape:
        return _shape(value)

    @model_validator(mode="after")
    def _deepspeed_library(self) -> RunConfig:
        """DeepSpeed's settings are library deepspeed's: refused beside another library."""
        if self.deepspeed is not None and self.library != "deepspeed":
            raise ConfigError(f"applies to library deepspeed, got library {self.library}", field="deepspeed")
        return self

    @model_validator(mode="after")
    def _float8_all_gather(self) -> RunConfig:
        """torchao's Float8LinearConfig: enable_fsdp_float8_all_gather only with tensorwise scaling."""
        if self.float8_all_gather and self.float8 != "tensorwise":
            raise ConfigError(
                f"float8_all_gather needs float8: tensorwise (torchao all-gathers tensorwise-scaled weights only), "
                f"got float8: {self.float8}",
                field="float8_all_gather",
            )
        return self

    @model_serializer(mode="wrap")
    def _drop_unset_part_of_node(self, handler: Any) -> dict[str, Any]:
        """gpus_per_node only where given, float8 and float8_all_gather only where on, the MoE
        settings only where set: a whole node's configuration without Float8 or experts reads as
        before they existed."""
        d = handler(self)
        if d.get("gpus_per_node", 0) is None:
            del d["gpus_per_node"]
        if d.get("deepspeed", 0) is None:
            del d["deepspeed"]
        if d.get("float8") == "none":
            del d["float8"]
        if d.get("float8_all_gather") is False:
            del d["float8_all_gather"]
        for name, off in (("moe_imbalance", 1.0), ("moe_capacity", 0.0)):  # a mixture of experts' only
            if d.get(name) == off:
                del d[name]
        return d

    @field_serializer("workload")
    def _dump_workload(self, value: str | Arch) -> Any:
        return value if isinstance(value, str) else arch_dict(value)

    @field_serializer("shape")
    def _dump_shape(self, value: Shape) -> dict[str, int | None]:
        return asdict(value)

    @property
    def grad_dtype(self) -> str:
        """The dtype gradients are reduced in (FSDP2's MixedPrecisionPolicy.reduce_dtype); tf32 stores fp32."""
        return self.reduce_dtype or self.storage_precision

    @property
    def storage_precision(self) -> str:
        """The dtype parameters and activations are held in: the precision's, fp32 for tf32."""
        return "fp32" if self.precision == "tf32" else self.precision

    @property
    def ddp_reduce_dtype(self) -> str:
        """The dtype DDP all-reduces gradients in: fp32 (its own, no hook) unless reduce_dtype
        names fp16 / bf16 (PyTorch's fp16_compress_hook / bf16_compress_hook)."""
        return self.reduce_dtype or "fp32"

    def checkpointing_label(self) -> str:
        """on | off | selective op | selective k=2 | ..."""
        if self.checkpointing != "selective":
            return "on" if self.checkpointing == "full" else "off"
        opt = self.selective_ac_option
        return f"selective {opt if opt == SAC_OP else f'k={opt}'}"

    def replace(self, **changes: Any) -> RunConfig:
        """This configuration with `changes`, validated as a new one is."""
        return RunConfig(**{**{k: getattr(self, k) for k in type(self).model_fields}, **changes})

    def to_dict(self) -> dict[str, Any]:
        """The resolved configuration: every setting, the strategy with its kind's fields."""
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_dict(cls, data: Any, where: str | None = None) -> RunConfig:
        """A configuration from `to_dict`'s form (older records' spellings too); ConfigError naming the field."""
        if not isinstance(data, dict):
            raise ConfigError(f"expected a mapping, got {type(data).__name__}", where=where)
        try:
            return cls(**data, **({"source": where} if where else {}))
        except ConfigError as err:
            raise ConfigError(err.message, where=where, field=err.field) from None


def _from_dims(name: str, doc: str) -> Any:
    """A `Resolved` property read from its `dims`."""
    return property(lambda self: getattr(self.dims, name), doc=doc)


@dataclass(frozen=True)
class Resolved:
    """A configuration checked against its cluster: its parallel dimensions (`dims`, the device
    mesh) and the batch numbers every consumer needs. The mesh's sizes are also read by name."""

    dims: ParallelDims
    microbatches: int
    microbatch_size: int  # samples per microbatch on one pipeline replica / one data-parallel rank
    global_batch: int  # samples per optimizer step, all ranks, all accumulation steps
    schedule: str = "1f1b"  # a pipeline's (`specs.schedules`)
    stages_per_rank: int = 1  # a pipeline's virtual stages per rank
    layer_counts: tuple[int, ...] | None = None  # layers of each of the pp x stages_per_rank stages; None: even

    @property
    def stages(self) -> int:
        """Pipeline stages in all: pp x stages_per_rank."""
        return self.pp * self.stages_per_rank

    @property
    def multi_stage(self) -> bool:
        """Whether the schedule is one of PyTorch's PipelineScheduleMulti (its own per-rank order)."""
        return self.schedule not in SINGLE

    def stage_counts(self, n_layers: int) -> list[int]:
        """Layers of each pipeline stage (the given split, else as even as possible)."""
        return list(self.layer_counts) if self.layer_counts else even_split(n_layers, self.stages)

    world = _from_dims("world", "Ranks in all.")
    dp_shard = _from_dims("dp_shard", "Data-parallel ranks a parameter is sharded over (the batch split among them).")
    cp = _from_dims("cp", "Context-parallel degree: the ranks of a group share their samples and split the sequence.")

    ep = _from_dims("ep", "Expert-parallel degree: a group's ranks split their MoE layers' experts (and the batch).")

    @property
    def shard(self) -> int:
        """Ranks a parameter is sharded over (1 = replicated): dp_shard × cp (torchtitan's dp_shard_cp),
        × the data-parallel ranks EP takes (the experts: over `ParallelDims.efsdp`)."""
        return self.dims.dp_shard * self.dims.cp * self.dims.size("ep")

    replicas = _from_dims("dp_replicate", "Data-parallel replicas of each model piece (per stage for pipeline).")
    pp = _from_dims("pp", "Pipeline stages.")
    tp = _from_dims("tp", "Tensor-parallel degree: the ranks of a group share their samples.")
    tp_inner = _from_dims("tp_inner", "Tensor-parallel ranks consecutive (mesh pp,dp,tp), else dp innermost.")
    dp = _from_dims("dp", "Data-parallel ranks of a pipeline stage (of the world without pipeline): shard × replicas.")


@dataclass(frozen=True)
class FlatSetting:
    """One flat key of a configuration file and the flag that overrides it (``--batch-per-device``),
    derived from the tree: a `RunConfig` field, the strategy's kind or one of its kinds' fields, or
    a shape field."""

    name: str
    help: str
    kind: type  # str | int | bool
    choices: tuple[str, ...] | None
    flag: bool
    default: Any
    default_text: str | None
    axis: str | None
    axis_help: str | None
    alone: str | None
    negated: str | None
    minimum: int | None = None
    maximum: int | None = None
    aliases: tuple[tuple[str, str], ...] = ()  # (another name of a choice, the choice)

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")


def _flat(name: str, info: Any, default: Any) -> FlatSetting:
    setting = next((m for m in info.metadata if isinstance(m, Setting)), None)
    ann = info.annotation
    union = get_origin(ann) in (Union, UnionType)
    base = next(a for a in get_args(ann) if a is not type(None)) if union else ann
    inner = [m for m in info.metadata if not isinstance(m, Setting)]
    # unwrap Annotated[..] | None
    while hasattr(base, "__metadata__"):
        inner += [m for m in base.__metadata__ if not isinstance(m, Setting)]
        setting = setting or next((m for m in base.__metadata__ if isinstance(m, Setting)), None)
        base = get_args(base)[0]
    choices = get_args(base) if get_origin(base) is Literal else None
    kind = str if choices else base if base in (int, bool, float) else str
    b = SETTING_BOUNDS.get(name)
    assert setting is not None, f"setting {name} has no Setting"
    return FlatSetting(
        name,
        setting.help,
        kind,
        choices,
        setting.flag,
        default,
        setting.default_text,
        setting.axis,
        setting.axis_help,
        setting.alone,
        setting.negated,
        b.minimum if b else None,
        b.maximum if b else None,
    )


def _settings() -> tuple[FlatSetting, ...]:
    out = []
    defaults = RunConfig()
    for name, info in RunConfig.model_fields.items():
        if name == "source":
            continue
        if name == "strategy":
            kind = _flat("strategy", DdpConfig.model_fields["kind"], defaults.strategy.kind)
            out.append(FlatSetting(**{**kind.__dict__, "choices": STRATEGIES, "aliases": tuple(ALIASES.items())}))
            for f in STRATEGY_FIELDS:
                m = next(m for m in MODELS.values() if f in m.model_fields)
                default = getattr(defaults.strategy, f)
                out.append(_flat(f, m.model_fields[f], default))
        elif name == "shape":
            for f in SHAPE_FIELDS:
                out.append(_flat(f, _ShapeFields.model_fields[f], None))
        else:
            out.append(_flat(name, info, getattr(defaults, name)))
    return tuple(out)


SETTINGS = _settings()  # every flat key, in the order flags list them
FIELDS = tuple(s.name for s in SETTINGS)
AXES = tuple(s for s in SETTINGS if s.axis)  # the settings a sweep spans with lists of its own
# of those, the run's settings beside the strategy (a sweep's rows name them when it lists them)
RUN_SETTING_AXES = tuple(s for s in AXES if s.name != "strategy" and s.name not in STRATEGY_FIELDS)


def fraction_value(v: Any, field: str | None) -> float:
    """A fraction in (0, 1] (a number or its text), or ConfigError naming `field`."""
    try:
        x = float(v) if not isinstance(v, bool) else math.nan
    except (TypeError, ValueError):
        x = math.nan
    if not 0 < x <= 1:
        raise ConfigError(f"expected numbers in (0, 1], got {v!r}", field=field)
    return x


def axis_values(s: FlatSetting, values: Any) -> tuple[Any, ...]:
    """A sweep's list of values of setting `s`, each checked as the setting is (its type, bound
    or choices, an alias read as its choice); ConfigError naming the list (`s.axis`) on an empty
    list or the first bad value."""
    if isinstance(values, str | bytes) or not isinstance(values, tuple | list):
        raise ConfigError(f"expected a list, got {values!r}", field=s.axis)
    if not values:
        raise ConfigError("empty list", field=s.axis)
    out = []
    for v in values:
        if s.name == "selective_ac_option":
            v = sac_option(v, s.axis)
        elif s.kind is bool and not isinstance(v, bool):
            raise ConfigError(f"expected true or false, got {v!r}", field=s.axis)
        elif s.name == "moe_imbalance":
            if isinstance(v, bool) or not isinstance(v, int | float) or not 1 <= v <= MAX_MOE_FACTOR:
                raise ConfigError(f"expected numbers from 1 to {MAX_MOE_FACTOR:g}, got {v!r}", field=s.axis)
            v = float(v)
        elif s.kind is float:
            v = fraction_value(v, s.axis)
        elif s.kind is int:
            if isinstance(v, bool) or not isinstance(v, int) or v < (s.minimum or 0):
                raise ConfigError(f"expected integers >= {s.minimum}, got {v!r}", field=s.axis)
            if s.maximum is not None and v > s.maximum:
                raise ConfigError(f"{v:,} is beyond the simulator's bound of {s.maximum:,}", field=s.axis)
        elif s.choices is not None:
            v = dict(s.aliases).get(v, v) if isinstance(v, str) else v
            if v not in s.choices:
                raise ConfigError(f"unknown value {v!r}; expected some of {', '.join(s.choices)}", field=s.axis)
        out.append(v)
    return tuple(out)
