"""Tensor parallelism (DTensor, `runtime.strategies.tensor_parallel`) composed with every
strategy computes what one process computes on the same global batches (`tests.reference`, the
model's qkv rows grouped as the run's): parameters after N Adam steps, the next step's
gradients and the losses, on gloo CPU ranks.

Tolerance: that of every other strategy (parameters 1e-4, gradients rtol 1e-4 / atol 1e-6,
losses 1e-5 relative). Tensor parallelism changes only the order of fp32 sums: a row-parallel
matmul adds tp partial products in an all-reduce / reduce-scatter, the vocabulary-parallel loss
its tp partial sums of exponentials. Re-association moves a gradient by ~1e-7 relative (measured
here: at most 6.5e-7 of a tensor's largest entry, `test_initial_gradients_equal_reference`, which
checks at 2e-6); Adam then turns that noise in near-zero gradient entries into parameter steps of
up to its learning rate. With tied embeddings every vocabulary row gets such tiny gradients from
the head, and after 3 steps parameters move by up to 1.5e-4 and the next gradients by 3e-6
(5e-5 of the tensor, relative): that case is checked at 5e-4 / 1e-5, and exactly at the first
step by the initial-gradient test. A wrong shard, a missing reduction or a mis-scaled gradient
moves results by O(1).

Launches: the configurations run in the session's one torchrun launch per world size (2, 4 and 8
ranks, with the other modules' cases: `tests.runtime_batch`), the initial-gradient cases in one
spawn of 2 ranks; each test asserts its own case's result."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardsim.runtime.launch import free_port
from shardsim.runtime.processes import exit_now
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.library import PRESETS
from tests.integration.test_runtime_strategies import check_against_reference
from tests.runtime_batch import ModuleBatches, SessionBatches, register

GQA = "{family: llama, hidden: 64, layers: 2, heads: 4, kv_heads: 2, ffn: 128, vocab: 256, seq_len: 32}"
TIED = "{family: gpt, hidden: 64, layers: 2, heads: 4, ffn: 128, vocab: 256, seq_len: 32, tied_embeddings: true}"
VIT_SP = "{family: vit, hidden: 64, layers: 2, heads: 4, ffn: 128, image: 24, patch: 8, classes: 10}"  # 10 tokens

CASES = {
    "gpt-tp2": (2, ["--workload", "tiny-gpt", "--strategy", "zero", "--tp", "2", "--no-checkpointing"]),
    "gpt-tp2-sp-accum2": (
        2,
        ["--workload", "tiny-gpt", "--strategy", "zero", "--tp", "2", "--sequence-parallel", "--grad-accum", "2"],
    ),
    "gqa-tp2-x-zero2-sp": (4, ["--workload", GQA, "--strategy", "zero", "--tp", "2", "--sequence-parallel"]),
    "gpt-tied-tp2-x-zero2": (4, ["--workload", TIED, "--strategy", "zero", "--tp", "2", "--no-checkpointing"]),
    "gqa-tp2-x-ddp2": (4, ["--workload", GQA, "--strategy", "ddp", "--tp", "2", "--grad-accum", "2"]),
    "gqa-tp2-x-zero1-2": (4, ["--workload", GQA, "--strategy", "zero1", "--tp", "2", "--grad-accum", "2"]),
    "gpt-tp2-x-ddp2-sp": (4, ["--workload", "tiny-gpt", "--strategy", "ddp", "--tp", "2", "--sequence-parallel"]),
    "gpt-tp2-x-pp2": (
        4,
        ["--workload", "tiny-gpt", "--strategy", "pipeline", "--pp", "2", "--microbatches", "2", "--tp", "2"],
    ),
    "gqa-tp2-x-pp2-sp": (
        4,
        [
            "--workload",
            GQA,
            "--strategy",
            "pipeline",
            "--pp",
            "2",
            "--microbatches",
            "2",
            "--schedule",
            "1f1b",
            "--tp",
            "2",
            "--sequence-parallel",
        ],
    ),  # fmt: skip
    "vit-tp2-x-ddp2": (4, ["--workload", "tiny-vit", "--strategy", "ddp", "--tp", "2"]),
    "vit-tp2-sp": (2, ["--workload", VIT_SP, "--strategy", "zero", "--tp", "2", "--sequence-parallel"]),
}


def key_biases(arch: Arch, tp: int) -> dict:
    """The key biases of every layer's fused qkv bias (rows grouped for `tp`): softmax is invariant
    to them (they add q . b_k to all of a query's scores), so their gradient is mathematically
    zero; in ViT's unmasked attention the rounding noise there is large enough for Adam to step."""
    gw = (arch.hidden + 2 * arch.kv_dim) // tp
    idx = [g * gw + arch.hidden // tp + i for g in range(tp) for i in range(arch.kv_dim // tp)]
    return {f"blocks.{i}.attn.qkv.bias": idx for i in range(arch.layers)}


@pytest.fixture(scope="module")
def batches(runtime_batches: SessionBatches) -> ModuleBatches:
    """Every configuration: the session's one torchrun launch per world size (`tests.runtime_batch`)."""
    return runtime_batches.module("tensor-parallel")


@pytest.mark.parametrize("case", list(CASES))
def test_tensor_parallel_equals_single_process_reference(batches, case):
    world, args = CASES[case]
    loose: dict = {"param_atol": 5e-4, "grad_atol": 1e-5} if "tied" in case else {}  # see the module docstring
    if case.startswith("vit"):
        loose["adam_noise"] = key_biases(ARCHS["vit"] if "sp" in case else PRESETS["tiny-vit"], 2)
    result = batches[case]
    rec = check_against_reference(result.ok(), result.folder / "params", world, args, **loose)
    assert rec["config"]["strategy"]["tp"] == 2
    assert rec["global_batch"] == 4 * (world // 2) * rec["config"]["grad_accum"]  # a TP group shares its samples


SLOW = {  # 8 ranks
    # tp 2 x HSDP (2 replicas x shard 2): mesh (replicate, shard, tp) = (2, 2, 2)
    "gqa-tp2-x-zero2d-d2-accum2": ["--workload", GQA, "--strategy", "zero2d", "--degree", "2", "--tp", "2",
                                   "--grad-accum", "2"],
    # pp 2 x dp 2 x tp 2: each stage's TP shards under DDP
    "gpt-tp2-x-pp2-x-ddp2-sp-accum2": ["--workload", "tiny-gpt", "--strategy", "pipeline", "--pp", "2",
                                       "--microbatches", "2", "--tp", "2", "--sequence-parallel", "--grad-accum", "2"],
    # pp 2 x zero 2 x tp 2: each stage's TP shards under FSDP2
    "gpt-tp2-x-pp2-x-zero2": ["--workload", "tiny-gpt", "--strategy", "pipeline", "--pp", "2", "--degree", "2",
                              "--microbatches", "2", "--tp", "2"],
}  # fmt: skip


register("tensor-parallel", {**CASES, **{n: (8, a) for n, a in SLOW.items()}})


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SLOW))
def test_3d_layouts_equal_reference(batches, case):
    result = batches[case]
    check_against_reference(result.ok(), result.folder / "params", 8, SLOW[case])


ARCHS = {
    "gpt-tied": Arch("gpt", hidden=64, layers=2, heads=4, ffn=128, vocab=256, seq_len=32, tied_embeddings=True),
    "llama-gqa": Arch("llama", hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=256, seq_len=32),
    # q/k/v biases alone (Qwen2) and a head width other than hidden / heads (Gemma)
    "llama-qkv-bias": Arch(
        "llama", hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=256, seq_len=32, qkv_bias=True, head_size=8
    ),
    "vit": Arch("vit", hidden=64, layers=2, heads=4, ffn=128, image=24, patch=8, classes=10),
    "mpt": Arch("mpt", hidden=64, layers=2, heads=4, ffn=128, vocab=256, seq_len=32),  # no biases, ALiBi's none
    "bert": Arch("bert", hidden=64, layers=2, heads=4, ffn=128, vocab=256, seq_len=32),  # bidirectional, biases
}


def _gradients(rank: int, world: int, port: int, out: dict) -> None:
    """Every (architecture, sequence parallel) case's first-step gradients, in turn, in one
    process group: rank 0's full tensors in ``out[(name, sp)]``."""
    from torch.distributed.device_mesh import init_device_mesh

    from shardsim.runtime.models.builders import build_model
    from shardsim.runtime.strategies.tensor_parallel import apply_tp, loss_context, reduce_partial_grads

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name, sp in INITIAL:
            print(f"initial gradients: {name}, sequence parallel {sp}", flush=True)  # names a failing case
            torch.manual_seed(0)
            model = build_model(ARCHS[name], qkv_groups=world)
            apply_tp(model, init_device_mesh("cpu", (world,), mesh_dim_names=("tp",)), sequence_parallel=sp)
            x, y = model.sample_batch(4, torch.Generator().manual_seed(1))
            with loss_context(world):
                model.loss(model(x), y).backward()
            reduce_partial_grads(model)
            grads = {
                n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                for n, p in model.named_parameters()
            }
            if rank == 0:
                out[(name, sp)] = {n: g.detach().clone() for n, g in grads.items()}
            dist.barrier()  # nothing in flight between the ranks when either ends
    finally:
        dist.destroy_process_group()
    # gloo's worker threads may outlive the group: end without finalizing, as the runtime's ranks
    # do (`runtime.processes.exit_now`: "terminate called without an active exception" otherwise)
    exit_now(0)


INITIAL = [(name, sp) for name in ARCHS for sp in (False, True)]


@pytest.fixture(scope="module")
def initial_gradients() -> dict:
    """Rank 0's first-step gradients of every case of `INITIAL`: one spawn of 2 gloo ranks."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_gradients, args=(2, free_port(), out), nprocs=2)
        return dict(out)


@pytest.mark.parametrize("sp", [False, True], ids=["no-sp", "sp"])
@pytest.mark.parametrize("name", list(ARCHS))
def test_initial_gradients_equal_reference(initial_gradients, name, sp):
    """The first step's gradients of the TP model (2 gloo ranks, `apply_tp` alone) equal one
    process's to 2e-6 of each tensor's largest entry (fp32 re-association: measured <= 6.5e-7)."""
    from shardsim.runtime.models.builders import build_model

    got = initial_gradients[(name, sp)]
    torch.manual_seed(0)
    ref = build_model(ARCHS[name], qkv_groups=2)
    x, y = ref.sample_batch(4, torch.Generator().manual_seed(1))
    ref.loss(ref(x), y).backward()
    want = {n: p.grad for n, p in ref.named_parameters()}
    assert sorted(got) == sorted(want)
    for n, w in want.items():
        torch.testing.assert_close(got[n], w, rtol=0, atol=2e-6 * float(w.abs().max()), msg=lambda m, n=n: f"{n}: {m}")
