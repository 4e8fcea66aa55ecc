"""How far the simulator goes: the bounds beyond which it refuses an input, checked before any
work (docs/simulator.md#how-far-it-goes).

A prediction's cost grows with the cluster (a collective's phases are planned over every link,
then merged into a few resources: `network.linkgroups`) and with its plan's ops (the simpy events:
grad_accum x microbatches x layers). Within the bounds a prediction takes seconds and well under
2 GB (tests/unit/test_scale.py times one of 16,384 GPUs); beyond them it refuses in one line.
A model's shape is bounded too, before it is built into blocks (`check_shape`), and so is a
sweep's space; the configuration's integer settings take `SETTING_BOUNDS` as their models'
constraints (`config.schema`), and the command line's flags check the same bounds as they are
parsed (`flagtypes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardsim.core.errors import ConfigError

if TYPE_CHECKING:
    from shardsim.config import RunConfig
    from shardsim.spec.model.arch import Arch

MAX_WORLD = 65_536  # devices in one cluster (and so nodes, and ranks of a collective)
MAX_PLAN_OPS = 100_000  # ops of one step's plan, as `plan_ops_estimate` counts them
MAX_LAYERS = 16_384  # a ZeRO step of as many layers is about 98,000 ops: within MAX_PLAN_OPS
MAX_WIDTH = 1_048_576  # hidden, ffn, heads, kv_heads, channels (2^20; published models stay under 2^16)
MAX_VOCAB = 4_194_304  # vocabulary and classes (2^22; published vocabularies stay under 2^18)
MAX_SEQ_LEN = 16_777_216  # tokens per sample: seq_len, a ViT's patches (2^24; 16 x the longest contexts)
MAX_BATCH = 1_048_576  # samples per device per micro-step
# micro-steps per step, and microbatches per pipeline replica: about the most any plan within
# MAX_PLAN_OPS can hold (ddp of one layer takes 6 ops a micro-step)
MAX_GRAD_ACCUM = 16_384
MAX_MICROBATCHES = MAX_GRAD_ACCUM
MAX_SEED = 2**32 - 1  # the largest seed every generator takes (numpy's)
MAX_MESSAGE_BYTES = 2**40  # one collective's message (1 TiB: the fp32 gradients of a 270 B model)
MAX_SWEEP_SPACE = 50_000  # configurations a sweep's requested space holds, valid or not, before any is checked
SWEEP_CONFIRM_ABOVE = 1_000  # valid configurations a sweep predicts without asking (--yes)


@dataclass(frozen=True)
class Bound:
    """A setting's range, as a configuration file or a flag gives it."""

    name: str
    maximum: int
    minimum: int = 1


# the integer settings of a configuration (files and flags), and their bounds
SETTING_BOUNDS = {
    b.name: b
    for b in (
        Bound("nodes", MAX_WORLD),
        Bound("gpus_per_node", MAX_WORLD),
        Bound("degree", MAX_WORLD),
        Bound("pp", MAX_WORLD),
        Bound("tp", MAX_WORLD),
        Bound("microbatches", MAX_MICROBATCHES),
        Bound("batch_per_device", MAX_BATCH),
        Bound("grad_accum", MAX_GRAD_ACCUM),
        Bound("seed", MAX_SEED, minimum=0),
        Bound("seq_len", MAX_SEQ_LEN),
        Bound("hidden", MAX_WIDTH),
        Bound("layers", MAX_LAYERS),
        Bound("heads", MAX_WIDTH),
        Bound("kv_heads", MAX_WIDTH),
        Bound("ffn", MAX_WIDTH),
        Bound("vocab", MAX_VOCAB),
    )
}
# a model's shape fields beyond the settings, and what bounds them
SHAPE_BOUNDS = {"channels": MAX_WIDTH, "classes": MAX_VOCAB, "tokens": MAX_SEQ_LEN}


def beyond(value: int, maximum: int) -> str:
    """A refusal of `value`, naming the bound (the field is named beside it)."""
    return f"{value:,} is beyond the simulator's bound of {maximum:,}"


