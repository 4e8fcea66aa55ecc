"""A model's shape: `Arch` (what the simulator costs and the runtime builds; its family's
`ModelSpec` says what its layers are made of), and `Shape` (overrides of shape fields given as
flags over any description)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

from shardsim.core.errors import ConfigError
from shardsim.specs.bounds import check_shape
from shardsim.specs.model.registry import FAMILIES, SPECS
from shardsim.specs.model.spec import ModelSpec, Traits

POSITIONS = ("learned", "rope", "alibi", "none")


@dataclass(frozen=True)
class Arch:
    """Shape of a model; `runtime.models.builders.build_model` builds exactly this in torch."""

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
    head_size: int = 0  # width of one attention head; 0 → hidden / heads
    qkv_bias: bool = False  # biases on the q, k and v projections alone (Qwen2)
    qk_norm: bool = False  # an RMSNorm over each head's q and k (Qwen3, Gemma 3)
    # Mixture of experts (a family whose spec has `moe`): the MLP of an MoE layer is a router over
    # `experts` routed experts, each token sent to `top_k` of them, beside an optional shared expert
    experts: int = 0  # routed experts of one MoE layer; 0: every layer is dense
    top_k: int = 0  # routed experts each token goes to
    expert_ffn: int = 0  # inner size of one routed expert; 0 → ffn
    shared_ffn: int = 0  # inner size of the shared expert(s), all of them together; 0: none
    dense_layers: int = 0  # the first layers have a dense MLP of size ffn (DeepSeek's first_k_dense_replace)
    moe_every: int = 1  # after those, every moe_every-th layer is MoE and the others dense (Llama 4: 2)
    shared_gate: bool = False  # the shared expert's output scaled by sigmoid(Linear(hidden, 1)) (Qwen2-MoE)
    # Multi-head latent attention (DeepSeek-V2/V3; a family whose spec has `moe`): keys and values
    # projected through a latent of `kv_lora_rank` (queries through one of `q_lora_rank`, 0: a
    # direct projection), each head's query and key `head_size` wide plus `rope_head_size` rotated
    # dimensions (the key's rotated part shared by all heads), its value `v_head_size` wide
    kv_lora_rank: int = 0  # 0: ordinary attention
    q_lora_rank: int = 0
    rope_head_size: int = 0
    v_head_size: int = 0

    @property
    def spec(self) -> ModelSpec:
        return SPECS[self.family]

    @property
    def traits(self) -> Traits:
        return self.spec.traits

    @property
    def expert_ffn_size(self) -> int:
        return self.expert_ffn or self.ffn_size

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index` (0-based) has a mixture-of-experts MLP."""
        return self.experts > 0 and index >= self.dense_layers and (index - self.dense_layers) % self.moe_every == 0

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention (`kv_lora_rank`)."""
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query and key: `head_dim`, plus the rotated part under MLA."""
        return self.head_dim + self.rope_head_size

    @property
    def v_head_dim(self) -> int:
        """Width of one head's value (and of its attention output)."""
        return self.v_head_size or self.head_dim

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection (and of attention's output): heads x head width."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection."""
        return self.kv * self.head_dim

    @property
    def position_kind(self) -> str:
        return self.positions or self.traits.positions

    @property
    def tokens(self) -> int:
        embed = self.spec.embed
        if embed == "patches":
            return (self.image // self.patch) ** 2 + 1  # patches + [CLS]
        return self.seq_len if embed == "tokens" else 1

    def label(self) -> str:
        """A short name for a model described inline."""
        kv = f" kv{self.kv}" if self.kv != self.heads else ""
        experts = f" e{self.experts}x{self.expert_ffn_size}k{self.top_k}" if self.experts else ""
        return f"{self.family} h{self.hidden} L{self.layers} a{self.heads}{kv} f{self.ffn_size}{experts} s{self.tokens}"


# The layer's attention shape beyond the family's traits: written out only where a model sets them
ATTENTION_FIELDS = ("head_size", "qkv_bias", "qk_norm")
MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "rope_head_size", "v_head_size")
MOE_FIELDS = ("experts", "top_k", "expert_ffn", "shared_ffn", "dense_layers", "moe_every", "shared_gate", *MLA_FIELDS)
_OPTIONAL_FIELDS = (*ATTENTION_FIELDS, *MOE_FIELDS)


def arch_dict(a: Arch) -> dict[str, object]:
    """`a` as a mapping (`describe.arch_from_mapping` reads it back), the attention and MoE fields
    left out at their defaults."""
    base = Arch(a.family, hidden=1, layers=1)
    out = {f.name: getattr(a, f.name) for f in fields(a)}
    return {k: v for k, v in out.items() if k not in _OPTIONAL_FIELDS or v != getattr(base, k)}


SHAPE_FIELDS = ("seq_len", "hidden", "layers", "heads", "kv_heads", "ffn", "vocab")
# Fields of `Arch` that a family's models do not use, by the kind of input the family takes: a
# value given for one would change nothing, so it is refused rather than echoed and ignored.
_IMAGE_FIELDS = ("image", "patch", "channels")
UNUSED_FIELDS = {
    "text": (*_IMAGE_FIELDS, "classes"),
    "image": ("seq_len", "vocab"),
    "vector": ("heads", "kv_heads", "seq_len", "vocab", "positions", *_IMAGE_FIELDS, *ATTENTION_FIELDS),
}
# beside those: the MoE fields in a family without experts


def check_used(family: str, given: Iterable[str], where: str | None, prefix: str = "") -> None:
    """ConfigError naming the first of the `given` fields that a `family` model does not use."""
    spec = SPECS.get(family)
    unused = UNUSED_FIELDS[spec.traits.tokens] if spec else ()
    if spec and not spec.moe:
        unused = (*unused, *MOE_FIELDS)
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
    if SPECS.get(a.family) is None:
        raise ConfigError(
            f"unknown family {a.family!r}; expected one of {', '.join(FAMILIES)}", where=where, field="family"
        )
    for name in ("hidden", "layers"):
        if getattr(a, name) < 1:
            raise ConfigError(f"must be >= 1, got {getattr(a, name)}", where=where, field=name)
    numbers = ("heads", "kv_heads", "ffn", "seq_len", "vocab", "image", "patch", "channels", "classes", "head_size")
    for name in (*numbers, "experts", "top_k", "expert_ffn", "shared_ffn", "dense_layers", *MLA_FIELDS):
        if getattr(a, name) < 0:
            raise ConfigError(f"must be >= 0, got {getattr(a, name)}", where=where, field=name)
    if a.position_kind not in POSITIONS:
        raise ConfigError(
            f"expected one of {', '.join(POSITIONS)}, got {a.positions!r}", where=where, field="positions"
        )
    t = a.traits
    if a.spec.transformer:
        if a.heads < 1:
            raise ConfigError(f"must be >= 1, got {a.heads}", where=where, field="heads")
        if not a.head_size and a.hidden % a.heads:
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
    _check_moe(a, where)
    check_shape(a, where)  # before the model is built into blocks
    return a


def _check_moe(a: Arch, where: str | None) -> None:
    """ConfigError naming the first MoE field that is inconsistent."""
    if not a.spec.moe:
        return
    if a.experts < 1:
        raise ConfigError(f"a {a.family} model needs experts >= 1", where=where, field="experts")
    if not 1 <= a.top_k <= a.experts:
        raise ConfigError(f"must be in 1..experts ({a.experts}), got {a.top_k}", where=where, field="top_k")
    if a.moe_every < 1:
        raise ConfigError(f"must be >= 1, got {a.moe_every}", where=where, field="moe_every")
    if a.moe_layers < 1:
        raise ConfigError(f"leaves no MoE layer among the {a.layers} layers", where=where, field="dense_layers")
    if a.shared_gate and not a.shared_ffn:
        raise ConfigError("gates a shared expert: set shared_ffn", where=where, field="shared_gate")
    _check_mla(a, where)


def _check_mla(a: Arch, where: str | None) -> None:
    """ConfigError naming the first multi-head latent attention field that is inconsistent."""
    if not a.mla:
        for name in MLA_FIELDS[1:]:
            if getattr(a, name):
                raise ConfigError("applies to latent attention: set kv_lora_rank", where=where, field=name)
        return
    for name in ("rope_head_size", "v_head_size"):
        if getattr(a, name) < 1:
            raise ConfigError(f"latent attention needs {name} >= 1", where=where, field=name)
    if a.rope_head_size % 2:
        raise ConfigError(
            f"rotary dimensions come in pairs, got {a.rope_head_size}", where=where, field="rope_head_size"
        )
    if a.kv != a.heads:
        raise ConfigError(
            "latent attention has a key and a value per head: leave kv_heads out", where=where, field="kv_heads"
        )
    if a.qk_norm or a.qkv_bias:
        field = "qk_norm" if a.qk_norm else "qkv_bias"
        raise ConfigError("not modelled with latent attention", where=where, field=field)
