"""The single-process reference: the same model, the same global batches, plain autograd and
Adam. Every strategy must end with these parameters (within floating-point tolerance):
strategies change speed, never the math."""

from __future__ import annotations

import torch

from shardsim.runtime import data
from shardsim.runtime.models import build as workloads
from shardsim.runtime.optimizer import build_adam
from shardsim.simulator.config import RunConfig


def _accumulate(model, cfg: RunConfig, world: int, step: int) -> float:
    K, bpd = cfg.grad_accum, cfg.batch_per_device
    total = 0.0
    for k in range(K):
        x, y = data.global_batch(model.sample_batch, bpd, world, cfg.seed, step, k)
        loss = model.loss(model(x), y) / K
        loss.backward()
        total += loss.item()
    return total


def reference_run(cfg: RunConfig, world: int, steps: int, data_batches: int = 0) -> dict:
    """Train `steps` optimizer steps on the global batches of a `world`-rank run (fp32), then
    compute (not apply) the gradients of step `steps` (`data_batches` as runtime.train's
    --data-batches). Returns {"params", "grads", "losses"}:
    what a run with ``--save-params`` saves, and the loss of each step."""
    model = workloads.build(cfg.workload, cfg.seed, cfg.shape)
    opt = build_adam(model.parameters(), cfg.optimizer_impl)
    losses = []
    for step in range(steps):
        losses.append(_accumulate(model, cfg, world, data.data_step(step, data_batches)))
        opt.step()
        opt.zero_grad(set_to_none=True)
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    _accumulate(model, cfg, world, data.data_step(steps, data_batches))
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return {"params": params, "grads": grads, "losses": losses}


def load_saved(folder: str) -> dict[str, dict[str, torch.Tensor]]:
    """What a run with ``--save-params`` saved (one file per pipeline stage), merged."""
    from pathlib import Path

    out: dict[str, dict[str, torch.Tensor]] = {"params": {}, "grads": {}}
    for path in sorted(Path(folder).glob("stage*.pt")):
        part = torch.load(path)
        out["params"].update(part["params"])
        out["grads"].update(part["grads"])
    return out
