"""The configuration schema shared by the simulator and the runtime: its dataclasses and fields."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from shardsim.simulator.workload.arch import SHAPE_FIELDS, Arch, Shape

STRATEGIES = ("ddp", "zero", "zero2d", "pipeline")
SCHEDULES = ("gpipe", "1f1b")
PRECISIONS = ("fp32", "fp16", "bf16")
BACKENDS = ("nccl", "gloo")
OPTIMIZERS = ("adam",)
DATA_PARALLEL = ("ddp", "zero", "zero2d")  # the kinds a `sharded_data_parallel_degree` names


@dataclass(frozen=True)
class Strategy:
    """How the model is distributed.

    kind: ddp | zero (shard over the world) | zero2d (shard within groups of `degree`
    consecutive ranks, replicate across groups) | pipeline (`pp` stages of consecutive
    blocks, `microbatches`, `schedule`; `degree` shards each stage over its replicas).
    `degree` None means: the world for zero, 1 (plain data parallel) for pipeline.
    """

    kind: str = "zero"
    degree: int | None = None
    pp: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"

    def label(self) -> str:
        if self.kind == "pipeline":
            shard = f" d={self.degree}" if self.degree and self.degree > 1 else ""
            return f"pipeline pp={self.pp} m={self.microbatches} {self.schedule}{shard}"
        if self.kind == "zero2d":
            return f"zero2d d={self.degree}"
        return self.kind

    def sharded_degree(self, world: int) -> int:
        """Ranks a parameter is sharded over, as SageMaker's `sharded_data_parallel_degree`
        counts it: 1 for ddp, the world for zero, the degree for zero2d and pipeline stages."""
        return {"ddp": 1, "zero": world}.get(self.kind, self.degree or 1)


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one training step, for prediction and for a real run."""

    workload: str | Arch = "vit-630m"  # a library name or a file path, or a model described inline
    topology: str = "g4dn.12xlarge"
    nodes: int | None = 8
    strategy: Strategy = field(default_factory=Strategy)
    batch_per_device: int = 4
    grad_accum: int = 1
    precision: str = "fp32"
    checkpointing: bool = True
    backend: str = "nccl"
    optimizer: str = "adam"
    profile: str | None = None
    seed: int = 0
    shape: Shape = field(default_factory=Shape)  # shape fields given over the workload's
    source: str = "defaults"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("source")
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
    Setting("checkpointing", "activation checkpointing of every block", bool),
    Setting("backend", "communication library", choices=BACKENDS),
    Setting("optimizer", "the optimizer", choices=OPTIMIZERS, flag=False),
    Setting("profile", "measured profile file (shardsim profile)"),
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
assert set(SHAPE_FIELDS) <= set(FIELDS)
