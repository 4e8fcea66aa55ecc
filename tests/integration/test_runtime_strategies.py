"""Every strategy runs for real (torchrun, gloo, CPU), its loss falls, and it computes exactly
what one process computes on the same global batches: the parameters after N Adam steps and
the gradients of the next step (which, unlike Adam's parameters, show any mis-scaling across
ranks, microbatches or accumulation steps). Strategies change speed, never the math.

The configurations of 2 and 4 ranks (the Hugging Face one where transformers is installed) run
in one torchrun launch per world size (`tests.runtime_batch`: each rank imports torch once and
trains them in turn, as a ``shardsim run`` rank trains one); each test asserts on its own
configuration's record and saved tensors. The 8-rank one launches ``shardsim run`` alone."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardsim.config import load_config
from shardsim.runtime.collective_trace import load_rank_trace
from shardsim.runtime.records import CSV_NAME
from shardsim.runtime.testing import SAVE_PARAMS_ENV, load_saved
from tests.reference import reference_run
from tests.runtime_batch import ModuleBatches, SessionBatches, register

ROOT = Path(__file__).resolve().parents[2]
STEPS, WARMUP = 2, 1


def shardsim_run(tmp_path: Path, args: list[str], *, timeout_s: float = 30, env: dict | None = None):
    """`shardsim run ... --json` in a subprocess; returns (CompletedProcess, record or None)."""
    import os

    cmd = [sys.executable, "-m", "shardsim.cli", "run", "--topology", "emu-2x2", "--no-emulate", "--out",
           str(tmp_path / "out")]  # fmt: skip
    cmd += ["--steps", str(STEPS), "--warmup", str(WARMUP), "--timeout", str(timeout_s), "--json", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    record = json.loads(proc.stdout) if proc.returncode == 0 else None
    return proc, record


def _overrides(args: list[str]) -> dict:
    out: dict = {}
    it = iter(args)
    for flag in it:
        key = flag.removeprefix("--").replace("-", "_")
        if key == "no_checkpointing":
            out["checkpointing"] = "none"
            continue
        if key == "no_reshard_after_forward":
            out["reshard_after_forward"] = False
            continue
        if key in ("sequence_parallel", "compile"):
            out[key] = True
            continue
        value = next(it)
        out[key] = int(value) if value.isdigit() else float(value) if key == "mlm_fraction" else value
    return out


def check_equals_reference(tmp_path: Path, world: int, args: list[str], **tolerances) -> dict:
    """`shardsim run` of `args` on `world` ranks (a launch of its own) equals the reference
    (`check_against_reference`, `tolerances` its keywords); returns its record."""
    proc, rec = shardsim_run(tmp_path, [*args, "--nproc", str(world), "--data-batches", "1"],
                             env={SAVE_PARAMS_ENV: str(tmp_path / "params")})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return check_against_reference(rec, tmp_path / "params", world, args, **tolerances)


def check_against_reference(
    rec: dict,
    params: Path,
    world: int,
    args: list[str],
    *,
    param_atol: float = 1e-4,
    grad_atol: float = 1e-6,
    adam_noise: dict | None = None,
) -> dict:
    """The run of `args` on `world` ranks (its record `rec`, the parameters and gradients it saved
    in `params`) learned and computed what one process computes. `adam_noise`: {parameter name:
    indices} of entries whose gradient is mathematically zero, left out of the parameter
    comparison (Adam steps them by up to its learning rate, in the direction of rounding noise);
    their gradients are still compared."""
    assert rec["world"] == world and len(rec["step_times_s"]) == STEPS and len(rec["losses"]) == STEPS + WARMUP
    assert rec["loss_last"] < rec["loss_first"], rec["losses"]

    opts = {k: v for k, v in _overrides(args).items() if k not in ("nproc",)}
    cfg = load_config(None, {"topology": "emu-2x2", **opts})
    ref = reference_run(cfg, world, STEPS + WARMUP, data_batches=1)
    got = load_saved(str(params))
    assert sorted(got["params"]) == sorted(ref["params"])
    assert sorted(got["grads"]) == sorted(ref["grads"])
    for name, idx in (adam_noise or {}).items():
        got["params"][name][idx] = ref["params"][name][idx]
    for name, want in ref["params"].items():
        # Adam turns rounding noise in (mathematically) zero gradients into steps of up to its
        # learning rate (1e-3): 1e-4 still catches any real difference in the update
        torch.testing.assert_close(got["params"][name], want, rtol=1e-4, atol=param_atol, msg=name)
    for name, want in ref["grads"].items():
        torch.testing.assert_close(got["grads"][name], want, rtol=1e-4, atol=grad_atol, msg=name)
    assert rec["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    return rec


EQUAL = {
    "ddp-accum2": (2, "--workload tiny-gpt --strategy ddp --grad-accum 2"),
    "zero": (2, "--workload tiny-gpt --strategy zero --no-checkpointing"),
    "zero2d-d2-accum2": (4, "--workload tiny-gpt --strategy zero2d --degree 2 --grad-accum 2"),
    "zero2-accum2": (2, "--workload tiny-gpt --strategy zero --no-reshard-after-forward --grad-accum 2"),
    "zero2d-zero2-d2": (
        4,
        "--workload tiny-gpt --strategy zero2d --degree 2 --no-reshard-after-forward --checkpointing none",
    ),
    "zero-sac-op": (2, "--workload tiny-gpt --strategy zero --checkpointing selective --selective-ac-option op"),
    "ddp-sac-every-2": (2, "--workload tiny-gpt --strategy ddp --checkpointing selective --selective-ac-option 2"),
    "zero-fused-adam": (2, "--workload tiny-gpt --strategy zero --optimizer-impl fused --reduce-dtype fp32"),
    "zero-bf16-reduce-fp32": (2, "--workload tiny-gpt --strategy zero --precision bf16 --reduce-dtype fp32"),
    "zero-fp32-reduce-bf16": (2, "--workload tiny-gpt --strategy zero --reduce-dtype bf16"),
    "gpipe-pp2": (2, "--workload tiny-mlp --strategy pipeline --pp 2 --microbatches 4 --schedule gpipe"),
    "1f1b-pp2-x-dp2-accum2": (
        4,
        "--workload tiny-gpt --strategy pipeline --pp 2 --microbatches 2 --schedule 1f1b --grad-accum 2",
    ),
    "gpipe-pp2-x-zero-d2": (
        4,
        "--workload tiny-gpt --strategy pipeline --pp 2 --degree 2 --microbatches 2 --schedule gpipe",
    ),
    "zbv-pp2-v2-uneven": (
        2,
        "--workload tiny-gpt --layers 6 --strategy pipeline --pp 2 --stages-per-rank 2 --schedule zbv "
        "--microbatches 4 --layers-per-stage 1,2,2,1",
    ),
    "zero1-accum2": (4, "--workload tiny-gpt --strategy zero1 --grad-accum 2"),
    "zero1-per-parameter-adam": (
        2,
        "--workload tiny-gpt --strategy zero1 --optimizer-impl per-parameter --checkpointing none",
    ),
    # expert parallelism: the experts over the EP ranks, FSDP2 over the ranks left after EP
    "zero-ep2": (2, "--workload tiny-moe --strategy zero --ep 2 --no-checkpointing"),
    "zero-ep2-accum2": (4, "--workload tiny-moe --strategy zero --ep 2 --grad-accum 2"),  # recomputed in backward
    "zero2d-d2-ep2": (4, "--workload tiny-moe --strategy zero2d --degree 2 --ep 2 --no-checkpointing"),
}
EP_TRACED = "zero-ep2"  # its collectives traced (`test_expert_parallel_all_to_alls_are_the_configurations`)
BF16_REDUCED = "--workload tiny-gpt --strategy zero --precision bf16"
LOW_PRECISION = {
    "zero-bf16": "--workload tiny-gpt --strategy zero --precision bf16",  # FSDP2 MixedPrecisionPolicy
    "pipeline-fp16": "--workload tiny-gpt --strategy pipeline --pp 2 --microbatches 2 --precision fp16",  # + scaler
}
HF_VIT = "--workload shardsim.runtime.models.hf:build_hf_vit_tiny --strategy zero2d --degree 2"
TIED_GPT = "{family: gpt, hidden: 64, layers: 4, heads: 4, ffn: 256, seq_len: 32, vocab: 256, tied_embeddings: true}"
TIED = {
    "tied-1f1b-pp2-x-dp2-accum2": (4, "--pp 2 --microbatches 2 --schedule 1f1b --grad-accum 2"),
    "tied-gpipe-pp4": (4, "--pp 4 --microbatches 4 --schedule gpipe"),
    "tied-1f1b-pp2-x-tp2": (4, "--pp 2 --microbatches 2 --schedule 1f1b --tp 2"),  # vocabulary-parallel copies
    "tied-gpipe-pp2-x-zero2": (4, "--pp 2 --microbatches 2 --schedule gpipe --degree 2"),  # FSDP2 shards
    "tied-interleaved-1f1b-pp2-x-tp2": (
        4,
        "--pp 2 --stages-per-rank 2 --microbatches 4 --schedule interleaved-1f1b --tp 2",
    ),  # a multi-stage schedule of tensor-parallel stages
}


def tied_flags(args: str) -> list[str]:
    return ["--workload", TIED_GPT, "--strategy", "pipeline", *args.split()]


# every configuration of this module: the session's one launch per world size runs them all in
# turn with the other modules' (`tests.runtime_batch`), each test checks its own configuration
REPLICAS = "pp2-x-zero2d-d2-replicas-accum2"  # 8 ranks
CASES = {
    **{name: (world, args.split()) for name, (world, args) in EQUAL.items()},
    "zero-bf16-reduce-bf16": (2, [*BF16_REDUCED.split(), "--reduce-dtype", "bf16"]),
    **{name: (2, args.split()) for name, args in LOW_PRECISION.items()},
    **{name: (world, tied_flags(args)) for name, (world, args) in TIED.items()},
    **({"hf-vit": (4, HF_VIT.split())} if importlib.util.find_spec("transformers") else {}),
    REPLICAS: (8, "--workload tiny-gpt --strategy pipeline --pp 2 --degree 2 --microbatches 2 --grad-accum 2".split()),
}


register("strategies", CASES, trace={EP_TRACED})


@pytest.fixture(scope="module")
def batches(runtime_batches: SessionBatches) -> ModuleBatches:
    return runtime_batches.module("strategies")


@pytest.mark.parametrize("case", list(EQUAL))
def test_strategy_equals_single_process_reference(batches, case):
    world, args = EQUAL[case]
    result = batches[case]
    rec = check_against_reference(result.ok(), result.folder / "params", world, args.split())
    for key in ("step_time_s", "samples_per_s", "memory_allocated_gib", "step_times_s", "step_time_min_s"):
        assert key in rec
    assert rec["memory_measure"] == "cpu_peak_rss" and rec["backend"] == "gloo"
    assert rec["samples_per_s"] == pytest.approx(rec["global_batch"] / rec["step_time_s"])
    assert rec["global_batch"] == 4 * world * rec["config"]["grad_accum"]
    out = result.folder / "out"
    assert json.loads((out / f"{rec['run_id']}.json").read_text()) == rec
    rows = list(csv.DictReader(open(out / CSV_NAME)))
    assert len(rows) == 1 and rows[0]["run_id"] == rec["run_id"]


def test_bf16_reduction_differs_from_the_fp32_reduced_reference(batches):
    """The check of fp32 reduction tells it apart: bf16 parameters with gradients reduced in
    bf16 end farther from the fp32-reduced reference than its tolerance (1e-4; measured on
    tiny-gpt: 448 of 234,880 parameters, up to 1.2e-3, where fp32 reduction gives 0)."""
    result = batches["zero-bf16-reduce-bf16"]
    rec = result.ok()
    assert rec["config"]["reduce_dtype"] == "bf16"
    cfg = load_config(None, {"topology": "emu-2x2", **_overrides(BF16_REDUCED.split()), "reduce_dtype": "fp32"})
    ref = reference_run(cfg, 2, STEPS + WARMUP, data_batches=1)
    got = load_saved(str(result.folder / "params"))
    beyond = 0
    for name, want in ref["params"].items():
        beyond += int((got["params"][name] - want).abs().gt(1e-4 + 1e-4 * want.abs()).sum())
    assert beyond > 0, "bf16 reduction is within the fp32 reference's tolerance"


@pytest.mark.slow
def test_pipeline_x_zero2d_with_replicas_equals_reference(batches):
    """pp=2 stages of 4 ranks each sharded in groups of 2: mesh ("pp", "dp_replicate", "dp_shard")
    = (2, 2, 2); the replica all-reduce only at the accumulation boundary."""
    world, args = CASES[REPLICAS]
    result = batches[REPLICAS]
    check_against_reference(result.ok(), result.folder / "params", world, args)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(LOW_PRECISION))
def test_low_precision_runs_and_learns(batches, case):
    rec = batches[case].ok()
    assert rec["config"]["precision"] in ("bf16", "fp16")
    assert all(map(torch.isfinite, torch.tensor(rec["losses"])))
    assert rec["loss_last"] < rec["loss_first"] - 0.05


@pytest.mark.slow
def test_hf_vit_optional_extra_equals_reference(batches):
    """The seed's Hugging Face ViT (small config) under zero2d; skipped without transformers."""
    pytest.importorskip("transformers")
    result = batches["hf-vit"]
    check_against_reference(result.ok(), result.folder / "params", 4, HF_VIT.split())


