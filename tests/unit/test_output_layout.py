"""What predict and sweep print fits the width (COLUMNS, the terminal's, or no limit when piped),
says what a narrow table left out, gives times in units that suit them, and calls a tie a tie."""

from __future__ import annotations

import json
import re

import pytest

from shardsim.cli import main
from shardsim.config import RunConfig, Strategy
from shardsim.core.errors import ConfigError
from shardsim.core.units import GIB, format_bytes, format_count, format_seconds, parse_size
from shardsim.report.tables import _recommendation_lines
from shardsim.simulator.predict import predict

SWEEP = ["sweep", "--strategies", "ddp,zero2d", "--degrees", "4,8", "--workers", "1", "--no-progress"]
TINY = ["--workload", "tiny-gpt", "--topology", "emu-2x2", "--backend", "gloo"]


def _cut_short(text: str) -> list[str]:
    """Lines with a cell cut short by an ellipsis (not the "… N more rows" line, not a list's "…")."""
    return [line for line in text.splitlines() if "…" in line and not line.startswith("…") and ", …" not in line]


def _out(capsys, argv: list[str]) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0 s"),
        (2.0644, "2.064 s"),
        (0.575626, "575.6 ms"),
        (0.0023041, "2.304 ms"),
        (1.23e-5, "12.30 µs"),
        (4.5e-8, "45.00 ns"),
        (0.99997, "1.000 s"),  # rounds up into the larger unit, never "1000.0 ms"
        (99.996, "100.0 s"),
        (1234.5, "1234 s"),
        (float("nan"), "-"),
    ],
)
def test_a_time_is_given_in_the_unit_that_suits_it(seconds, text):
    assert format_seconds(seconds) == text


@pytest.mark.parametrize(
    ("fmt", "value", "text"),
    [
        (format_seconds, 99_999, "99999 s"),
        (format_seconds, 123_456, "1.235e+05 s"),  # beyond a day: 4 significant digits, not 300
        (format_seconds, 1e300, "1.000e+300 s"),
        (format_seconds, 1e-300, "1.000e-300 s"),
        (format_seconds, float("inf"), "inf s"),
        (format_bytes, 2**50, "1024.00 TiB"),
        (format_bytes, 1e300, "9.095e+287 TiB"),
        (format_count, 1e300, "1.000e+285 P"),
        (format_count, float("inf"), "inf"),
    ],
)
def test_extreme_values_print_compactly(fmt, value, text):
    assert fmt(value) == text


