"""Expert parallelism as torchtitan applies it (torchtitan/distributed/expert_parallel.py,
parallelize for Llama 4 and DeepSeek-V3): each MoE layer's stacked expert weights become DTensors
sharded on the expert dimension over the "ep" mesh (a rank runs its experts / ep of them), its
tokens dispatched and combined by all-to-all (`models.moe.ExpertParallel`); FSDP2 then shards the
experts over the data-parallel ranks left after EP (`shard_experts`), the rest of the model over
all of them (`fsdp.apply_fsdp`)."""

from __future__ import annotations

from torch import nn

from shardsim.runtime.models.moe import ExpertParallel, moe_layers


def apply_ep(model: nn.Module, ep_mesh) -> nn.Module:
    """Shard every MoE layer's experts of `model` over `ep_mesh` (1-D) and route its tokens over it."""
    from torch.distributed.tensor import Shard, distribute_tensor

    for moe in moe_layers(model):
        experts = moe.experts
        for name, p in list(experts.named_parameters(recurse=False)):
            dt = distribute_tensor(p.data, ep_mesh, [Shard(0)], src_data_rank=None)  # every rank holds the same weights
            experts.register_parameter(name, nn.Parameter(dt, requires_grad=p.requires_grad))
        moe.parallel = ExpertParallel(ep_mesh.get_group(), ep_mesh.size())
    return model


def shard_experts(block: nn.Module, mesh, divide: int, **fsdp) -> None:
    """FSDP2 over `mesh` (the data-parallel ranks left after EP) for the experts of `block`'s MoE
    layers, a unit of their own, before the block's own unit takes the rest (torchtitan's edp mesh).
    Their gradients are summed over the whole data-parallel world (each rank's holds the tokens
    its EP group sent it) and divided by it, `divide` ranks: FSDP2's own average would divide by
    `mesh`'s ranks only. Over a shard group of several ranks the reduce-scatter is a plain SUM and
    the division follows (gloo has no PREMUL_SUM); over one rank FSDP2 (torch 2.13) divides as it
    copies the gradient and would divide again after a forced SUM, so the sum is not forced there."""
    from torch.distributed.fsdp import fully_shard

    shard_ranks = mesh.size(mesh.ndim - 1)
    for moe in moe_layers(block):
        unit = fully_shard(moe.experts, mesh=mesh, **fsdp)
        unit.set_gradient_divide_factor(float(divide))
        unit.set_force_sum_reduction_for_comms(shard_ranks > 1)
