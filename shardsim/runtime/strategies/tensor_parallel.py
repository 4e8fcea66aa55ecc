"""Tensor parallelism with PyTorch's DTensor API (`parallelize_module`), as torchtitan applies it.

Per transformer layer (`runtime.models.transformer`), as its family's `TPPlan` names the modules:
attn.qkv and the MLP's fc1 / gate / up column-parallel (`ColwiseParallel`), attn.proj and fc2 /
down row-parallel (`RowwiseParallel`): an
all-reduce of the layer's activations after each row-parallel matmul in forward, and in backward
one of the input gradients of attention and one of the MLP (their input enters as one DTensor).
With sequence parallelism the norms run on a sequence shard (`SequenceParallel`), attention and
MLP gather their input (all-gather, whose backward reduce-scatters) and the row-parallel outputs
reduce-scatter along the sequence.

Text embedding: vocabulary-parallel (`RowwiseParallel` on the nn.Embedding: an all-reduce of its
output, a reduce-scatter under SP); learned positions replicated without SP, with SP sharded along
the sequence (each rank adds its own rows). LM head: the output projection column-parallel, its
logits kept sharded over the vocabulary (a DTensor) for a vocabulary-parallel cross-entropy under
`loss_parallel()` (`loss_context`). Tied embeddings: the embedding's Shard(0) weight is the head's
Shard(0) weight; the two modules are parallelized separately and the DTensor parameter is tied
again afterwards. ViT: the patch embedding and classifier stay replicated; under SP the first
layer's input is split along the tokens and the classifier's norm input gathered.

Parameters of modules without a plan (norms without SP, the ViT's embedding and classifier) stay
plain tensors, identical on the ranks of a tensor-parallel group.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from shardsim.runtime.models.checks import check_runtime_tp
from shardsim.runtime.strategies.blocks import blocks_of


def _layer_plan(layer: nn.Module, sp: bool) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    out = Shard(1) if sp else Replicate()
    split = layer.tp_plan  # the family's `TPPlan`
    plan: dict = {name: ColwiseParallel() for name in split.colwise}
    plan.update({name: RowwiseParallel(output_layouts=out) for name in split.rowwise})
    # attention's and the MLP's input enter as one replicated DTensor (gathered along the sequence
    # under SP): the gradients of its column-parallel consumers (SwiGLU's gate and up) add up
    # before one all-reduce (one reduce-scatter under SP), as Megatron's f operator, instead of
    # one per consumer
    enter = PrepareModuleInput(input_layouts=(out,), desired_input_layouts=(Replicate(),))
    plan.update({"attn": enter, "mlp": enter})
    if sp:
        plan.update({name: SequenceParallel() for name in split.norms})
    return plan


def _unwrap(module: nn.Module) -> nn.Module:
    """The transformer layer under a checkpoint wrapper (TP is applied first; this is a guard)."""
    return getattr(module, "_checkpoint_wrapped_module", module)


def apply_tp(model: nn.Module, tp_mesh, *, sequence_parallel: bool = False, async_tp: bool = False) -> nn.Module:
    """Parallelize `model` (a `ShardsimModel` or a pipeline `StageModule`: ``embed`` or None,
    ``blocks``, ``head`` or None) over the 1-D `tp_mesh`, in place; returns it."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from shardsim.runtime.models.transformer import ClsHead, LMHead, PatchEmbed, TokenEmbed

    check_runtime_tp(None, 1, async_tp)
    sp = sequence_parallel
    seq = Shard(1) if sp else Replicate()
    embed = getattr(model, "embed", None)
    head = getattr(model, "head", None)
    tied = (
        isinstance(embed, TokenEmbed) and isinstance(head, LMHead) and head.out.weight is embed.tok.weight
    )  # a pipeline stage never holds both: the last stage's head keeps its own Shard(0) copy

    if isinstance(embed, TokenEmbed):
        parallelize_module(embed, tp_mesh, {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)})
        if embed.pos is not None:
            placement = Shard(0) if sp else Replicate()
            embed.pos = nn.Parameter(distribute_tensor(embed.pos.data, tp_mesh, [placement]))
    for i, block in enumerate(blocks_of(model)):
        layer = _unwrap(block)
        parallelize_module(layer, tp_mesh, _layer_plan(layer, sp))
        if sp and i == 0 and isinstance(embed, PatchEmbed):
            split = PrepareModuleInput(
                input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True
            )
            parallelize_module(layer, tp_mesh, split)
    if isinstance(head, LMHead):
        plan: dict = {"out": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)}
        if sp:
            plan["norm"] = SequenceParallel()
        parallelize_module(head, tp_mesh, plan)
        if tied:
            head.out.weight = embed.tok.weight  # one Shard(0) parameter: vocabulary rows on each rank
    elif isinstance(head, ClsHead) and sp:
        gather = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        )
        parallelize_module(head, tp_mesh, gather)
    return model


@contextlib.contextmanager
def loss_context(tp: int) -> Iterator[None]:
    """`loss_parallel()` (the cross-entropy of vocabulary-sharded logits) around a step's forward
    and backward when tensor parallel; nothing otherwise."""
    if tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        with loss_parallel():
            yield
    else:
        yield


def local_loss(loss):
    """The loss as a plain tensor (a replicated DTensor under `loss_parallel`)."""
    return loss.to_local() if hasattr(loss, "to_local") else loss


def reduce_partial_grads(module: nn.Module) -> None:
    """Sum the gradients DTensor left pending over the tensor-parallel ranks (Partial: the weights
    of sequence-parallel norms, computed from a sequence shard) into their parameter's placement:
    one all-reduce each, at the end of the step's backward. FSDP2 does this itself in its
    reduce-scatter, and a DDP module's gradients are local tensors: nothing is left for them."""
    from torch.distributed.tensor import DTensor

    for p in module.parameters():
        g = p.grad
        if isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements:
            if any(pl.is_partial() for pl in g.placements):
                p.grad = g.redistribute(p.device_mesh, p.placements)
