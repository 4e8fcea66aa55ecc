"""A Hugging Face ``config.json`` read into an `Arch` (from the file; nothing is downloaded).

Model types and their families: llama, mistral → llama; gpt2 → gpt; gpt_neox → gpt with rotary
positions; mpt → mpt; vit → vit; bert → bert. The sequence length is a training choice, not the
model's maximum positions (``max_position_embeddings``: 32,768 for Mistral, 131,072 for Llama 3.1):
it defaults to `DEFAULT_SEQ_LEN` tokens, or the maximum when that is fewer (a learned position table
has no rows past it); ``--seq-len`` overrides it. A workload read from a config.json is named after
the model (`model_name`), not the file. What the families leave out is named in `arch.TRAITS` and
`runtime.models.transformer` (Mistral's sliding window is not modelled: attention is full causal
over the sequence).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardsim.core.errors import ConfigError
from shardsim.core.notes import not_modelled
from shardsim.core.yamlio import MiB, load_json
from shardsim.spec.model.arch import Arch, check_arch

# A config.json may carry a classifier's label names twice (id2label, label2id): for the 21,843
# classes of ImageNet-21k that can pass 1 MiB, the bound of shardsim's own formats
CONFIG_JSON_BYTES = 4 * MiB
# Tokens per sample when a config.json is read: its maximum positions are what the model can take,
# not what it is trained at (Llama 2 pre-trained at 4,096; most fine-tuning runs use 2,048-8,192).
DEFAULT_SEQ_LEN = 4096


class _Keys:
    """Typed reads of a config.json's keys, errors naming the key and the file; `read` holds the
    keys a family looks at."""

    def __init__(self, data: dict[str, Any], where: str):
        self.data, self.where = data, where
        self.read: set[str] = {"model_type", "_name_or_path"}  # the family, the name (`model_name`)

    def get(self, name: str) -> Any:
        self.read.add(name)
        return self.data.get(name)

    def int(self, *names: str, default: int | None = None) -> int:
        self.read.update(names)
        for name in names:
            value = self.data.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"expected an integer, got {value!r}", where=self.where, field=name)
            if value < 0:
                raise ConfigError(f"expected an integer >= 0, got {value!r}", where=self.where, field=name)
            return value
        if default is None:
            raise ConfigError("missing; expected an integer", where=self.where, field=names[0])
        return default

    def seq_len(self, *names: str) -> int:
        """`DEFAULT_SEQ_LEN`, or the model's maximum positions (the first of `names` given) if fewer."""
        return min(DEFAULT_SEQ_LEN, self.int(*names))

    def flag(self, name: str, default: bool) -> bool:
        self.read.add(name)
        value = self.data.get(name, default)
        if not isinstance(value, bool):
            raise ConfigError(f"expected true or false, got {value!r}", where=self.where, field=name)
        return value


def _llama(k: _Keys) -> Arch:
    hidden, heads = k.int("hidden_size"), k.int("num_attention_heads")
    if k.get("head_dim") is not None and k.int("head_dim") * heads != hidden:
        raise ConfigError("a head_dim other than hidden_size / heads is not modelled", where=k.where, field="head_dim")
    for name in ("attention_bias", "mlp_bias"):
        if k.flag(name, False):
            raise ConfigError("biases are not modelled for the llama family", where=k.where, field=name)
    return Arch(
        "llama",
        hidden=hidden,
        layers=k.int("num_hidden_layers"),
        heads=heads,
        kv_heads=k.int("num_key_value_heads", default=heads),
        ffn=k.int("intermediate_size"),
        vocab=k.int("vocab_size"),
        seq_len=k.seq_len("max_position_embeddings"),
        tied_embeddings=k.flag("tie_word_embeddings", False),
    )


def _gpt2(k: _Keys) -> Arch:
    hidden = k.int("n_embd", "hidden_size")
    return Arch(
        "gpt",
        hidden=hidden,
        layers=k.int("n_layer", "num_hidden_layers"),
        heads=k.int("n_head", "num_attention_heads"),
        ffn=k.int("n_inner", default=4 * hidden),
        vocab=k.int("vocab_size"),
        seq_len=k.seq_len("n_positions", "n_ctx", "max_position_embeddings"),
        tied_embeddings=k.flag("tie_word_embeddings", True),
    )


def _gpt_neox(k: _Keys) -> Arch:
    return Arch(
        "gpt",
        hidden=k.int("hidden_size"),
        layers=k.int("num_hidden_layers"),
        heads=k.int("num_attention_heads"),
        ffn=k.int("intermediate_size"),
        vocab=k.int("vocab_size"),
        seq_len=k.seq_len("max_position_embeddings"),
        tied_embeddings=k.flag("tie_word_embeddings", False),
        positions="rope",
    )


