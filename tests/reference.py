"""The single-process reference: the same model, the same global batches, plain autograd and
Adam. Every strategy must end with these parameters (within floating-point tolerance):
strategies change speed, never the math. FSDP2's mixed precision computes differently, and so
does its reference: each rank's gradient in the parameter dtype from its own slice of the
batch, cast to the reduce dtype, averaged over the ranks in it."""

from __future__ import annotations

import copy

import torch

from shardsim.config import RunConfig
from shardsim.runtime import data
from shardsim.runtime.models import build as workloads
from shardsim.runtime.optimizer import build_optimizer
from shardsim.runtime.stack import apply_model_settings
from shardsim.runtime.strategies.precision import DTYPES


def _accumulate(model, cfg: RunConfig, world: int, step: int) -> float:
    K, bpd = cfg.grad_accum, cfg.batch_per_device
    total = 0.0
    for k in range(K):
        x, y = data.global_batch(model.sample_batch, bpd, world, cfg.seed, step, k)
        loss = model.loss(model(x), y) / K
        loss.backward()
        total += loss.item()
    return total


def _accumulate_mixed(model, cfg: RunConfig, world: int, step: int) -> float:
    """FSDP2's MixedPrecisionPolicy(param_dtype, reduce_dtype): every rank runs a copy of the
    model cast to the parameter dtype on its own slice of each micro-batch (the loss in fp32,
    as `runtime.strategies` computes it); its gradient, cast
    to the reduce dtype (where FSDP2 also accumulates it), is summed over the ranks and divided
    by their number in that dtype, then set on the fp32 parameters. Returns the loss averaged
    over the ranks."""
    K, bpd = cfg.grad_accum, cfg.batch_per_device
    low = copy.deepcopy(model).to(DTYPES[cfg.storage_precision])
    reduce = DTYPES[cfg.grad_dtype]
    sums = {name: torch.zeros_like(p, dtype=reduce) for name, p in model.named_parameters()}
    total = 0.0
    for rank in range(world):
        for k in range(K):
            low.zero_grad(set_to_none=True)
            x, y = data.local_batch(model.sample_batch, bpd, 1, cfg.seed, step, k, rank)
            loss = low.loss(low(x).float(), y)  # as the runtime: the loss of the output cast to fp32
            if K > 1:
                loss = loss * (1.0 / K)
            loss.backward()
            total += loss.item() / world
            for name, p in low.named_parameters():
                if p.grad is not None:
                    sums[name] += p.grad.to(reduce)
    for name, p in model.named_parameters():
        p.grad = (sums[name] / world).to(p.dtype)
    return total


def reference_run(cfg: RunConfig, world: int, steps: int, data_batches: int = 0) -> dict:
    """Train `steps` optimizer steps on the global batches of a `world`-rank run (fp32; for
    zero and zero2d at a lower precision, FSDP2's mixed precision), then compute (not apply)
    the gradients of step `steps` (`data_batches` as a run's --data-batches). Returns
    {"params", "grads", "losses"}: what a run with ``SHARDSIM_SAVE_PARAMS`` saves
    (`shardsim.runtime.testing.SaveParams`), and the loss of each step. With tensor parallelism
    the model's qkv rows are grouped as the run's (`tp`) and the global batch is that of the
    world / tp data-parallel ranks (a TP group shares its samples)."""
    tp = cfg.strategy.tp
    world //= tp
    model = apply_model_settings(workloads.build(cfg.workload, cfg.seed, cfg.shape, tp=tp), cfg)
    opt = build_optimizer(model.parameters(), cfg.optimizer, cfg.optimizer_impl)
    # FSDP2's mixed precision, where the run applies a MixedPrecisionPolicy (`precision_for`): a
    # low param dtype or a reduce dtype other than fp32, on zero / zero2d
    low = cfg.storage_precision != "fp32" or cfg.grad_dtype != "fp32"
    mixed = low and cfg.strategy.spec.fsdp
    accumulate = _accumulate_mixed if mixed else _accumulate
    threads = torch.get_num_threads()
    if mixed:
        # low-precision CPU kernels round sums whose order follows the threads: one, as each rank runs
        torch.set_num_threads(1)
    try:
        losses = []
        for step in range(steps):
            losses.append(accumulate(model, cfg, world, data.data_step(step, data_batches)))
            opt.step()
            opt.zero_grad(set_to_none=True)
        params = {name: p.detach().clone() for name, p in model.named_parameters()}
        accumulate(model, cfg, world, data.data_step(steps, data_batches))
    finally:
        torch.set_num_threads(threads)
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return {"params": params, "grads": grads, "losses": losses}
