"""The mixture-of-experts MLP of the moe family, as torchtitan builds it (torchtitan/models/moe.py:
`TokenChoiceTopKRouter`, `GroupedExperts`, the token permutation; softmax scoring): a router
``nn.Linear(hidden, experts, bias=False)``, softmax over the experts and the top-k of them per
token (the gate values are those softmax scores, not renormalized over the k), the routed tokens
sorted by expert, each expert's SwiGLU on its rows (stacked weights ``w1``, ``w3``:
[experts, hidden, expert_ffn], ``w2``: [experts, expert_ffn, hidden]), the outputs scaled by their
gate values and summed back per token by ``scatter_add`` over the expanded token index (what
torchtitan's `LocalTokenDispatcher.combine` does; ``index_add`` would save the weighted rows for its
backward besides), beside an optional shared expert (a SwiGLU of `shared_ffn`; with `shared_gate`
scaled by ``sigmoid(Linear(hidden, 1, bias=False))`` as Transformers' Qwen2MoeSparseMoeBlock).
Dropless: every token reaches its k experts, however uneven the load.

Simplifications, named: the experts run as a loop over experts (exact in fp32 on CPU; torchtitan
calls ``torch._grouped_mm``, one grouped GEMM, in bf16); no load-balancing loss or expert bias.

Expert parallelism (`ExpertParallel`, set by `runtime.strategies.expert_parallel`): each rank of
an EP group holds experts / ep of the experts; the tokens go to their experts' ranks by
``all_to_all_single`` and come back the same way (dispatch and combine; the backward the reverse
exchanges), after an all-to-all of the per-expert token counts (torchtitan's way for uneven splits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from shardsim.runtime.models.transformer import SwiGLU
from shardsim.specs.model.arch import Arch


class Router(nn.Module):
    """Token-choice top-k routing: softmax over `experts` router scores, the top `k` per token."""

    def __init__(self, hidden: int, experts: int, top_k: int):
        super().__init__()
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate values, expert ids), each (tokens, k), of the tokens `x` (tokens, hidden)."""
        scores = F.softmax(self.gate(x).float(), dim=-1)
        top, ids = torch.topk(scores, self.top_k, dim=-1)
        return top, ids