def _mpt(k: _Keys) -> Arch:
    hidden = k.int("d_model")
    if not k.flag("no_bias", True):
        raise ConfigError(
            "an MPT with biases is not modelled (the mpt family has none)", where=k.where, field="no_bias"
        )
    return Arch(
        "mpt",
        hidden=hidden,
        layers=k.int("n_layers"),
        heads=k.int("n_heads"),
        ffn=k.int("expansion_ratio", default=4) * hidden,
        vocab=k.int("vocab_size"),
        seq_len=k.seq_len("max_seq_len"),
        tied_embeddings=True,  # MPT always ties its LM head to the token embedding
    )


def _vit(k: _Keys) -> Arch:
    labels = k.get("id2label")
    classes = k.int("num_labels", default=len(labels) if isinstance(labels, dict) and labels else 2)
    return Arch(
        "vit",
        hidden=k.int("hidden_size"),
        layers=k.int("num_hidden_layers"),
        heads=k.int("num_attention_heads"),
        ffn=k.int("intermediate_size"),
        image=k.int("image_size"),
        patch=k.int("patch_size"),
        channels=k.int("num_channels", default=3),
        classes=classes,
    )


def _bert(k: _Keys) -> Arch:
    return Arch(
        "bert",
        hidden=k.int("hidden_size"),
        layers=k.int("num_hidden_layers"),
        heads=k.int("num_attention_heads"),
        ffn=k.int("intermediate_size"),
        vocab=k.int("vocab_size"),
        seq_len=k.seq_len("max_position_embeddings"),
        tied_embeddings=k.flag("tie_word_embeddings", True),
    )


MODEL_TYPES: dict[str, Callable[[_Keys], Arch]] = {
    "llama": _llama,
    "mistral": _llama,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "mpt": _mpt,
    "vit": _vit,
    "bert": _bert,
}


# Our field → the config.json keys that may hold it (errors name the file's own key).
HF_KEYS = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "n_layers"),
    "heads": ("num_attention_heads", "n_head", "n_heads"),
    "kv_heads": ("num_key_value_heads",),
    "ffn": ("intermediate_size", "n_inner", "expansion_ratio"),
    "vocab": ("vocab_size",),
    "seq_len": ("max_position_embeddings", "n_positions", "max_seq_len"),
    "patch": ("patch_size",),
}


def _printable(name: str) -> str:
    """`name` with its control characters (a terminal's escape sequences, newlines) escaped as Python writes them."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in name)


def model_name(data: dict[str, Any], path: Path) -> str:
    """What a config.json's model is called, its control characters escaped (`_printable`): its
    ``_name_or_path`` (a hub id as written, a local path's last part); else its folder's name when
    that names the model type (``Mistral-7B-v0.1/``, not a snapshot hash); else its ``model_type``."""
    return _printable(_given_name(data, path))


def _given_name(data: dict[str, Any], path: Path) -> str:
    given = data.get("_name_or_path")
    if isinstance(given, str) and given.strip():
        given = given.strip().rstrip("/")
        return Path(given).name if given.startswith(("/", ".", "~")) else given
    kind = str(data.get("model_type", ""))
    folder = path.resolve().parent.name

    def squash(t: str) -> str:
        return t.lower().replace("-", "").replace("_", "")

    return folder if kind and squash(kind) in squash(folder) else kind


def _read(path: str | Path) -> dict[str, Any]:
    data = load_json(Path(path), limit=CONFIG_JSON_BYTES)
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object at the top level", where=str(path))
    return data


def read_hf_model(path: str | Path) -> tuple[str, Arch]:
    """A config.json's model name (`model_name`) and `Arch` (`read_hf_config`)."""
    data = _read(path)
    return model_name(data, Path(path)), _arch(data, str(path))


def read_hf_config(path: str | Path) -> Arch:
    """The `Arch` of a config.json (at most `CONFIG_JSON_BYTES`); ConfigError naming the file and key."""
    return _arch(_read(path), str(path))


def _arch(data: dict[str, Any], where: str) -> Arch:
    kind = data.get("model_type")
    if kind not in MODEL_TYPES:
        known = ", ".join(MODEL_TYPES)
        raise ConfigError(f"unsupported model type {kind!r}; supported: {known}", where=where, field="model_type")
    keys = _Keys(data, where)
    arch = MODEL_TYPES[kind](keys)
    try:
        arch = check_arch(arch, where)
    except ConfigError as err:
        key = next((k for k in HF_KEYS.get(err.field or "", ()) if k in data), err.field)
        raise ConfigError(err.message, where=where, field=key) from None
    unread = [str(k) for k in data if k not in keys.read]
    if unread:
        not_modelled(where, ", ".join(unread), f"the {arch.family} family is modelled from its shape keys alone")
    return arch
