"""The defaults that follow from the scenario: the seed's library, a language model's precision and batch.

A configuration that names no workload and no topology is the seed scenario (a ViT on
8 x g4dn.12xlarge, `RunConfig`'s defaults), a question about SageMaker's
`sharded_data_parallel_degree`: its library defaults to SageMaker's (`SEED_LIBRARY`, MiCS's
hierarchical all-gather), as the seed's measurement ran; any other, to PyTorch's.

A configuration that leaves out `precision` or `batch_per_device` gets `RunConfig`'s (fp32, 4
samples per device: the seed's ViT), except a language model (a text workload), which gets what
a typical job of it runs: bf16 where the device has bf16 tensor cores (A100, H100 and later),
fp32 where it does not (T4, V100: fp16 tensor cores only, and fp16 needs loss scaling, so it
stays a choice to make), and a micro-batch of about `LM_TOKENS_PER_DEVICE` tokens per device: one
sequence of 8,192 tokens (Llama 3.1's), two of 4,096, at most `RunConfig`'s 4 of shorter ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardsim.config.schema import RunConfig
from shardsim.core.errors import ConfigError

SEED_LIBRARY = "smp"
LM_PRECISION = "bf16"
LM_TOKENS_PER_DEVICE = 8_192


def lm_batch_per_device(seq_len: int, most: int) -> int:
    """Sequences per device in a micro-batch of about `LM_TOKENS_PER_DEVICE` tokens: at least one, at most `most`."""
    return min(most, max(1, LM_TOKENS_PER_DEVICE // seq_len))


def language_model_tokens(cfg: RunConfig) -> int | None:
    """The sequence length of `cfg`'s workload where it is a text model (one read here: a library
    name, a file, an inline description; a model given by import path is not loaded for this), else None."""
    from shardsim.specs.model.load import resolve_arch

    if isinstance(cfg.workload, str) and ":" in cfg.workload and not cfg.workload.endswith((".yaml", ".json")):
        return None
    try:
        _, arch = resolve_arch(cfg.workload, cfg.shape, cfg.source)
    except ConfigError:
        return None  # the configuration's own checks say what is wrong with it
    return arch.tokens if arch is not None and arch.traits.tokens == "text" else None


def _has_bf16(topology: str) -> bool:
    from shardsim.specs.hardware.topology import load_instance

    try:
        return load_instance(topology).device.supports(LM_PRECISION)
    except ConfigError:
        return False


def with_model_defaults(cfg: RunConfig, given: Mapping[str, Any]) -> RunConfig:
    """`cfg` with the seed scenario's library, and a language model's precision and batch, where
    `given` (the settings a file and flags name) leaves them to the defaults."""
    defaults = RunConfig.model_fields
    changes: dict[str, Any] = {}
    if not any(k in given for k in ("workload", "topology", "library")) and cfg.library == defaults["library"].default:
        cfg = cfg.replace(library=SEED_LIBRARY)
    open_precision = "precision" not in given and cfg.precision == defaults["precision"].default
    open_batch = "batch_per_device" not in given and cfg.batch_per_device == defaults["batch_per_device"].default
    seq = language_model_tokens(cfg) if open_precision or open_batch else None
    if seq is None:
        return cfg
    if open_precision and _has_bf16(cfg.topology):
        changes["precision"] = LM_PRECISION
    if open_batch:
        changes["batch_per_device"] = lm_batch_per_device(seq, cfg.batch_per_device)
    return cfg.replace(**changes) if changes else cfg


LIBRARY_TEXT = {
    "pytorch": "PyTorch FSDP2/DDP",
    "smp": "SageMaker's library (smp)",
    "deepspeed": "DeepSpeed's ZeRO (deepspeed)",
}


def library_text(library: str) -> str:
    """The training library a prediction is of, as a header names it."""
    return LIBRARY_TEXT.get(library, library)