class GroupedExperts(nn.Module):
    """`experts` SwiGLU experts of stacked weights; under expert parallelism a rank's share of them
    (the weights DTensors sharded on dim 0: their local part is what runs)."""

    def __init__(self, hidden: int, ffn: int, experts: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.w2 = nn.Parameter(torch.empty(experts, ffn, hidden))
        self.w3 = nn.Parameter(torch.empty(experts, hidden, ffn))
        for w, fan_in in ((self.w1, hidden), (self.w2, ffn), (self.w3, hidden)):
            bound = 1 / math.sqrt(fan_in)  # nn.Linear's default initialization, per expert
            nn.init.uniform_(w, -bound, bound)

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """The experts' outputs of rows `x` sorted by expert, `counts[e]` rows for local expert e."""
        w1, w2, w3 = (_local(w) for w in (self.w1, self.w2, self.w3))
        outs = [(F.silu(rows @ w1[e]) * (rows @ w3[e])) @ w2[e] for e, rows in enumerate(torch.split(x, counts, dim=0))]
        return torch.cat(outs, dim=0) if outs else x.new_zeros(0, x.shape[-1])


def _local(w: torch.Tensor) -> torch.Tensor:
    return w.to_local() if hasattr(w, "to_local") else w


@dataclass(frozen=True)
class Routed:
    """One MoE layer's routing of a micro-batch: the expert-sorted copies of the tokens."""

    token: torch.Tensor  # (tokens x k,): the token each sorted row is a copy of
    gate: torch.Tensor  # (tokens x k,): its gate value
    counts: torch.Tensor  # (experts,): rows per expert


def route(top: torch.Tensor, ids: torch.Tensor, experts: int) -> Routed:
    """Sort the (token, expert) pairs of a router's output by expert (stable: token order within one)."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    return Routed(order // ids.shape[-1], top.reshape(-1)[order], counts)


class ExpertParallel:
    """Dispatch and combine of one MoE layer over an EP group of `ep` ranks (torchtitan's
    all-to-all token dispatcher): the per-expert counts exchanged first, then the rows by
    ``all_to_all_single`` with uneven splits, autograd carrying the reverse exchanges in backward."""

    def __init__(self, group, ep: int):
        self.group, self.ep = group, ep

    def __call__(self, experts: GroupedExperts, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd

        ep = self.ep
        local = counts.numel() // ep
        with torch.no_grad():
            received = all_to_all_single(counts, None, None, self.group).view(ep, local)  # [source rank, local expert]
        send = counts.view(ep, local).sum(1).tolist()
        recv = received.sum(1).tolist()
        got = all_to_all_single_autograd(rows, recv, send, self.group)
        # rank-major (source rank, local expert) blocks → expert-major, and back after the experts
        order = _expert_major(received.cpu()).to(got.device)
        out = experts(got[order], received.sum(0).tolist())
        back = out[torch.argsort(order)]
        return all_to_all_single_autograd(back, send, recv, self.group)


def _expert_major(counts: torch.Tensor) -> torch.Tensor:
    """Row indices that reorder blocks laid out [rank][expert] (`counts`: [ranks, experts]) as [expert][rank]."""
    starts = (counts.reshape(-1).cumsum(0) - counts.reshape(-1)).view_as(counts)
    pieces = [
        torch.arange(int(starts[r, e]), int(starts[r, e] + counts[r, e]))
        for e in range(counts.shape[1])
        for r in range(counts.shape[0])
    ]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)


class MoE(nn.Module):
    """The MLP of an MoE layer: router, routed experts (local or expert-parallel) and the shared
    expert. ``tokens_per_expert`` counts, per expert, the (token, expert) pairs routed in
    forward passes since it was last cleared (a recomputation under activation checkpointing not
    counted again)."""

    def __init__(
        self,
        hidden: int,
        experts: int,
        top_k: int,
        expert_ffn: int,
        shared_ffn: int,
        layer: int = 0,
        shared_gate: bool = False,
    ):
        super().__init__()
        self.layer = layer  # the index of the transformer layer it is the MLP of
        self.experts_n = experts
        self.router = Router(hidden, experts, top_k)
        self.experts = GroupedExperts(hidden, expert_ffn, experts)
        self.shared = SwiGLU(hidden, shared_ffn, False) if shared_ffn else None
        self.shared_gate = nn.Linear(hidden, 1, bias=False) if shared_ffn and shared_gate else None
        self.register_buffer("tokens_per_expert", torch.zeros(experts, dtype=torch.long), persistent=False)
        self.parallel: ExpertParallel | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        top, ids = self.router(x)
        r = route(top, ids, self.experts_n)
        if torch._C._current_autograd_node() is None:  # not a recomputation in backward
            self.tokens_per_expert += r.counts.to(self.tokens_per_expert.device)
        rows = x[r.token]
        if self.parallel is None:
            out = self.experts(rows, r.counts.tolist())
        else:
            out = self.parallel(self.experts, rows, r.counts)
        out = (out.float() * r.gate.unsqueeze(-1)).to(x.dtype)
        y = torch.zeros_like(x).scatter_add(0, r.token.unsqueeze(-1).expand_as(out), out)
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            y = y + shared
        return y.reshape(shape)


def build_moe(a: Arch, qkv_groups: int = 1):
    """A moe-family model: llama's text model whose MoE layers (`Arch.is_moe_layer`) have an `MoE` MLP."""
    from shardsim.runtime.models.transformer import build_text

    mlps: list[nn.Module | None] = [
        MoE(a.hidden, a.experts, a.top_k, a.expert_ffn_size, a.shared_ffn, i, a.shared_gate)
        if a.is_moe_layer(i)
        else None
        for i in range(a.layers)
    ]
    return build_text(a, qkv_groups, mlps)


def moe_layers(model: nn.Module) -> list[MoE]:
    """The MoE MLPs of `model`, in layer order."""
    return [m for m in model.modules() if isinstance(m, MoE)]
