"""The training stack's settings as the runtime applies them: the attention backend, TF32
matmuls, torch.compile of the blocks and the masked-LM head (the optimizer: `runtime.optimizer`).

What runs where:
- attention: flash is PyTorch's own choice, unrestricted (today's behaviour: on CUDA the flash
  kernel for fp16 / bf16, the memory-efficient one for fp32; on CPU its flash-for-CPU kernel);
  efficient is ``sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)`` and cudnn
  ``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)`` (CUDA only: refused on CPU); math
  is ``sdpa_kernel(SDPBackend.MATH)`` (CUDA and CPU); eager is no SDPA call: the layers'
  `eager_attention`, Hugging Face's eager attention (CUDA and CPU).
- tf32: on CUDA ``torch.backends.cuda.matmul.allow_tf32`` and cuDNN's (as
  ``set_float32_matmul_precision("high")``); storage stays fp32. On CPU it runs as fp32 (no
  TF32 there), with a note in the run's notes.
- compile: each block ``torch.compile``d (default mode), before checkpointing and FSDP2 / DDP
  wrap it, as torchtitan compiles per block; parameter names keep ``_orig_mod.`` out of records.
- mlm_fraction: the LM head and its loss on ``masked_tokens`` positions per sequence (evenly
  spaced, the same every step: a named simplification; BERT draws them at random, at the same
  cost); refused with tensor parallelism and pipelines (the simulator models both).
- float8: refused (the runtime does not convert linears with torchao; the simulator predicts it).
- moe_imbalance and moe_capacity: refused (the simulator's what-ifs; the runtime's MoE layers are
  dropless and a run records the imbalance it had, `expert_tokens`).
- context parallelism (cp > 1): refused; PyTorch's ring attention has no CPU path.
- expert parallelism in a pipeline's stages: refused (the simulator predicts it; the runtime's pipeline
  builds its stages without the experts' EP mesh).
- op-level selective checkpointing with expert parallelism (ep > 1): refused (torch 2.13's
  selective checkpointing meets the experts' FSDP2 unit's calls in recomputation only).
"""

from __future__ import annotations

from typing import Any

from shardsim.config import SAC_OP, RunConfig
from shardsim.core.errors import ConfigError

CUDA_ONLY = {"efficient": "memory-efficient", "cudnn": "cuDNN"}  # SDPA backends with no CPU kernel


def check_runtime_stack(cfg: RunConfig, on_gpu: bool, sharded: bool) -> None:
    """What the runtime refuses of the stack's settings (ConfigError, one line naming the field);
    `sharded`: the strategy shards parameters with FSDP2 (DTensors)."""
    if cfg.optimizer == "lamb":
        why = "LAMB is not in torch.optim (apex's FusedLAMB and DeepSpeed's are not used here); the simulator models it"
        raise ConfigError(why, field="optimizer")
    if cfg.optimizer == "adafactor" and cfg.optimizer_impl == "fused":
        raise ConfigError(
            "torch.optim.Adafactor has no fused implementation (foreach or per-parameter)", field="optimizer_impl"
        )
    if cfg.optimizer == "adafactor" and (sharded or cfg.strategy.tp > 1):
        why = (
            "torch.optim.Adafactor fails on sharded DTensor parameters (FSDP2, tensor parallelism: its factored "
            "statistics' in-place ops, torch 2.13); run it with ddp or unsharded pipeline stages"
        )
        raise ConfigError(why, field="optimizer")
    if cfg.attention in CUDA_ONLY and not on_gpu:
        why = f"the {CUDA_ONLY[cfg.attention]} SDPA kernel runs on CUDA only; on CPU use flash (PyTorch's CPU kernel), "
        why += "math or eager"
        raise ConfigError(why, field="attention")
    if cfg.float8 != "none":
        why = "the runtime trains without Float8 linears (torchao is not applied); the simulator predicts float8"
        raise ConfigError(why, field="float8")
    if cfg.moe_imbalance != 1.0:
        why = "a run measures its own imbalance (its record's expert_tokens); moe_imbalance is the simulator's what-if"
        raise ConfigError(why, field="moe_imbalance")
    if cfg.moe_capacity:
        why = "the runtime's MoE layers are dropless (no capacity factor); the simulator models moe_capacity"
        raise ConfigError(why, field="moe_capacity")
    if cfg.strategy.cp > 1:
        why = (
            "the runtime does not apply context parallelism: PyTorch's ring attention dispatches CUDA's flash, "
            "efficient or cuDNN kernels only (experiments/readings/context-parallel-on-cpu.md); the simulator models it"
        )
        raise ConfigError(why, field="cp")
    if cfg.strategy.ep > 1 and cfg.strategy.spec.is_pipeline:
        why = "the runtime runs expert parallelism with zero and zero2d, not in a pipeline's stages (the simulator "
        why += "models it)"
        raise ConfigError(why, field="ep")
    if cfg.strategy.ep > 1 and cfg.checkpointing == "selective" and cfg.selective_ac_option == SAC_OP:
        why = (
            "op-level selective checkpointing of expert-parallel layers fails in torch 2.13 (the recomputation meets "
            "calls of the experts' own FSDP2 unit the forward did not make): use full or every-k checkpointing"
        )
        raise ConfigError(why, field="selective_ac_option")
    if cfg.mlm_fraction is not None and (cfg.strategy.tp > 1 or cfg.strategy.spec.is_pipeline):
        why = "the runtime's masked-LM head runs without tensor parallelism or pipelines (the simulator models both)"
        raise ConfigError(why, field="mlm_fraction")


def apply_model_settings(model: Any, cfg: RunConfig) -> Any:
    """`model` (as `models.build` makes it) with the attention backend and the masked-LM head
    set: what the single-process reference applies too (the math of a step)."""
    from shardsim.runtime.models.transformer import Attention, LMHead
    from shardsim.specs.model.blocks import check_mlm, masked_tokens

    backends = sdpa_backends(cfg.attention)
    for m in model.modules():
        if isinstance(m, Attention):
            m.backends, m.eager = backends, cfg.attention == "eager"
    if cfg.mlm_fraction is not None:
        arch = getattr(model, "arch", None)
        check_mlm(arch, cfg.mlm_fraction)
        assert isinstance(model.head, LMHead)
        model.head.masked = masked_tokens(arch, cfg.mlm_fraction)
    return model


def sdpa_backends(attention: str) -> list | None:
    """The SDPBackends `attention` restricts SDPA to (None: PyTorch's own choice, or eager's no SDPA)."""
    if attention in ("flash", "eager"):
        return None
    from torch.nn.attention import SDPBackend

    chosen = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    return [chosen.get(attention, SDPBackend.MATH)]


def apply_device_settings(cfg: RunConfig, device: Any) -> dict[str, str]:
    """TF32 matmuls where configured (CUDA); returns notes for the run's record."""
    import torch

    if cfg.precision != "tf32":
        return {}
    if device.type != "cuda":
        return {"precision": "tf32 runs as fp32 on CPU (no TF32 there)"}
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    return {}


def compile_blocks(model: Any, cfg: RunConfig) -> Any:
    """Each block of `model` torch.compile'd where `cfg.compile` (before the strategy wraps it)."""
    if not cfg.compile:
        return model
    import torch

    for i, block in enumerate(model.blocks):
        model.blocks[i] = torch.compile(block)
    return model
