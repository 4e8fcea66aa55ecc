"""A model's shape: `Arch` (what the simulator costs and the runtime builds), the traits of each
family, and `Shape` (overrides of shape fields given as flags over any description)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

from shardsim.core.errors import ConfigError
from shardsim.simulator.scale import check_shape


@dataclass(frozen=True)
class Traits:
    """What a family's layers are made of."""

    norm: str  # layernorm | layernorm-nobias | rmsnorm
    bias: bool  # biases in the linear layers
    mlp: str  # gelu (two matrices) | swiglu (three: gate, up, down)
    positions: str  # learned | rope | alibi | none: the default of the family
    causal: bool
    tokens: str  # text (token ids, LM head over the vocabulary) | image | vector


# gpt: GPT-2 style. llama: Llama 2/3, Mistral. mpt: MosaicML MPT (`no_bias: true`). bert and vit:
# bidirectional encoders, pre-LN (BERT itself is post-LN: same parameters and FLOPs; the
# token-type embeddings, the embedding LayerNorm and the pooler are left out, 0.3 % of BERT-large).
TRAITS: dict[str, Traits] = {
    "gpt": Traits("layernorm", True, "gelu", "learned", True, "text"),
    "llama": Traits("rmsnorm", False, "swiglu", "rope", True, "text"),
    "mpt": Traits("layernorm-nobias", False, "gelu", "alibi", True, "text"),
    "bert": Traits("layernorm", True, "gelu", "learned", False, "text"),
    "vit": Traits("layernorm", True, "gelu", "learned", False, "image"),
    "mlp": Traits("layernorm", True, "gelu", "none", False, "vector"),
}
FAMILIES = tuple(TRAITS)
POSITIONS = ("learned", "rope", "alibi", "none")


@dataclass(frozen=True)
class Arch:
    """Shape of a model; `runtime.models.transformer.build_model` builds exactly this in torch."""

    family: str  # one of FAMILIES
    hidden: int
    layers: int
    heads: int = 1
    kv_heads: int = 0  # key/value heads (grouped-query attention); 0 → heads
    ffn: int = 0  # MLP inner size; 0 → 4 * hidden
    seq_len: int = 0  # tokens per sample (text families); derived for vit; 1 for mlp
    vocab: int = 0  # text families
    tied_embeddings: bool = False  # the LM head reuses the token embedding matrix
    positions: str = ""  # learned | rope | alibi | none; "" → the family's
    image: int = 224  # vit
    patch: int = 16  # vit
    channels: int = 3  # vit
    classes: int = 1000  # vit/mlp

    @property
    def traits(self) -> Traits:
        return TRAITS[self.family]

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection."""
        return self.kv * self.head_dim

    @property
    def position_kind(self) -> str:
        return self.positions or self.traits.positions

    @property
    def tokens(self) -> int:
        if self.family == "vit":
            return (self.image // self.patch) ** 2 + 1  # patches + [CLS]
        if self.family == "mlp":
            return 1
        return self.seq_len

    def label(self) -> str:
        """A short name for a model described inline."""
        kv = f" kv{self.kv}" if self.kv != self.heads else ""
        return f"{self.family} h{self.hidden} L{self.layers} a{self.heads}{kv} f{self.ffn_size} s{self.tokens}"


SHAPE_FIELDS = ("seq_len", "hidden", "layers", "heads", "kv_heads", "ffn", "vocab")
# Fields of `Arch` that a family's models do not use, by the kind of input the family takes: a
# value given for one would change nothing, so it is refused rather than echoed and ignored.
_IMAGE_FIELDS = ("image", "patch", "channels")
UNUSED_FIELDS = {
    "text": (*_IMAGE_FIELDS, "classes"),
    "image": ("seq_len", "vocab"),
    "vector": ("heads", "kv_heads", "seq_len", "vocab", "positions", *_IMAGE_FIELDS),
}


def check_used(family: str, given: Iterable[str], where: str | None, prefix: str = "") -> None:
    """ConfigError naming the first of the `given` fields that a `family` model does not use."""
    traits = TRAITS.get(family)
    unused = UNUSED_FIELDS[traits.tokens] if traits else ()
    for name in given:
        if name in unused:
            raise ConfigError(f"not used by the {family} family; leave it out", where=where, field=prefix + name)


@dataclass(frozen=True)
class Shape:
    """Shape fields given over a description (``--seq-len 8192``); None: the description's."""

    seq_len: int | None = None
    hidden: int | None = None
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn: int | None = None
    vocab: int | None = None

    def given(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def apply(self, a: Arch, where: str | None = None) -> Arch:
        """`a` with the given fields over its own; a field its family does not use is refused."""
        if not self.given():
            return a
        check_used(a.family, self.given(), where)
        return check_arch(replace(a, **self.given()), where)


def check_arch(a: Arch, where: str | None = None) -> Arch:
    """`a` if its fields are consistent; otherwise ConfigError naming the field."""
    if a.family not in TRAITS:
        raise ConfigError(
            f"unknown family {a.family!r}; expected one of {', '.join(FAMILIES)}", where=where, field="family"
        )
    for name in ("hidden", "layers"):
        if getattr(a, name) < 1:
            raise ConfigError(f"must be >= 1, got {getattr(a, name)}", where=where, field=name)
    for name in ("heads", "kv_heads", "ffn", "seq_len", "vocab", "image", "patch", "channels", "classes"):
        if getattr(a, name) < 0:
            raise ConfigError(f"must be >= 0, got {getattr(a, name)}", where=where, field=name)
    if a.position_kind not in POSITIONS:
        raise ConfigError(
            f"expected one of {', '.join(POSITIONS)}, got {a.positions!r}", where=where, field="positions"
        )
    t = a.traits
    if a.family != "mlp":
        if a.heads < 1:
            raise ConfigError(f"must be >= 1, got {a.heads}", where=where, field="heads")
        if a.hidden % a.heads:
            raise ConfigError(f"{a.heads} heads do not divide hidden {a.hidden}", where=where, field="heads")
        if a.kv < 1 or a.heads % a.kv:
            raise ConfigError(f"{a.kv} key/value heads do not divide {a.heads} heads", where=where, field="kv_heads")
    if t.tokens == "text":
        for name in ("seq_len", "vocab"):
            if getattr(a, name) < 1:
                raise ConfigError(f"a {a.family} model needs {name} >= 1", where=where, field=name)
    if t.tokens == "image" and (a.patch < 1 or a.image % a.patch):
        raise ConfigError(f"patch {a.patch} does not divide image {a.image}", where=where, field="patch")
    if a.tied_embeddings and t.tokens != "text":
        raise ConfigError(f"a {a.family} model has no token embedding to tie", where=where, field="tied_embeddings")
    check_shape(a, where)  # before the model is built into blocks
    return a