@pytest.mark.parametrize("case", list(TIED))
def test_tied_embedding_pipeline_equals_reference(batches, case):
    """Tied embeddings over a pipeline (tiny-gpt's shape, tied): the last stage's copy
    (head.out.weight) ends equal to the first stage's embedding, parameters and gradients (their
    gradients summed between the two stages), and the model equals one process's, where the
    two are one parameter, within every strategy's tolerance (parameters 1e-4, gradients 1e-4
    relative + 1e-6, losses 1e-5 relative); with tensor parallelism within that of a tied model
    under TP (parameters 5e-4, gradients 1e-5 absolute: Adam's steps on re-associated near-zero
    gradients, `test_runtime_tensor_parallel`'s docstring)."""
    world, args = TIED[case]
    param_atol, grad_atol = (5e-4, 1e-5) if "tp" in case else (1e-4, 1e-6)
    result = batches[case]
    rec = result.ok()
    assert rec["loss_last"] < rec["loss_first"], rec["losses"]
    got = load_saved(str(result.folder / "params"))
    for kind in ("params", "grads"):
        copy = got[kind].pop("head.out.weight")
        torch.testing.assert_close(copy, got[kind]["embed.tok.weight"], msg=f"the last stage's copy ({kind})")
    opts = {"topology": "emu-2x2", "workload": TIED_GPT, "strategy": "pipeline", **_overrides(args.split())}
    cfg = load_config(None, opts)
    ref = reference_run(cfg, world, STEPS + WARMUP, data_batches=1)
    assert sorted(got["params"]) == sorted(ref["params"]) and sorted(got["grads"]) == sorted(ref["grads"])
    for name, want in ref["params"].items():
        torch.testing.assert_close(got["params"][name], want, rtol=1e-4, atol=param_atol, msg=name)
    for name, want in ref["grads"].items():
        torch.testing.assert_close(got["grads"][name], want, rtol=1e-4, atol=grad_atol, msg=name)
    assert rec["losses"] == pytest.approx(ref["losses"], rel=1e-5)