def check_shape(a: Arch, where: str | None = None) -> None:
    """Raise ConfigError (one line, the field) when a model's shape is beyond the simulator's
    bounds: before the model is built into blocks (a block per layer) or costed."""
    fields = {k: getattr(a, k) for k in ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "seq_len")}
    for name, value in fields.items():
        maximum = SETTING_BOUNDS[name].maximum
        if value > maximum:
            raise ConfigError(beyond(value, maximum), where=where, field=name)
    for name in ("channels", "classes"):
        if getattr(a, name) > SHAPE_BOUNDS[name]:
            raise ConfigError(beyond(getattr(a, name), SHAPE_BOUNDS[name]), where=where, field=name)
    if a.spec.embed == "patches" and a.patch >= 1 and a.tokens > SHAPE_BOUNDS["tokens"]:
        why = f"{a.tokens:,} tokens per image (patches of {a.patch} in {a.image}) is beyond the simulator's bound "
        raise ConfigError(why + f"of {SHAPE_BOUNDS['tokens']:,}", where=where, field="image")


def world_refusal(world: int) -> str | None:
    """Why a cluster of `world` devices is beyond the simulator, or None."""
    if world > MAX_WORLD:
        return f"{world:,} devices is beyond the simulator's bound of {MAX_WORLD:,} devices per cluster"
    return None


def plan_ops_estimate(cfg: RunConfig, n_layers: int) -> int:
    """About how many ops the plan of one step of `cfg` (normalized by resolve) holds: between
    one and four times as many as it does (tests/unit/test_scale.py), without building it."""
    s = cfg.strategy
    return s.spec.ops_estimate(s, cfg.grad_accum, n_layers) + tp_ops_estimate(cfg, n_layers)


def tp_ops_estimate(cfg: RunConfig, n_layers: int) -> int:
    """The ops tensor parallelism adds to a step's plan: each block's pass becomes its own op (no
    longer run through with its neighbours), followed by its collectives (`strategies.tensor_parallel`:
    a layer's 2 all-reduces a pass, or 4 all-gathers and reduce-scatters with sequence parallelism,
    its forward's again where full checkpointing recomputes it), in every microbatch."""
    s = cfg.strategy
    if s.tp == 1:
        return 0
    per_pass = 4 if s.sequence_parallel else 2
    recompute = per_pass if cfg.checkpointing == "full" else 0
    passes = cfg.grad_accum * (s.microbatches if s.spec.is_pipeline else 1)
    return passes * ((n_layers + 2) * (2 + 2 * per_pass + recompute) + 4)


@dataclass(frozen=True)
class PlanRefusal:
    """Why a step's plan is beyond the simulator, and the setting to lower."""

    field: str  # layers | microbatches | grad_accum
    message: str


def plan_refusal(cfg: RunConfig, n_layers: int) -> PlanRefusal | None:
    """Why the plan of `cfg` (normalized by resolve) is beyond the simulator, or None. It names
    the layers when one micro-step of one microbatch is beyond already, else the microbatches of
    a pipeline when one micro-step is, else grad_accum."""
    ops = plan_ops_estimate(cfg, n_layers)
    if ops <= MAX_PLAN_OPS:
        return None
    s = cfg.strategy
    pipeline = s.spec.is_pipeline
    one_step = cfg.replace(grad_accum=1)
    one_microbatch = one_step.replace(strategy=s.replace(microbatches=1)) if s.spec.is_pipeline else one_step
    if plan_ops_estimate(one_microbatch, n_layers) > MAX_PLAN_OPS:
        field = "layers"
    elif pipeline and plan_ops_estimate(one_step, n_layers) > MAX_PLAN_OPS:
        field = "microbatches"
    else:
        field = "grad_accum"
    size = f"{n_layers:,} layers x grad_accum {cfg.grad_accum:,}" + (
        f" x {s.microbatches:,} microbatches" if pipeline else ""
    )
    lower = {"layers": "fewer layers", "microbatches": "fewer microbatches", "grad_accum": "a lower grad_accum"}
    return PlanRefusal(
        field,
        f"a step of about {ops:,} simulated ops ({size}) is beyond the simulator's bound of {MAX_PLAN_OPS:,}; "
        f"{lower[field]}",
    )


def check_scale(cfg: RunConfig, world: int, n_layers: int) -> None:
    """Raise ConfigError (one line naming the bound) when `cfg` on `world` devices is beyond the simulator."""
    why = world_refusal(world)
    if why:
        raise ConfigError(why, field="nodes")
    too_big = plan_refusal(cfg, n_layers)
    if too_big:
        raise ConfigError(too_big.message, field=too_big.field)
