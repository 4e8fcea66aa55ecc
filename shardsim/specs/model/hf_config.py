"""A Hugging Face ``config.json`` read into an `Arch` (from the file; nothing is downloaded).

Each family's module maps the ``model_type`` values it reads (`ModelSpec.hf_types`; an unknown
type is refused with the list of them). The sequence length is a training choice, not the
model's maximum positions (``max_position_embeddings``: 32,768 for Mistral, 131,072 for Llama 3.1):
it defaults to `DEFAULT_SEQ_LEN` tokens, or the maximum when that is fewer (a learned position table
has no rows past it); ``--seq-len`` overrides it. A workload read from a config.json is named after
the model (`model_name`), not the file. What the families leave out is named in their modules under
`specs.model.families` and in `runtime.models.transformer`; the keys of a file no mapper reads
(a sliding window, logit soft-capping: attention is full causal over the sequence) are named once
as not modelled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardsim.core.errors import ConfigError
from shardsim.core.notes import not_modelled
from shardsim.core.yamlio import MiB, load_json
from shardsim.specs.model.arch import Arch, check_arch
from shardsim.specs.model.hf_keys import HFKeys
from shardsim.specs.model.registry import HF_TYPES

# A config.json may carry a classifier's label names twice (id2label, label2id): for the 21,843
# classes of ImageNet-21k that can pass 1 MiB, the bound of shardsim's own formats
CONFIG_JSON_BYTES = 4 * MiB
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
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "top_k": ("num_experts_per_tok",),
    "expert_ffn": ("moe_intermediate_size",),
    "shared_ffn": ("shared_expert_intermediate_size", "n_shared_experts"),
    "dense_layers": ("first_k_dense_replace", "mlp_only_layers", "decoder_sparse_step"),
    "moe_every": ("moe_layer_freq", "decoder_sparse_step"),
    "kv_lora_rank": ("kv_lora_rank",),
    "q_lora_rank": ("q_lora_rank",),
    "rope_head_size": ("qk_rope_head_dim",),
    "v_head_size": ("v_head_dim",),
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
    if not isinstance(kind, str) or kind not in HF_TYPES:
        known = ", ".join(HF_TYPES)
        raise ConfigError(f"unsupported model type {kind!r}; supported: {known}", where=where, field="model_type")
    family, mapper = HF_TYPES[kind]
    keys = HFKeys(data, where)
    fields = mapper(keys)
    try:
        arch = check_arch(Arch(family, **fields), where)
    except ConfigError as err:
        read = keys.children[-1] if keys.children else keys  # a multimodal model's text model
        key = next((read.prefix + k for k in HF_KEYS.get(err.field or "", ()) if k in read.data), err.field)
        raise ConfigError(err.message, where=where, field=key) from None
    unread = keys.unread()
    if unread:
        not_modelled(where, ", ".join(unread), f"the {arch.family} family is modelled from its shape keys alone")
    return arch
