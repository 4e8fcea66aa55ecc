"""Tokens and dollars (tokens/s per GPU, MFU's model FLOPs, $ per step and per million tokens),
the tie note, rates that never print 0.0, and the sweep's batch lists, batch search and the hint
when nothing fits (small and fast)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from shardsim.cli import main
from shardsim.config import RunConfig
from shardsim.core.errors import ConfigError
from shardsim.core.units import format_percent, format_rate, format_rate_unit
from shardsim.report.tables import versus
from shardsim.simulator.economics import MODEL_ERROR, model_flops_per_sample, sequence_length
from shardsim.simulator.model_error import step_error
from shardsim.simulator.predict import predict
from shardsim.simulator.results import TOKEN_COLUMNS
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import load_instance, make_cluster
from shardsim.sweep.batch import fits_at, largest_fitting
from shardsim.sweep.hints import required_gib
from shardsim.sweep.rows import upgrade_table
from shardsim.sweep.search import sweep
from shardsim.sweep.space import SweepSpace, batch_step, enumerate_configs

ROOT = Path(__file__).resolve().parents[2]
TINY = RunConfig(workload="tiny-gpt", topology="g4dn.12xlarge", nodes=2)


def test_model_flops_per_token_are_6n_plus_6lds_for_a_causal_model():
    """3 × the forward: 6 per matmul parameter (the LM head's included, the embedding lookup not)
    and 6·L·d·S of causal attention, counted here from the shape alone."""
    w = load_workload("tiny-gpt")
    a = w.arch
    h, f, L, S, V = a.hidden, a.ffn_size, a.layers, a.tokens, a.vocab
    matmul_params = L * (3 * h * h + h * h + 2 * h * f) + h * V
    assert model_flops_per_sample(w) / S == pytest.approx(6 * matmul_params + 6 * L * h * S, rel=1e-12)
    bert = load_workload("bert-large").arch  # bidirectional: 12·L·d·S
    wb = load_workload("bert-large")
    mm = 2 * (wb.fwd_flops - 4.0 * bert.tokens**2 * bert.hidden * bert.layers) / (2 * bert.tokens)
    assert model_flops_per_sample(wb) / bert.tokens == pytest.approx(
        3 * mm + 12 * bert.layers * bert.hidden * bert.tokens
    )


def test_a_prediction_has_tokens_mfu_and_dollars():
    cfg = RunConfig(workload="tiny-gpt", topology="p4d.24xlarge", nodes=2, precision="bf16", batch_per_device=2)
    p = predict(cfg)
    w = load_workload("tiny-gpt")
    seq = sequence_length(w)
    assert p.seq_len == seq == w.arch.tokens
    assert p.tokens_per_s_per_gpu == pytest.approx(p.samples_per_s * seq / p.world, rel=1e-12)
    price = make_cluster("p4d.24xlarge", 2).price_per_hour_usd
    assert p.cost_per_step_usd == pytest.approx(price * p.step_time_s / 3600, rel=1e-12)
    assert p.cost_per_million_tokens_usd == pytest.approx(p.cost_per_step_usd / (p.global_batch * seq) * 1e6)
    assert p.cost_per_million_samples_usd == pytest.approx(p.cost_per_step_usd / p.global_batch * 1e6)
    peak = load_instance("p4d.24xlarge").device.peak_tflops["bf16"]  # the A100's dense bf16 peak
    assert p.peak_tflops == peak
    assert p.mfu == pytest.approx(model_flops_per_sample(w) * p.global_batch / p.step_time_s / p.world / (peak * 1e12))
    assert p.mfu_formula == "6·N + 6·L·d·S per token"
    vit = predict(RunConfig(workload="tiny-vit", topology="g4dn.12xlarge", nodes=1))
    assert vit.seq_len is None and vit.tokens_per_s_per_gpu is None and vit.cost_per_million_tokens_usd is None


def test_predict_prints_the_sequence_tokens_and_cost(capsys):
    argv = ["predict", "--workload", "tiny-gpt", "--topology", "p4d.24xlarge", "--precision", "bf16"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"seq 32, global batch 32 \(1,024 tokens\)", out.splitlines()[0])
    assert "tokens/s per GPU" in out and "per million tokens" in out and "per step" in out
    peak = load_instance("p4d.24xlarge").device.peak_tflops["bf16"]
    assert f"of the bf16 dense peak ({peak:.1f} TFLOP/s), model FLOPs 6·N + 6·L·d·S per token" in out
    assert "0.0 " not in out and "0.0%" not in out  # tiny-gpt's MFU is far under 0.1 %
    assert main(["predict", "--topology", "p5e.48xlarge", "--precision", "bf16", "--workload", "tiny-gpt"]) == 0
    assert "p5e.48xlarge has no price" in capsys.readouterr().out


@pytest.mark.parametrize("x", [0.04, 0.004, 1e-7, 0.5, 2.5, 56.49, 1234.5, 3e7])
def test_a_rate_never_prints_as_zero(x):
    for text in (format_rate(x), format_rate_unit(x, "samples"), format_percent(x / 1000)):
        assert re.search(r"[1-9]", text), text
    assert format_rate(float("nan")) == "-"
    assert format_rate_unit(0.004, "samples") == "14.4 samples/h"
    assert format_rate(56.49) == "56.5"


def test_the_model_error_is_the_one_the_calibration_states():
    """MODEL_ERROR is the 5-fold cross-validated mean absolute error of experiments/calibration/README.md."""
    text = (ROOT / "experiments" / "calibration" / "README.md").read_text()
    row = re.search(r"^\| 5-fold CV \| ([0-9.]+) % \|", text, flags=re.M)
    assert row is not None
    assert MODEL_ERROR == pytest.approx(float(row[1]) / 100)


def test_a_margin_inside_the_model_error_is_a_tie_until_measured():
    old = {"mean_abs": MODEL_ERROR}  # a recommendation written before the error by device
    assert "stated error" in versus(MODEL_ERROR / 2, "x", old) and "stated error" not in versus(MODEL_ERROR * 1.5, "x")
    assert versus(0.0001, "x").startswith("tied")
    t4 = step_error("NVIDIA T4", "pytorch").to_dict()
    assert "±16.2% on NVIDIA T4, pytorch, not measured here: a tie until measured" in versus(0.15, "x", t4)
    assert "stated error" not in versus(0.17, "x", t4)
    r = sweep(TINY, SweepSpace(strategies=("ddp", "zero")), workers=1)  # on g4dn.12xlarge: T4s
    m, rec = r.recommendation["margin"], r.recommendation
    assert rec["model_error"] == t4 and not rec["model_error"]["measured"]  # never the A100's figure
    assert rec["margin_within_error"] == (m < t4["band_pct"] / 100)
    a100 = sweep(TINY.replace(topology="p4d.24xlarge", precision="bf16"), SweepSpace(strategies=("ddp",)), workers=1)
    assert a100.recommendation["model_error"] == step_error("NVIDIA A100 SXM4 40GB", "pytorch").to_dict()


def test_rows_carry_the_token_columns_and_a_table_without_them_reads():
    r = sweep(TINY, SweepSpace(strategies=("ddp", "zero")), workers=1)
    t = r.table
    assert list(t.columns[-len(TOKEN_COLUMNS) :]) == list(TOKEN_COLUMNS)
    assert (t["seq_len"] == 32).all()
    assert t["tokens_per_s_per_gpu"].to_numpy() == pytest.approx((t["samples_per_s"] * 32 / t["world"]).to_numpy())
    old = t.drop(columns=list(TOKEN_COLUMNS))
    up = upgrade_table(old)
    assert set(TOKEN_COLUMNS) <= set(up.columns)
    assert up["cost_per_step_usd"].to_numpy() == pytest.approx(t["cost_per_step_usd"].to_numpy())
    assert up["tokens_per_s_per_gpu"].isna().all()  # the sequence is not in an old table


def test_largest_fitting_doubles_then_bisects():
    for n in (1, 2, 7, 64, 1000):
        cands = range(1, n + 1)
        for limit in (0, 1, 3, n // 2, n):
            calls: list[int] = []

            def fits(b: int, limit=limit, calls=calls) -> bool:
                calls.append(b)
                return b <= limit

            assert largest_fitting(cands, fits) == (min(limit, n) if limit >= 1 else None)
            assert len(calls) <= 2 * math.log2(n) + 2
            assert calls[:3] == [1, 2, 4][: len(calls[:3])] or limit < 4  # doubling first


def test_batch_lists_multiply_the_space_and_name_the_rows():
    space = SweepSpace(strategies=("ddp", "zero"), tp_degrees=(1,), batch_sizes=(2, 4), grad_accums=(1, 2))
    en = enumerate_configs(TINY.replace(batch_per_device=2), space)
    pairs = [(c.cfg.strategy.kind, c.cfg.batch_per_device, c.cfg.grad_accum) for c in en.candidates]
    assert sorted(pairs) == sorted((k, b, g) for k in ("ddp", "zero") for b in (2, 4) for g in (1, 2))
    labels = [c.label for c in en.candidates]
    assert len(set(labels)) == len(labels) and "zero, batch 4, ga 2" in labels and "ddp" in labels


def test_a_fixed_global_batch_composes_with_the_lists_and_tp():
    base = TINY.replace(nodes=1)  # 4 T4s
    gb = 16

    def pairs(**kw):
        en = enumerate_configs(base, SweepSpace(strategies=("ddp",), global_batch=gb, **kw))
        return {(c.cfg.strategy.tp, c.cfg.batch_per_device, c.cfg.grad_accum) for c in en.candidates}

    for tp, b, ga in pairs(grad_accums=(1, 2), tp_degrees=(1, 2)):
        assert b * ga * (4 // tp) == gb
    assert pairs(grad_accums=(1, 2), tp_degrees=(1,)) == {(1, 4, 1), (1, 2, 2)}
    assert pairs(batch_sizes=(1, 2, 8), tp_degrees=(1,)) == {(1, 1, 4), (1, 2, 2)}  # 8 x 4 ranks > 16
    assert pairs(batch_sizes=(1, 2, 4), grad_accums=(1, 2), tp_degrees=(1,)) == {(1, 4, 1), (1, 2, 2)}


def test_the_batch_search_finds_the_largest_that_fits():
    """Each row at the largest batch that fits (the next does not), by the memory model."""
    base = RunConfig(workload="llama-3.1-8b", topology="p4d.24xlarge", nodes=1, precision="bf16", checkpointing="full")
    base = base.replace(shape={"seq_len": 2048})
    space = SweepSpace(strategies=("zero", "pipeline"), degrees=(4,), tp_degrees=(1,), pp=(2,), max_batch=256)
    en = enumerate_configs(base, space)
    w = load_workload(base.workload, base.shape)
    assert len(en.candidates) == 7  # zero, and 2 schedules x 3 microbatch counts
    found = []
    for c in en.candidates:
        b, step = c.cfg.batch_per_device, batch_step(c.cfg)  # a pipeline's batch: a multiple of m / gcd(m, pp)
        assert b % step == 0 and step <= b < 256
        if fits_at(c.cfg, c.cluster, w):
            assert not fits_at(c.cfg.replace(batch_per_device=b + step), c.cluster, w)
            found.append(b)
        else:  # none fits: the row is at the smallest batch tried, and says so (fits false)
            assert b == step
    assert len(found) >= 4 and max(found) > 8
    gb = enumerate_configs(base, SweepSpace(strategies=("zero",), tp_degrees=(1,), max_batch=256, global_batch=64))
    (c,) = gb.candidates
    assert c.cfg.batch_per_device * c.cfg.grad_accum * 8 == 64
    assert fits_at(c.cfg, c.cluster, w)
    with pytest.raises(ConfigError, match="max_batch"):
        SweepSpace(max_batch=8, batch_sizes=(2, 4))


def test_nothing_fits_gives_a_hint_computed_from_the_memory_model():
    base = RunConfig(workload="llama-3.1-70b", topology="p4d.24xlarge", nodes=1, precision="bf16", batch_per_device=1)
    base = base.replace(checkpointing="full")
    r = sweep(base, SweepSpace(strategies=("zero",), tp_degrees=(1,)), workers=1)
    assert r.recommendation.best is None
    hint = r.recommendation["hint"]
    m = re.search(r"(\d+) nodes \(", hint)
    assert m, hint
    n = int(m[1])
    w = load_workload("llama-3.1-70b")
    dev = make_cluster("p4d.24xlarge", 1).instance.device.memory_gib
    assert required_gib(base.replace(nodes=n), make_cluster("p4d.24xlarge", n), w) <= dev
    assert required_gib(base.replace(nodes=n - 1), make_cluster("p4d.24xlarge", n - 1), w) > dev


def test_the_cli_takes_batch_lists_and_refuses_a_search_beside_them(capsys):
    argv = ["sweep", "--workload", "tiny-gpt", "--topology", "g4dn.12xlarge", "--nodes", "1", "--strategies", "ddp"]
    assert main([*argv, "--batch-per-device", "4,8", "--grad-accum", "1,2", "--tp-degrees", "1"]) == 0
    out = capsys.readouterr().out
    assert "ddp, batch 8, ga 2" in out and "micro×ga" in out and "tok/s/GPU" in out and "MFU" in out
    assert "These rows run different global batches (16, 32, 64), as the batch axes asked" in " ".join(out.split())
    assert "seq 32" in out.splitlines()[0]
    assert main([*argv, "--batch-per-device", "4,8", "--max-batch", "64"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "max_batch" in err
