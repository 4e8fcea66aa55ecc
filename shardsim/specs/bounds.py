"""The bounds of the simulator's inputs that a configuration is checked against before any work
(docs/simulator.md#how-far-it-goes): the integer settings' ranges (`SETTING_BOUNDS`, the
constraints of `config.strategy`'s models; the command line's flags check the same bounds as they are
parsed, `flagtypes`), a model's shape (`check_shape`, before it is built into blocks) and a
cluster's size (`world_refusal`). What bounds a step's plan and a sweep is `simulator.scale`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from shardsim.core.errors import ConfigError

MAX_WORLD = 65_536  # devices in one cluster (and so nodes, and ranks of a collective)
MAX_LAYERS = 16_384  # a ZeRO step of as many layers is about 98,000 ops: within `scale.MAX_PLAN_OPS`
MAX_WIDTH = 1_048_576  # hidden, ffn, heads, kv_heads, channels (2^20; published models stay under 2^16)
MAX_VOCAB = 4_194_304  # vocabulary and classes (2^22; published vocabularies stay under 2^18)
MAX_SEQ_LEN = 16_777_216  # tokens per sample: seq_len, a ViT's patches (2^24; 16 x the longest contexts)
MAX_BATCH = 1_048_576  # samples per device per micro-step
# micro-steps per step, and microbatches per pipeline replica: within what a plan within
# `scale.MAX_PLAN_OPS` can hold (ddp of one layer takes 6 ops a micro-step: about 33,000 of them)
MAX_GRAD_ACCUM = 16_384
MAX_MICROBATCHES = MAX_GRAD_ACCUM
MAX_SEED = 2**32 - 1  # the largest seed every generator takes (numpy's)


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
        Bound("cp", MAX_WORLD),
        Bound("ep", MAX_WORLD),
        Bound("etp", MAX_WORLD),
        Bound("microbatches", MAX_MICROBATCHES),
        Bound("stages_per_rank", MAX_LAYERS),
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
# a mixture of experts' load figures: the imbalance is at most experts / top_k and a capacity factor
# beyond that drops nothing, so both are bounded as the experts are
MAX_MOE_FACTOR = MAX_WIDTH
# a mixture of experts' and latent attention's widths and counts, bounded as the widths are
MOE_BOUNDS = {
    name: MAX_WIDTH
    for name in ("experts", "expert_ffn", "shared_ffn", "kv_lora_rank", "q_lora_rank", "rope_head_size", "v_head_size")
}


def beyond(value: int, maximum: int) -> str:
    """A refusal of `value`, naming the bound (the field is named beside it)."""
    return f"{value:,} is beyond the simulator's bound of {maximum:,}"


class Embedding(Protocol):
    """What `check_shape` reads of a model family's spec: how its inputs are embedded."""

    embed: str  # "patches": an image cut into patches (ViT), whose count is bounded like a sequence


class ModelShape(Protocol):
    """The fields of a model's description `check_shape` reads (a workload's `Arch` has them)."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    seq_len: int
    channels: int
    classes: int
    patch: int
    image: int

    @property
    def tokens(self) -> int: ...

    @property
    def spec(self) -> Embedding: ...


def check_shape(a: ModelShape, where: str | None = None) -> None:
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
    for name, maximum in MOE_BOUNDS.items():
        if getattr(a, name, 0) > maximum:
            raise ConfigError(beyond(getattr(a, name), maximum), where=where, field=name)
    if a.spec.embed == "patches" and a.patch >= 1 and a.tokens > SHAPE_BOUNDS["tokens"]:
        why = f"{a.tokens:,} tokens per image (patches of {a.patch} in {a.image}) is beyond the simulator's bound "
        raise ConfigError(why + f"of {SHAPE_BOUNDS['tokens']:,}", where=where, field="image")


def world_refusal(world: int) -> str | None:
    """Why a cluster of `world` devices is beyond the simulator, or None."""
    if world > MAX_WORLD:
        return f"{world:,} devices is beyond the simulator's bound of {MAX_WORLD:,} devices per cluster"
    return None
