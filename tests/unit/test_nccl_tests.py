"""nccl-tests output read (`network.nccl_tests`), a size sweep in nccl-tests' columns, and
`shardsim collective --compare` against the calibration CSV and a synthetic fixture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardsim.core.errors import ConfigError
from shardsim.simulator.collective import compare_collective, nccl_tests_row, simulate_collective
from shardsim.simulator.hardware.topology import make_cluster
from shardsim.simulator.network.collectives import BUS_FACTOR
from shardsim.simulator.network.nccl_tests import CSV_COLUMNS, read_nccl_tests
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
        (lambda t: t.replace("30.08", "30.0x", 1), 21, "time '30.0x'"),
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


def test_a_size_of_zero_is_read_and_left_out_of_the_comparison(tmp_path) -> None:
    zero = (
        "  ".join(["0", "0", "float", "none", "-1", "0.10", "0.00", "0.00", "0"] + ["0.10", "0.00", "0.00", "0"]) + "\n"
    )
    lines = FIXTURE.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.strip()[:1].isdigit())
    f = tmp_path / "all_gather_perf.log"
    f.write_text("".join(lines[:first] + [zero] + lines[first:]))
    m = read_nccl_tests(f)
    assert m.rows[0].size_bytes == 0 and len(m.rows) == 11
    doc = compare_collective(make_cluster("g4dn.12xlarge", 2), m)
    assert [r["size_bytes"] for r in doc["rows"]] == [r.size_bytes for r in m.rows[1:]]
