"""`ModelSpec`: what one model family is, as the simulator, config and runtime ask for it: its
traits, the blocks it is made of (and so the kernels and parameter tensors they hold), its
tensor-parallel plan and the Hugging Face ``config.json`` types it reads. Each family declares
its spec in its own module under `specs.model.families`; `specs.model.registry` holds them by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardsim.specs.model.hf_keys import HFKeys

# A config.json mapper: the keys of one `model_type` read into `Arch` fields (the family's own
# name is added by the reader).
HFMapper = Callable[[HFKeys], dict[str, Any]]

EMBEDS = ("tokens", "patches", "none")
LAYERS = ("transformer", "mlp")
HEADS = ("lm", "cls", "linear")


@dataclass(frozen=True)
class Traits:
    """What a family's layers are made of."""

    norm: str  # layernorm | layernorm-nobias | rmsnorm
    bias: bool  # biases in the linear layers
    mlp: str  # gelu (two matrices) | swiglu (three: gate, up, down)
    positions: str  # learned | rope | alibi | none: the default of the family
    causal: bool
    tokens: str  # text (token ids, LM head over the vocabulary) | image | vector


@dataclass(frozen=True)
class TPPlan:
    """A transformer layer's tensor-parallel split, by the runtime layer's module names: the
    column-parallel projections, the row-parallel ones, and the norms that sequence parallelism
    splits along the sequence (`runtime.strategies.tensor_parallel` applies it)."""

    colwise: tuple[str, ...]
    rowwise: tuple[str, ...]
    norms: tuple[str, ...] = ("ln1", "ln2")


@dataclass(frozen=True)
class ModelSpec:
    """One model family.

    Blocks: ``embed`` tokens (a token table, learned positions if the model has them), patches
    (a ViT's convolution, [CLS] and positions) or none; ``layer`` transformer (pre-norm attention
    and MLP, as `traits` say) or mlp (Linear-GELU-Linear and a residual); ``head`` lm (final norm,
    LM head over the vocabulary), cls (final norm, classifier on [CLS]) or linear (a classifier)."""

    name: str
    traits: Traits
    embed: str
    layer: str
    head: str
    tp_plan: TPPlan | None  # None: tensor parallelism does not apply
    hf_types: Mapping[str, HFMapper] = field(default_factory=dict)
    moe: bool = False  # its MLPs may be mixtures of experts (the `Arch` MoE fields)

    def __post_init__(self) -> None:
        for kind, allowed in ((self.embed, EMBEDS), (self.layer, LAYERS), (self.head, HEADS)):
            if kind not in allowed:
                raise ValueError(f"{self.name}: {kind!r} is not one of {allowed}")

    @property
    def transformer(self) -> bool:
        """Whether its layers are transformer layers (attention, what compile and SDPA change)."""
        return self.layer == "transformer"
