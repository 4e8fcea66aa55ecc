"""Which linears Float8 training converts: torchao's `convert_to_float8_training` with
torchtitan's module filter, named as the runtime's model names its modules.

torchtitan (`torchtitan/components/quantization/utils.py`, `module_filter_fn`) converts an
``nn.Linear`` whose weight's two dimensions are both divisible by 16 (the FP8 tensor cores'
requirement) and whose name holds none of ``filter_fqns``; its Llama recipes set
``filter_fqns = ["output"]``, the output head. Here the head is the runtime model's ``head``
(`runtime.models.transformer`: the LM head and a classifier alike), so a head's linear never
converts; convolutions and embeddings are not linears and stay in the training precision.
The divisibility is of the whole module's dimensions: torchtitan converts before it applies
tensor parallelism, so a tensor-parallel rank runs its shard of a converted linear in FP8.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsim.specs.model.arch import Arch

FP8_DIM_MULTIPLE = 16  # torchtitan module_filter_fn: both weight dimensions divisible by 16
HEAD_FQN = "head"  # torchtitan's filter_fqns ["output"]: the output head, as the runtime names it


@dataclass(frozen=True)
class Linear:
    """One ``nn.Linear`` of a block: its name in the block, its features, and the index of the
    forward GEMM it runs in (`simulator.gpu_kernels.block_kernels`: gate and up are one GEMM)."""

    name: str
    in_features: int
    out_features: int
    gemm: int

    @property
    def converts(self) -> bool:
        """torchtitan's filter of a block's linear: both dimensions divisible by 16."""
        return self.in_features % FP8_DIM_MULTIPLE == 0 and self.out_features % FP8_DIM_MULTIPLE == 0


def layer_linears(a: Arch) -> tuple[Linear, ...]:
    """The linears of one layer of a model of `a`, in the order of its forward GEMMs, named as the
    runtime's layer names them (`runtime.models.transformer`)."""
    h, f = a.hidden, a.ffn_size
    if not a.spec.transformer:
        return (Linear("fc1", h, f, 0), Linear("fc2", f, h, 1))
    attn = (Linear("attn.qkv", h, a.q_dim + 2 * a.kv_dim, 0), Linear("attn.proj", a.q_dim, h, 1))
    if a.traits.mlp == "swiglu":
        return (*attn, Linear("mlp.gate", h, f, 2), Linear("mlp.up", h, f, 2), Linear("mlp.down", f, h, 3))
    return (*attn, Linear("mlp.fc1", h, f, 2), Linear("mlp.fc2", f, h, 3))


def converted_gemms(a: Arch) -> tuple[bool, ...]:
    """Per forward GEMM of a layer (`gpu_kernels.block_kernels`' order): whether its linears convert."""
    linears = layer_linears(a)
    return tuple(all(x.converts for x in linears if x.gemm == g) for g in range(max(x.gemm for x in linears) + 1))


def converted_linears(a: Arch) -> tuple[str, ...]:
    """The fully qualified names of the linears Float8 training converts in the runtime's model
    of `a` (``blocks.<i>.<name>``): every layer's linears the filter passes, never the head's."""
    return tuple(f"blocks.{i}.{x.name}" for i in range(a.layers) for x in layer_linears(a) if x.converts)
