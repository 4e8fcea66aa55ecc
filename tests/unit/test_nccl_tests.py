"""nccl-tests output read (`network.nccl_tests`), a size sweep in nccl-tests' columns, and
`shardsim collective --compare` against the calibration CSV and a synthetic fixture."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from shardsim.core.errors import ConfigError
from shardsim.simulator.calibration.apply import read_calibration
from shardsim.simulator.collective import compare_collective, nccl_tests_row, simulate_collective
from shardsim.simulator.network.collectives import BUS_FACTOR
from shardsim.simulator.network.nccl_tests import (
    CSV_COLUMNS,
    NCCL_TESTS_BYTES,
    NCCL_TESTS_ROWS,
    dropped_line,
    read_nccl_tests,
    read_nccl_tests_sections,
)
from shardsim.specs.hardware.topology import make_cluster
from tests.nccl_logs import DOUBLING, Section, log, row
from tests.unit.test_flag_bounds import exit_status, refused

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "all_gather_perf-synthetic-2x4.txt"
CALIBRATION = ROOT / "experiments" / "calibration" / "data" / "nccl-all-reduce-p5-2node.csv"


def test_the_text_fixture_gives_its_collective_ranks_nodes_and_rows() -> None:
    m = read_nccl_tests(FIXTURE)
    assert (m.collective, m.ranks, m.nodes) == ("all_gather", 8, 2)
    table = [line.split() for line in FIXTURE.read_text().splitlines() if line.strip()[:1].isdigit()]
    assert [r.size_bytes for r in m.rows] == [int(f[0]) for f in table]
    assert [(r.time_us, r.busbw_GBps, r.inplace_time_us) for r in m.rows] == [
        (float(f[5]), float(f[7]), float(f[9])) for f in table
    ]
    assert {(r.type, r.redop, r.root) for r in m.rows} == {("float", "none", -1)}
    assert m.avg_busbw_GBps == pytest.approx(sum(r.busbw_GBps for r in m.rows) / len(m.rows), abs=0.01)


def test_the_collective_is_implied_by_the_table_when_the_name_does_not_say_it(tmp_path) -> None:
    text = FIXTURE.read_text()
    unnamed = tmp_path / "run.log"
    unnamed.write_text(text)
    assert read_nccl_tests(unnamed).collective == "all_gather"  # a count per rank, no reduction
    unnamed.write_text(text.replace("    none", "     sum"))
    assert read_nccl_tests(unnamed).collective == "reduce_scatter"
    assert read_nccl_tests(unnamed, "all_reduce").collective == "all_reduce"  # given wins


def test_the_calibration_csv_reads_into_the_same_result() -> None:
    m = read_nccl_tests(CALIBRATION)
    assert (m.collective, m.ranks, m.nodes, len(m.rows)) == ("all_reduce", None, None, 32)
    lines = CALIBRATION.read_text().splitlines()
    assert tuple(lines[0].split(",")) == CSV_COLUMNS
    last = lines[-1].split(",")
    assert (m.rows[-1].size_bytes, m.rows[-1].busbw_GBps) == (int(last[0]), float(last[3]))


@pytest.mark.parametrize(
    ("edit", "line", "words"),
    [
        (lambda t: t.replace("  float  ", "  flot   ", 1), 20, "type 'flot'"),
        (lambda t: t.replace("        4096   ", "        40x6   ", 1), 21, "size '40x6'"),
        (lambda t: t.replace("     0    29.42", "     3    29.42", 1), 20, "wrong values"),
        (lambda t: t.replace("# Out of bounds", "Warning: something else\n# Out of bounds", 1), 30, "fields"),
    ],
)
def test_a_malformed_line_is_one_error_naming_file_and_line(tmp_path, edit, line, words) -> None:
    bad = tmp_path / "all_gather_perf.log"
    bad.write_text(edit(FIXTURE.read_text()))
    with pytest.raises(ConfigError) as e:
        read_nccl_tests(bad)
    assert str(e.value).startswith(f"{bad}:{line}: ") and words in str(e.value) and "\n" not in str(e.value)


def test_a_malformed_csv_row_names_its_line(tmp_path) -> None:
    bad = tmp_path / "nccl-all-reduce.csv"
    lines = CALIBRATION.read_text().splitlines()
    lines[5] = lines[5].replace(",", ";", 1)
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=rf"^{bad}:6: expected 7 values"):
        read_nccl_tests(bad)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_a_sweep_row_is_nccl_tests_columns_with_its_bus_factor(op) -> None:
    c = make_cluster("p5.48xlarge", 2)
    r = simulate_collective(c, op, 64 << 20, "auto")
    row = nccl_tests_row(r)
    per_rank = op in ("all_gather", "reduce_scatter")
    assert row["count"] == (64 << 20) // 4 // (16 if per_rank else 1)
    assert row["redop"] == ("sum" if op in ("all_reduce", "reduce_scatter") else "none")
    assert row["root"] == (0 if op == "broadcast" else -1)
    assert row["algbw_GBps"] == pytest.approx((64 << 20) / r.time_s / 1e9)
    assert row["busbw_GBps"] / row["algbw_GBps"] == pytest.approx(
        {"all_reduce": 30 / 16}.get(op, 15 / 16 if per_rank else 1)
    )
    assert BUS_FACTOR[op](16) == pytest.approx(row["busbw_GBps"] / row["algbw_GBps"])


def test_the_size_sweep_prints_a_row_per_doubling_with_its_algorithm(capsys) -> None:
    argv = ["collective", "--topology", "p5.48xlarge", "--nodes", "2", "--sizes", "8B:16GiB", "--json"]
    assert exit_status(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["size_bytes"] for r in doc["rows"]] == [8 << k for k in range(32)]
    assert doc["ranks"] == 16 and {r["algo"] for r in doc["rows"]} <= {"ring", "tree", "nvls", "nvls_tree"}
    assert {r["protocol"] for r in doc["rows"]} <= {"LL", "LL128", "Simple"}
    one = simulate_collective(make_cluster("p5.48xlarge", 2), "all_reduce", 1 << 30, "auto")
    assert doc["rows"][27] == nccl_tests_row(one)
    assert exit_status(argv[:-3] + ["--sizes", "1MiB,64MiB,1GiB"]) == 0
    text = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in text if not line.startswith("#")]
    assert [int(f[0]) for f in rows] == [1 << 20, 64 << 20, 1 << 30] and all(len(f) == 9 for f in rows)
    assert text[-1].startswith("# Avg bus bandwidth")


def test_compare_on_the_calibration_csv(capsys) -> None:
    argv = ["collective", "--topology", "p5.48xlarge", "--nodes", "2", "--compare", str(CALIBRATION), "--json"]
    assert exit_status(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (len(doc["rows"]), doc["op"], doc["ranks"]) == (32, "all_reduce", 16)
    assert set(doc["summary"]) == {
        "sizes",
        "mean_abs_busbw_error_pct_from_1MiB",
        "max_abs_busbw_error_pct_from_1MiB",
        "mean_abs_time_error_pct_below_1MiB",
        "max_abs_time_error_pct_below_1MiB",
    }
    big = [r for r in doc["rows"] if r["size_bytes"] >= 1 << 20]
    assert len(big) == 15  # 1 MiB to 16 GiB
    mean = sum(abs(r["predicted_busbw_GBps"] / r["measured_busbw_GBps"] - 1) * 100 for r in big) / len(big)
    assert doc["summary"]["mean_abs_busbw_error_pct_from_1MiB"] == pytest.approx(mean)
    assert doc == compare_collective(make_cluster("p5.48xlarge", 2), read_nccl_tests(CALIBRATION)) | {
        "file": str(CALIBRATION)
    }


def test_compare_draws_its_plot(tmp_path, capsys) -> None:
    out = tmp_path / "cmp.png"
    argv = ["collective", "--topology", "g4dn.12xlarge", "--compare", str(FIXTURE), "--plot", str(out)]
    assert exit_status(argv) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "10 sizes;" in capsys.readouterr().out  # nodes taken from the file's Rank lines


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--topology", "p5.48xlarge", "--compare", str(FIXTURE)], "8 ranks on 2 nodes"),
        (["--topology", "g4dn.12xlarge", "--nodes", "3", "--compare", str(FIXTURE)], "measured on 2 nodes"),
        (["--compare", "/nonexistent/all_reduce_perf.log"], "cannot read"),
        (["--compare", str(CALIBRATION), "--sizes", "1MiB"], "not allowed with"),
        (["--plot", "x.png"], "--compare"),
        (["--compare", str(CALIBRATION), "--ranks", "8"], "leave out --ranks"),
        (["--topology", "p5.48xlarge", "--nodes", "2", "--compare", str(CALIBRATION), "--plot", "/"], "is a folder"),
        (["--sizes", "1GiB:1MiB"], "FROM <= TO"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, args, words) -> None:
    assert words in refused(capsys, ["collective", *args])


def test_a_starting_line_names_the_collective_and_a_root_makes_a_broadcast(tmp_path) -> None:
    text = FIXTURE.read_text()
    f = tmp_path / "run.log"
    f.write_text("# Collective test starting: reduce_scatter_perf\n" + text.replace("    none", "     sum"))
    assert read_nccl_tests(f).collective == "reduce_scatter"
    f.write_text(text.replace("    none      -1", "    none       0"))
    assert read_nccl_tests(f).collective == "broadcast"
    f.write_text(text.replace("  float  ", "  weird  "))
    with pytest.raises(ConfigError, match=r"type 'weird'"):
        read_nccl_tests(f)


def test_a_size_of_zero_is_dropped_and_named(tmp_path, capsys) -> None:
    zero = (
        "  ".join(["0", "0", "float", "none", "-1", "0.10", "0.00", "0.00", "0"] + ["0.10", "0.00", "0.00", "0"]) + "\n"
    )
    lines = FIXTURE.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.strip()[:1].isdigit())
    f = tmp_path / "all_gather_perf.log"
    f.write_text("".join(lines[:first] + [zero] + lines[first:]))
    m = read_nccl_tests(f)
    assert len(m.rows) == 10 and m.rows[0].size_bytes == 1024 and m.read == 11
    assert dropped_line([m]) == f"{f}: dropped 1 row of 11: size 0 B (size 0: nothing moves, line {first + 1})"
    assert exit_status(["collective", "--topology", "g4dn.12xlarge", "--compare", str(f)]) == 0
    out, err = capsys.readouterr()
    assert "# 10 sizes;" in out and err == dropped_line([m]) + "\n"


# --- sections, dropped rows, nodes, bounds -------------------------------------------------------------------

MIXED = (Section("all_reduce", DOUBLING), Section("all_gather", DOUBLING))
G4 = ["--topology", "g4dn.12xlarge"]  # 4 devices a node: the sections' 8 ranks on 2 nodes


@pytest.mark.parametrize("starting", [True, False], ids=["starting-lines", "tables-only"])
def test_each_section_keeps_its_collective_and_ranks(tmp_path, starting) -> None:
    f = tmp_path / "run.log"
    f.write_text(log(*(replace(s, starting=starting) for s in MIXED), Section("all_gather", (1024,), ranks=4, nodes=1)))
    sections = read_nccl_tests_sections(f)
    assert [(s.collective, s.ranks, s.nodes, len(s.rows)) for s in sections] == [
        ("all_reduce", 8, 2, 10),
        ("all_gather", 8, 2, 10),
        ("all_gather", 4, 1, 1),
    ]
    assert [r.size_bytes for r in sections[1].rows] == list(DOUBLING)
    with pytest.raises(ConfigError, match=r"3 sections of different collectives or ranks \(all_reduce, 8 ranks on 2"):
        read_nccl_tests(f)
    with pytest.raises(ConfigError, match=r"no broadcast section \(all_reduce"):
        read_nccl_tests(f, "broadcast")
    assert read_nccl_tests(f, "all_reduce") == replace(sections[0])


def test_sections_of_one_collective_read_as_one(tmp_path) -> None:
    f = tmp_path / "all_reduce_perf.log"
    f.write_text(log(Section("all_reduce", DOUBLING[:4]), Section("all_reduce", DOUBLING[4:])))
    m = read_nccl_tests(f)
    assert (m.collective, m.ranks, m.nodes, [r.size_bytes for r in m.rows]) == ("all_reduce", 8, 2, list(DOUBLING))


def test_compare_of_a_mixed_file_is_refused_in_one_line_or_takes_its_op(tmp_path, capsys) -> None:
    f = tmp_path / "run.log"
    f.write_text(log(*MIXED))
    err = refused(capsys, ["collective", "--topology", "g4dn.12xlarge", "--compare", str(f)])
    assert "all_reduce, 8 ranks on 2 nodes (line 1); all_gather, 8 ranks on 2 nodes (line 27)" in err, err
    assert exit_status(["collective", *G4, "--compare", str(f), "--op", "all_gather", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["op"] == "all_gather" and len(doc["rows"]) == 10


def test_calibrate_keeps_each_section_with_its_collective(tmp_path, capsys) -> None:
    f = tmp_path / "run.log"
    f.write_text(log(*MIXED))
    out = tmp_path / "cal.yaml"
    argv = ["calibrate", *G4, "--nccl-tests", str(f), "--folds", "0", "--force", "--out", str(out)]
    assert exit_status(argv) == 0, capsys.readouterr()
    stdout = capsys.readouterr().out
    assert "20 collective sizes" in stdout and "all_reduce 1.00 KiB" in stdout and "all_gather 1.00 KiB" in stdout
    files = read_calibration(out).fitted_to["nccl_tests"]
    assert [(e["op"], e["rows"]) for e in files] == [("all_reduce", 10), ("all_gather", 10)]


def test_rows_with_no_time_are_dropped_and_named_in_one_line(tmp_path, capsys) -> None:
    f = tmp_path / "all_gather_perf.log"
    f.write_text(log(Section("all_gather", (8, *DOUBLING), times=((8, "0.00"), (1024, "nan"), (4096, "-1.5")))))
    m = read_nccl_tests(f)
    assert [r.size_bytes for r in m.rows] == list(DOUBLING[2:])
    assert [(d.size_bytes, d.why) for d in m.dropped] == [(8, "time 0"), (1024, "time 'nan'"), (4096, "time '-1.5'")]
    argv = ["calibrate", "--topology", "g4dn.12xlarge", "--nccl-tests", str(f), "--folds", "0"]
    assert exit_status(argv) == 0
    out, err = capsys.readouterr()
    assert "8 collective sizes" in out
    named = "size 8 B (time 0, line 14), size 1024 B (time 'nan', line 15), size 4096 B (time '-1.5', line 16)"
    assert err == f"{f}: dropped 3 rows of 11: {named}\n"


def test_compare_of_a_file_that_names_no_nodes_needs_nodes(capsys) -> None:
    err = refused(capsys, ["collective", "--topology", "p5.48xlarge", "--compare", str(CALIBRATION)])
    assert "names no ranks or nodes" in err and "(--nodes)" in err, err
    argv = ["calibrate", "--topology", "p5.48xlarge", "--nccl-tests", str(CALIBRATION)]
    assert "(--nodes)" in refused(capsys, argv)


def test_a_file_beyond_the_row_bound_is_refused_at_its_first_row_beyond(tmp_path, capsys) -> None:
    f = tmp_path / "all_reduce_perf.log"
    head = log(Section("all_reduce", (1024,)))
    body = "".join(row("all_reduce", 1024 << (k % 20), 8) + "\n" for k in range(23_000_000 // 103))
    f.write_text(head + body)
    assert f.stat().st_size > 23_000_000
    for argv in (
        ["collective", "--topology", "g4dn.12xlarge", "--compare", str(f)],
        ["calibrate", "--topology", "g4dn.12xlarge", "--nccl-tests", str(f)],
    ):
        err = refused(capsys, argv)
        assert f"more than {NCCL_TESTS_ROWS:,} result rows" in err, err


def test_a_file_beyond_the_byte_bound_is_refused_unread(tmp_path, capsys) -> None:
    f = tmp_path / "all_reduce_perf.log"
    with open(f, "wb") as out:
        out.truncate(NCCL_TESTS_BYTES + 1)  # sparse: no disk written
    err = refused(capsys, ["collective", "--topology", "g4dn.12xlarge", "--compare", str(f)])
    assert f"larger than {NCCL_TESTS_BYTES >> 20} MiB" in err, err


@pytest.mark.parametrize(
    ("sizes", "words"),
    [
        ("1KiB,,2KiB", "empty element (item 2)"),
        ("1KiB,", "empty element (item 2)"),
        (",", "empty element (item 1)"),
        ("1.5B,2KiB", "whole number of bytes"),
        ("0.5B:1KiB", "whole number of bytes"),
    ],
)
def test_a_size_list_with_an_empty_or_fractional_size_is_refused(capsys, sizes, words) -> None:
    assert words in refused(capsys, ["collective", "--sizes", sizes])


def test_a_fraction_of_a_unit_that_is_whole_bytes_is_a_size(capsys) -> None:
    assert exit_status(["collective", "--sizes", "0.5KiB,1KiB", "--json"]) == 0
    assert [r["size_bytes"] for r in json.loads(capsys.readouterr().out)["rows"]] == [512, 1024]