def test_expert_parallel_all_to_alls_are_the_configurations(batches):
    """tiny-moe (3 MoE layers of 4 experts, top-2; 4 samples of 32 tokens a rank, hidden 64, fp32)
    under ep 2 on 2 ranks, no recomputation: per MoE layer and step each rank issues one exchange of
    its per-expert token counts (4 int64) and four of token rows (dispatch and combine in forward,
    their reverses in backward). A rank sends all its routed rows, 4 x 32 x 2 of 64 floats, in the
    dispatch and in the combine's reverse; what it sends in the other two is what its experts
    received, which the routing decides: over both ranks, again all the rows. The run records the
    tokens each expert got, every step's summing to the routed rows of both ranks."""
    world, args = EQUAL[EP_TRACED]
    result = batches[EP_TRACED]
    rec = result.ok()
    layers, experts, routed = 3, 4, 4 * 32 * 2
    rows = routed * 64
    sent = []
    for rank in range(world):
        for step in load_rank_trace(result.folder / "trace", rank):
            a2a = [c for c in step if c.kind == "all_to_all"]
            assert all(c.group_size == 2 for c in a2a)
            counts = [c for c in a2a if c.itemsize == 8]
            assert [c.numel for c in counts] == [experts] * layers  # 32 bytes each
            data = [c for c in a2a if c.itemsize == 4]
            assert len(data) == 4 * layers
            assert sum(c.numel == rows for c in data) >= 2 * layers  # dispatch and combine's reverse: 32,768 bytes
            sent.append(sum(c.numel for c in data))
    steps = len(sent) // world
    assert [sum(sent[s::steps]) for s in range(steps)] == [4 * layers * world * rows] * steps
    assert len(rec["expert_tokens"]) == STEPS
    for step in rec["expert_tokens"]:
        assert [sum(layer) for layer in step] == [world * routed] * layers
    totals = torch.tensor(rec["expert_tokens"], dtype=torch.float64).sum(0)
    assert rec["expert_imbalance"] == pytest.approx((totals.max(1).values / totals.mean(1)).tolist())
