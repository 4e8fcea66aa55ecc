"""The training stack's settings run for real (torchrun, gloo, CPU) and compute what one process
computes with the same settings (`tests.reference`): the attention kernel (math, and eager: no
SDPA; flash is the default every other test runs; efficient is CUDA-only and refused here), the
optimizers torch has (AdamW, SGD with momentum, Adafactor), the masked-LM head, torch.compile
(Inductor compiles each block on the CPU). tf32 runs as fp32 on CPU (no TF32 there): nothing to
compare. They run in the session's torchrun launch of 2 ranks (`tests.runtime_batch`); each test
asserts its own configuration's record and saved tensors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_runtime_strategies import check_against_reference
from tests.runtime_batch import Cases, ModuleBatches, SessionBatches, register

TINY_BERT = "family: bert\nhidden: 64\nlayers: 2\nheads: 4\nseq_len: 32\nvocab: 256\n"


SETTINGS = {
    "ddp-math-attention": "--workload tiny-gpt --strategy ddp --attention math",
    "ddp-eager-attention": "--workload tiny-gpt --strategy ddp --attention eager",
    "zero-sgd": "--workload tiny-gpt --strategy zero --optimizer sgd",
    "zero-adamw-fused": "--workload tiny-gpt --strategy zero --optimizer adamw --optimizer-impl fused",
    "ddp-adafactor-accum2": "--workload tiny-gpt --strategy ddp --optimizer adafactor --grad-accum 2",
}
MLM = ["--strategy", "zero", "--mlm-fraction", "0.25"]  # after --workload tiny-bert.yaml
COMPILED = ["--workload", "tiny-gpt", "--strategy", "zero", "--compile"]


def _cases(folder: Path) -> Cases:
    """Every configuration (the masked LM's model a file in `folder`)."""
    model = folder / "tiny-bert.yaml"
    model.write_text(TINY_BERT)
    cases = {name: (2, args.split()) for name, args in SETTINGS.items()}
    return {**cases, "masked-lm": (2, ["--workload", str(model), *MLM]), "zero-compile": (2, COMPILED)}


register("stack", _cases)


@pytest.fixture(scope="module")
def batches(runtime_batches: SessionBatches) -> ModuleBatches:
    """The session's launch of 2 ranks runs them (`tests.runtime_batch`)."""
    return runtime_batches.module("stack")


@pytest.mark.parametrize("case", list(SETTINGS))
def test_stack_setting_equals_reference(batches, case):
    args = SETTINGS[case].split()
    result = batches[case]
    cfg = check_against_reference(result.ok(), result.folder / "params", 2, args)["config"]
    for flag, value in zip(args[::2], args[1::2], strict=True):
        key = flag.removeprefix("--").replace("-", "_")
        if key in ("attention", "optimizer", "optimizer_impl"):
            assert cfg[key] == value


def test_masked_lm_head_equals_reference(batches):
    result = batches["masked-lm"]
    model = batches.folder / "tiny-bert.yaml"
    rec = check_against_reference(result.ok(), result.folder / "params", 2, ["--workload", str(model), *MLM])
    assert rec["config"]["mlm_fraction"] == 0.25


def test_compiled_blocks_equal_reference(batches):
    result = batches["zero-compile"]
    rec = check_against_reference(result.ok(), result.folder / "params", 2, COMPILED)
    assert rec["config"]["compile"] is True
