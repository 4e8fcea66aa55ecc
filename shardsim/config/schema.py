"""The configuration schema shared by the simulator and the runtime: its dataclasses and fields."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from shardsim.core.errors import ConfigError
from shardsim.simulator.strategies.kinds import DEFAULT_KIND, StrategyKind
from shardsim.simulator.strategies.kinds import STRATEGIES as KINDS
from shardsim.simulator.workload.arch import SHAPE_FIELDS, Arch, Shape

STRATEGIES = tuple(KINDS)
SCHEDULES = ("gpipe", "1f1b")
PRECISIONS = ("fp32", "fp16", "bf16")
BACKENDS = ("nccl", "gloo")
ALGOS = ("ring", "tree", "hierarchical")  # collective algorithms (simulator/network/collectives.py)
OPTIMIZERS = ("adam",)
# torch.optim.Adam(foreach=True) | Adam(fused=True) | Adam(foreach=False)
OPTIMIZER_IMPLS = ("foreach", "fused", "per-parameter")
CHECKPOINTING = ("none", "full", "selective")  # of the layers; selective as torchtitan: every k-th layer, or op-level
SAC_OP = "op"  # selective_ac_option of op-level selective checkpointing (otherwise an integer k)
DATA_PARALLEL = tuple(
    k for k, v in KINDS.items() if not v.is_pipeline
)  # the kinds a `sharded_data_parallel_degree` names


@dataclass(frozen=True)
class Strategy:
    """How the model is distributed.

    kind: ddp | zero (shard over the world) | zero2d (shard within groups of `degree`
    consecutive ranks, replicate across groups) | pipeline (`pp` stages of consecutive
    blocks, `microbatches`, `schedule`; `degree` shards each stage over its replicas).
    `degree` None means: the world for zero, 1 (plain data parallel) for pipeline.
    """

    kind: str = DEFAULT_KIND
    degree: int | None = None
    pp: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    reshard_after_forward: bool = True  # False: ZeRO-2 (FSDP2 keeps gathered blocks from forward to backward)

    @property
    def spec(self) -> StrategyKind:
        """The kind's operations and capabilities (`simulator.strategies.kinds`)."""
        if self.kind not in KINDS:
            raise ConfigError(f"unknown strategy {self.kind!r}; expected one of {', '.join(KINDS)}", field="strategy")
        return KINDS[self.kind]

    def label(self) -> str:
        return self.spec.label(self)

    def sharded_degree(self, world: int) -> int:
        """Ranks a parameter is sharded over, as SageMaker's `sharded_data_parallel_degree`
        counts it: 1 for ddp, the world for zero, the degree for zero2d and pipeline stages."""
        return self.spec.sharded_degree(self, world)


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one training step, for prediction and for a real run."""

    workload: str | Arch = "vit-630m"  # a library name or a file path, or a model described inline
    topology: str = "g4dn.12xlarge"
    nodes: int | None = 8
    strategy: Strategy = field(default_factory=Strategy)
    batch_per_device: int = 4
    grad_accum: int = 1
    precision: str = "fp32"  # the parameters' compute dtype (FSDP2's param_dtype, autocast's dtype)
    checkpointing: str = "full"  # none | full | selective
    selective_ac_option: str = SAC_OP  # selective: "op", or k (every k-th layer, as a string)
    reduce_dtype: str | None = None  # dtype of gradient reduction and of held gradients; None: the precision
    backend: str = "nccl"
    optimizer: str = "adam"
    optimizer_impl: str = "foreach"
    profile: str | None = None
    calibration: str | None = None  # a calibration file (shardsim calibrate): fitted figures over the topology's
    seed: int = 0
    shape: Shape = field(default_factory=Shape)  # shape fields given over the workload's
    source: str = "defaults"

    def __post_init__(self) -> None:
        if isinstance(self.checkpointing, bool):  # the seed's spelling: true = full, false = none
            object.__setattr__(self, "checkpointing", "full" if self.checkpointing else "none")

    @property
    def grad_dtype(self) -> str:
        """The dtype gradients are reduced in (FSDP2's MixedPrecisionPolicy.reduce_dtype)."""
        return self.reduce_dtype or self.precision

    def checkpointing_label(self) -> str:
        """on | off | selective op | selective k=2 | ..."""
        if self.checkpointing != "selective":
            return "on" if self.checkpointing == "full" else "off"
        opt = self.selective_ac_option
        return f"selective {opt if opt == SAC_OP else f'k={opt}'}"

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a file states it. Settings beyond the seed's at their defaults
        are left out, and checkpointing none/full reads false/true, so that the records of
        configurations that do not use them keep their form (the loader reads both spellings)."""
        d = asdict(self)
        d.pop("source")
        base = RunConfig()
        for k in EXTENDED:
            if d[k] == getattr(base, k):
                d.pop(k)
        if d["strategy"]["reshard_after_forward"]:
            d["strategy"].pop("reshard_after_forward")
        if d["checkpointing"] in ("none", "full"):
            d["checkpointing"] = d["checkpointing"] == "full"
        d["shape"] = self.shape.given()
        if not d["shape"]:
            d.pop("shape")
        return d


@dataclass(frozen=True)
class Resolved:
    """A configuration checked against its cluster: the numbers every consumer needs."""

    world: int
    shard: int  # ranks a parameter is sharded over (1 = replicated)
    replicas: int  # data-parallel replicas of each model piece (per stage for pipeline)
    pp: int
    microbatches: int
    microbatch_size: int  # samples per microbatch on one pipeline replica / one rank
    global_batch: int  # samples per optimizer step, all ranks, all accumulation steps


@dataclass(frozen=True)
class Setting:
    """One flat key of a configuration file, and the flag that overrides it (``--batch-per-device``)."""

    name: str
    help: str
    kind: type = str  # str | int | bool
    choices: tuple[str, ...] | None = None
    flag: bool = True  # False: a file key only

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")


SETTINGS = (
    Setting(
        "workload",
        "library model name, model .yaml, Hugging Face config.json, inline {family: ..., hidden: ...}, "
        "or pkg.module:build_fn",
    ),
    Setting("topology", "instance type name (e.g. p4d.24xlarge) or a YAML path"),
    Setting("nodes", "number of nodes (instances)", int),
    Setting("strategy", "how the model is distributed", choices=STRATEGIES),
    Setting("degree", "sharded data parallel degree (partition group size)", int),
    Setting("pp", "pipeline stages", int),
    Setting("microbatches", "microbatches per pipeline replica and step", int),
    Setting("schedule", "pipeline schedule", choices=SCHEDULES),
    Setting("batch_per_device", "samples per device per micro-step", int),
    Setting("grad_accum", "micro-steps per optimizer step (gradient accumulation)", int),
    Setting("precision", "training precision", choices=PRECISIONS),
    Setting("reshard_after_forward", "zero/zero2d: free gathered blocks after forward (false: ZeRO-2)", bool),
    Setting("checkpointing", "activation checkpointing of the layers", choices=CHECKPOINTING),
    Setting("selective_ac_option", "selective checkpointing: op (keep matmul outputs) or k (every k-th layer)"),
    Setting("reduce_dtype", "dtype of gradient reduction and held gradients", choices=PRECISIONS),
    Setting("backend", "communication library", choices=BACKENDS),
    Setting("optimizer", "the optimizer", choices=OPTIMIZERS, flag=False),
    Setting("optimizer_impl", "Adam's implementation", choices=OPTIMIZER_IMPLS),
    Setting("profile", "measured profile file (shardsim profile)"),
    Setting("calibration", "calibration file (shardsim calibrate): fitted figures over the topology's"),
    Setting("seed", "seed of the synthetic data and the model's initialization", int),
    Setting("seq_len", "tokens per sample, over the workload's", int),
    Setting("hidden", "hidden size, over the workload's", int),
    Setting("layers", "transformer layers, over the workload's", int),
    Setting("heads", "attention heads, over the workload's", int),
    Setting("kv_heads", "key/value heads (grouped-query attention), over the workload's", int),
    Setting("ffn", "MLP inner size, over the workload's", int),
    Setting("vocab", "vocabulary size, over the workload's", int),
)
FIELDS = tuple(s.name for s in SETTINGS)
STRATEGY_FIELDS = ("degree", "pp", "microbatches", "schedule", "reshard_after_forward")  # besides the kind
# left out of to_dict at their defaults
EXTENDED = ("selective_ac_option", "reduce_dtype", "optimizer_impl", "calibration")
assert set(SHAPE_FIELDS) <= set(FIELDS)
