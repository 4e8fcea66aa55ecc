"""DDP with reduce_dtype fp16 (`runtime.strategies.ddp.apply_ddp`: PyTorch's fp16_compress_hook)
trains on 2 gloo ranks on CPU, and its all-reduced gradients are fp32's within fp16's rounding
(yet not bit-equal: the hook ran). bf16's hook refuses CPU / gloo, as the config does first."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from shardsim.runtime.launch import free_port
from shardsim.runtime.strategies.ddp import apply_ddp

WORLD, STEPS = 2, 20


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 1))


def _train(reduce_dtype: str, rank: int) -> tuple[list[torch.Tensor], list[float]]:
    """The first step's all-reduced gradients and every step's loss."""
    ddp = apply_ddp(_model(), torch.device("cpu"), reduce_dtype=reduce_dtype)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own data
    x = torch.randn(STEPS, 16, 32, generator=g)
    y = x[..., :4].sum(-1, keepdim=True)
    first, losses = [], []
    for s in range(STEPS):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x[s]), y[s])
        loss.backward()
        if s == 0:
            first = [p.grad.detach().clone() for p in ddp.parameters()]
        opt.step()
        losses.append(loss.item())
    return first, losses


def _rank(rank: int, port: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        out = {dtype: _train(dtype, rank) for dtype in ("fp32", "fp16")}
        try:
            apply_ddp(_model(), torch.device("cpu"), reduce_dtype="bf16")
            out["bf16"] = "registered"
        except (TypeError, RuntimeError) as exc:
            out["bf16"] = str(exc)
        if rank == 0:  # plain lists: a tensor's shared storage would not outlive this process
            q.put({k: v if isinstance(v, str) else ([g.tolist() for g in v[0]], v[1]) for k, v in out.items()})
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs() -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_rank, args=(free_port(), q), nprocs=WORLD, start_method="spawn")
    return q.get()


def test_fp16_hook_gradients_match_fp32_within_rounding(runs: dict) -> None:
    g32 = [torch.tensor(g) for g in runs["fp32"][0]]
    g16 = [torch.tensor(g) for g in runs["fp16"][0]]
    for a, b in zip(g32, g16, strict=True):
        rel = ((a - b).norm() / a.norm()).item()
        assert rel < 2e-3, rel  # fp16 keeps 11 significant bits: ~5e-4 relative per value
    assert any(not torch.equal(a, b) for a, b in zip(g32, g16, strict=True))  # the hook did run


def test_fp16_hook_trains(runs: dict) -> None:
    _, l32 = runs["fp32"]
    _, l16 = runs["fp16"]
    assert l16[-1] < 0.5 * l16[0]
    assert abs(l16[-1] - l32[-1]) <= 0.05 * l32[-1]


def test_bf16_hook_refuses_cpu(runs: dict) -> None:
    assert "NCCL" in runs["bf16"]  # why resolve refuses bf16 for DDP on gloo
