"""The training stack's settings run for real (torchrun, gloo, CPU) and compute what one process
computes with the same settings (`tests.reference`): the attention kernel (math; flash is the
default every other test runs; efficient is CUDA-only and refused here), the optimizers torch
has (AdamW, SGD with momentum, Adafactor), the masked-LM head, torch.compile (slow: Inductor
compiles each block on the CPU). tf32 runs as fp32 on CPU (no TF32 there): nothing to compare."""

from __future__ import annotations

import pytest

from tests.integration.test_runtime_strategies import check_equals_reference

TINY_BERT = "family: bert\nhidden: 64\nlayers: 2\nheads: 4\nseq_len: 32\nvocab: 256\n"


@pytest.mark.parametrize(
    ("world", "args"),
    [
        (2, "--workload tiny-gpt --strategy ddp --attention math"),
        (2, "--workload tiny-gpt --strategy zero --optimizer sgd"),
        (2, "--workload tiny-gpt --strategy zero --optimizer adamw --optimizer-impl fused"),
        (2, "--workload tiny-gpt --strategy ddp --optimizer adafactor --grad-accum 2"),
    ],
    ids=["ddp-math-attention", "zero-sgd", "zero-adamw-fused", "ddp-adafactor-accum2"],
)
def test_stack_setting_equals_reference(tmp_path, world, args):
    rec = check_equals_reference(tmp_path, world, args.split())
    cfg = rec["config"]
    for flag, value in zip(args.split()[::2], args.split()[1::2], strict=True):
        key = flag.removeprefix("--").replace("-", "_")
        if key in ("attention", "optimizer", "optimizer_impl"):
            assert cfg[key] == value


def test_masked_lm_head_equals_reference(tmp_path):
    model = tmp_path / "tiny-bert.yaml"
    model.write_text(TINY_BERT)
    rec = check_equals_reference(
        tmp_path, 2, ["--workload", str(model), "--strategy", "zero", "--mlm-fraction", "0.25"]
    )
    assert rec["config"]["mlm_fraction"] == 0.25


@pytest.mark.slow
def test_compiled_blocks_equal_reference(tmp_path):
    rec = check_equals_reference(tmp_path, 2, ["--workload", "tiny-gpt", "--strategy", "zero", "--compile"])
    assert rec["config"]["compile"] is True