def test_a_collective_prints_strict_json_and_compact_figures(capsys):
    """JSON has no Infinity: the output parses strictly; the largest size prints in short lines."""
    assert main(["collective", "--ranks", "2", "--size", "8B", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert doc["ranks"] == 2 and doc["time_s"] > 0
    assert main(["collective", "--size", "1TiB"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) < 120


def test_a_size_that_is_not_finite_is_refused():
    with pytest.raises(ConfigError, match="expected a finite size"):
        parse_size("1e309")


def test_the_sweep_table_fits_80_columns_and_says_what_it_left_out(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = _out(capsys, SWEEP)
    assert max(map(len, text.splitlines())) <= 80
    assert "exp. comm" not in text and not _cut_short(text)
    assert "left out to fit 80 columns: --wide shows them" in " ".join(text.split())
    assert "zero2d d=4" in text and "zero2d d=8" in text and "ddp" in text


def test_wide_shows_every_column_whatever_the_width(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = _out(capsys, [*SWEEP, "--wide"])
    assert "exp. comm" in text and "left out" not in text


def test_piped_without_columns_the_table_has_every_column_on_one_line_a_row(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = _out(capsys, [*SWEEP, "--tp", "1"])  # three rows: ddp, zero2d d=4, d=8
    assert "exp. comm" in text and "left out" not in text
    rows = [line for line in text.splitlines() if re.match(r"^│ \d", line)]
    assert len(rows) == 3 and all("GiB" in r and ("$" in r or "✗" in r) for r in rows)


def test_columns_wide_enough_keeps_the_breakdown(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    text = _out(capsys, SWEEP)
    assert "exp. comm" in text and max(map(len, text.splitlines())) <= 200


def test_a_multi_cluster_sweep_fits_80_columns_without_cutting_a_cell(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    argv = [*SWEEP, "--workload", "gpt-10b", "--topology", "p4d.24xlarge,p3dn.24xlarge", "--nodes", "4,8", "--tp", "1"]
    text = _out(capsys, [*argv, "--precision", "fp16", "--batch-per-device", "2", "--top", "5"])
    assert max(map(len, text.splitlines())) <= 80
    unfit = predict(
        RunConfig(workload="gpt-10b", topology="p4d.24xlarge", nodes=4, precision="fp16", batch_per_device=2,
                  strategy=Strategy("zero2d", degree=4))
    )  # fmt: skip
    assert not unfit.fits
    needed, has = (format_bytes(g * GIB) for g in (unfit.memory_required_gib, unfit.device_memory_gib))
    assert f"{needed} > {has} ✗" in text  # figures whole; a long name may fold
    # costs whole: $ per million tokens in the tables (a text model), per million samples in the cheapest line
    assert re.search(r"\$\d+\.\d\d\s*$", text, flags=re.M) and re.search(r"\$[\d,]+\.\d\d per million", text)
    assert not _cut_short(text) and "p3dn.24xlarge" in text


def test_a_tiny_workload_shows_its_breakdown_in_units_that_suit_it(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = _out(capsys, ["sweep", *TINY, "--strategies", "zero", "--workers", "1", "--no-progress"])
    row = next(line for line in text.splitlines() if re.match(r"^│ 1 ", line))
    assert "0.000" not in row and re.search(r"\d ms", row) and "KiB" in row or "MiB" in row


def test_predict_fits_80_columns_and_gives_tiny_figures_in_suitable_units(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = _out(capsys, ["predict", *TINY])
    assert max(map(len, text.splitlines())) <= 80
    assert not re.search(r"(?<![\d.])0\.00 ", text) and " ms" in text and "iB" in text and "GFLOP/s" in text
    monkeypatch.delenv("COLUMNS")
    assert len(_out(capsys, ["predict", *TINY]).splitlines()) == 7  # piped: one line a figure


def _rec(margin: float, sdp_margin: float) -> dict:
    def row(label: str, kind: str) -> dict:
        return {"label": label, "strategy": {"kind": kind}, "step_time_s": 1.0, "samples_per_s": 10.0, "nodes": 1}

    return {
        "best": row("zero2d d=2", "zero2d"),
        "runner_up": row("zero", "zero"),
        "margin": margin,
        "sdp": row("zero2d d=2", "zero2d"),
        "sdp_runner_up": row("zero", "zero"),
        "sdp_margin": sdp_margin,
        "sharded_data_parallel_degree": 2,
    }


def test_one_rule_for_a_tie_in_every_line():
    lines = _recommendation_lines(_rec(0.0002, 0.0002), multi=False)
    assert all("tied (within 0.1%) with" in line for line in lines)
    assert not any("0.0% faster" in line for line in lines)
    lines = _recommendation_lines(_rec(0.012, 0.012), multi=False)
    assert all("1.2% faster than" in line for line in lines)


@pytest.mark.parametrize("command", ["workloads", "topologies"])
def test_the_listings_fit_80_columns_without_cutting_a_cell(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "80")
    text = _out(capsys, [command])
    assert max(map(len, text.splitlines())) <= 80 and not _cut_short(text)
    assert ("llama-3.1-405b" in text) if command == "workloads" else ("p5.48xlarge" in text)


@pytest.mark.parametrize("columns", ["40", "24"])
def test_a_narrow_width_never_cuts_a_cell(capsys, monkeypatch, columns):
    """Narrower than the table's figures: the table keeps every cell whole (its lines run past
    the width) rather than print `10.19 m` for 10.19 ms or `ste` for step."""
    from shardsim.core.units import GIB

    monkeypatch.delenv("COLUMNS", raising=False)
    rows = json.loads(_out(capsys, [*SWEEP, "--json"]))["rows"]
    monkeypatch.setenv("COLUMNS", columns)
    words = _out(capsys, SWEEP).split()
    for r in rows:
        if not r["fits"]:  # not simulated: its memory alone
            assert format_bytes(r["memory_required_gib"] * GIB) in " ".join(words)
            continue
        cells = [
            format_seconds(r["step_time_s"]),
            f"{r['samples_per_s']:.1f}",
            format_bytes(r["memory_required_gib"] * GIB),
        ]
        for cell in cells:
            assert " ".join(words).count(cell), f"{cell} cut short at {columns} columns"
        assert f"${r['cost_per_million_samples_usd']:,.2f}" in words
    for header in ("#", "step", "samples/s", "mem/rank", "$/M", "samples"):
        assert header in words, f"header {header!r} cut short at {columns} columns"


@pytest.mark.parametrize("command", ["topologies", "workloads"])
def test_the_listings_never_cut_a_cell_either(capsys, monkeypatch, command):
    monkeypatch.delenv("COLUMNS", raising=False)
    whole = {word for word in _out(capsys, [command]).split() if not set(word) <= set("│─┃━┏┓┗┛┡┩└┘┳┻╇┴┬")}
    monkeypatch.setenv("COLUMNS", "30")
    narrow = set(_out(capsys, [command]).split())
    assert not whole - narrow, f"cut short at 30 columns: {sorted(whole - narrow)[:5]}"


def test_a_collective_chooses_its_algorithm_as_predict_does_and_says_which(capsys):
    """`auto` by default, as predict's plans choose (`network.collectives.algo_for`: NCCL's tuner), and
    the algorithm and protocol used are in the text and the JSON."""
    from shardsim.simulator.network.collectives import GroupLayout, algo_for
    from shardsim.simulator.network.links import build_links
    from shardsim.specs.hardware.topology import make_cluster

    def chosen(*args: str) -> dict:
        assert main(["collective", "--topology", "p4d.24xlarge", *args, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    g = build_links(make_cluster("p4d.24xlarge", 2))
    expected = algo_for("all_reduce", "auto", GroupLayout(0, 16, 16), 8, "nccl", g, float(2**30))
    assert chosen("--nodes", "1", "--size", "1GiB")["algo"] == "ring"
    forced = ["--algo", expected.name, "--protocol", expected.proto]
    assert chosen("--nodes", "2", "--size", "1GiB") == chosen("--nodes", "2", "--size", "1GiB", *forced)
    doc = chosen("--nodes", "2", "--size", "1GiB")
    assert (doc["algo"], doc["protocol"]) == (expected.name, expected.proto)
    assert main(["collective", "--topology", "p4d.24xlarge", "--nodes", "2"]) == 0
    assert f"({expected}, nccl)" in capsys.readouterr().out


def test_a_collective_refuses_nccl_on_cpus_as_predict_does(capsys):
    assert main(["collective", "--topology", "emu-2x2", "--ranks", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'backend': nccl needs GPUs" in err
    assert main(["collective", "--topology", "emu-2x2", "--ranks", "3", "--backend", "gloo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "gloo"
