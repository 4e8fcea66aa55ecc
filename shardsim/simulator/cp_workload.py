"""The model as one context-parallel rank runs it: its share of each sample's sequence.

PyTorch's `context_parallel` hands each of the cp ranks 2 of the sequence's 2·cp chunks (chunk i
and chunk 2·cp-1-i, its head-tail load balancing of causal attention), so every layer but
attention runs on S/cp tokens, and every activation is a cp-th of the whole. Attention runs in cp
rounds of ring attention (`_templated_ring_attention`): round 0 the local queries against the
local keys with the causal mask, each later round either all local queries against the first
half of a peer's keys or the second half of the local queries against all its keys: every round
is (S/cp)²/2 products, so a rank computes cp × a causal S/cp attention, a cp-th of the whole
sequence's causal attention. Parameters are the model's, whatever the sequence.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from shardsim.simulator.gpu_kernels import BWD_ATTN_WORK
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.blocks import attention_flops, from_arch
from shardsim.specs.model.workload import Workload


def cp_arch(a: Arch, cp: int) -> Arch:
    """The shape a context-parallel rank's kernels see: a cp-th of the sequence."""
    return a if cp == 1 else replace(a, seq_len=a.seq_len // cp)


@lru_cache(maxsize=64)
def cp_rank_workload(name: str, arch: Arch, tp: int, sp: bool, cp: int) -> Workload:
    """`blocks.from_arch` of one rank of a tensor-parallel group of `tp` and a context-parallel
    group of `cp` (`config.cp` has checked cp: a causal text model, 2·cp dividing the sequence):
    the figures of S/cp tokens, attention's rounds over the whole sequence's keys, the
    parameters of the whole model (learned positions included: each rank holds the table)."""
    whole = from_arch(name, arch, tp, sp)
    short = cp_arch(arch, cp)
    part = from_arch(name, short, tp, sp)
    rounds = attention_flops(short) / tp * (cp - 1)  # rounds 1..cp-1, each as much as round 0
    blocks = []
    for wb, pb in zip(whole.blocks, part.blocks, strict=True):
        b = replace(
            pb,
            params=wb.params,
            param_tensors=wb.param_tensors,
            largest_tensor=wb.largest_tensor,
            dtensor_params=wb.dtensor_params,
        )
        if b.kind == "layer":
            b = replace(b, fwd_flops=b.fwd_flops + rounds, bwd_flops=b.bwd_flops + BWD_ATTN_WORK * rounds)
        blocks.append(b)
    return replace(part, blocks=tuple(blocks))
