"""One reader of the CSV files shardsim reads back (`simulator.csvfile`): a file cut short, a row
with more or fewer cells than the header, or a cell not of its column's type is named by file,
line and column, never read short; runs.csv is never added to after a torn row; calibrate reads
a runs.csv no more leniently than run does."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shardsim.cli import main
from shardsim.core.csvfile import CSV_BYTES, read_table
from shardsim.core.errors import ConfigError, CorruptFile
from shardsim.runtime.records import CSV_NAME, check_runs_csv, read_runs_csv, write_run
from tests.helpers import run_record


def csv_file(tmp_path: Path, text: str | bytes, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_a_last_line_without_its_line_end_is_named_by_its_line(tmp_path):
    path = csv_file(tmp_path, "a,b\n1,0.07558\n2,0.07")
    with pytest.raises(ConfigError, match="no line end after the last line") as err:
        read_table(path)
    assert err.value.where == f"{path} line 3"


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ("a,b,c\n1,2,3\n4,5\n", 3, "c", "the row has 2 of the header's 3 cells"),
        ("a,b\n1,2\n\n3,4,5\n", 4, None, "3 cells; the header has 2 columns"),
        ("a,b\n1,x\n", 2, "b", "valid number"),
        ("a,b\n1,\n", 2, "b", "empty"),
        ('a,b\n1,"2\n', 2, None, "not a CSV file"),
    ],
)
def test_a_ragged_row_or_a_cell_of_the_wrong_type_is_named_by_line_and_column(tmp_path, text, line, column, words):
    path = csv_file(tmp_path, text)
    with pytest.raises(ConfigError, match=words) as err:
        read_table(path, {"a": int, "b": float})
    assert err.value.where == f"{path} line {line}" and err.value.field == column


def test_the_header_names_each_column_once_and_the_required_ones(tmp_path):
    with pytest.raises(ConfigError, match="column 'a' appears twice"):
        read_table(csv_file(tmp_path, "a,b,a\n1,2,3\n"))
    with pytest.raises(ConfigError, match="no run_id column"):
        read_table(csv_file(tmp_path, "a,b\n1,2\n"), required=("run_id",))
    for empty in ("", "\n\n"):
        with pytest.raises(ConfigError, match="empty"):
            read_table(csv_file(tmp_path, empty))


def test_rows_keep_their_lines_through_blank_lines_quoted_newlines_crlf_and_a_bom(tmp_path):
    path = csv_file(tmp_path, '\ufeffa,b\r\n1,"x\r\ny"\r\n\r\n2,z\r\n'.encode())
    table = read_table(path, {"a": int, "b": str})
    assert table.columns == ["a", "b"]
    assert [(r.line, r.cells) for r in table.rows] == [(2, {"a": "1", "b": "x\r\ny"}), (5, {"a": "2", "b": "z"})]


def test_no_cut_of_a_runs_csv_is_read_short(tmp_path):
    """Every prefix of a real runs.csv is either whole rows (it ends at a line end) or refused."""
    write_run(run_record(run_id="a", step_time_s=0.07558), tmp_path)
    write_run(run_record(run_id="b", step_time_s=0.5), tmp_path)
    text = (tmp_path / CSV_NAME).read_text()
    _, rows = read_runs_csv(tmp_path / CSV_NAME)
    cut = tmp_path / "cut" / CSV_NAME
    cut.parent.mkdir()
    for n in range(1, len(text)):
        cut.write_text(text[:n])
        if text[n - 1] == "\n":
            assert read_runs_csv(cut)[1] == rows[: text[:n].count("\n") - 1]
        else:
            with pytest.raises(CorruptFile, match=r"runs\.csv line \d"):
                read_runs_csv(cut)


def test_runs_csv_cells_are_checked_against_their_columns(tmp_path):
    write_run(run_record(run_id="a"), tmp_path)
    path = tmp_path / CSV_NAME
    good = path.read_text()
    for column, bad in (("world", "4.5"), ("checkpointing", "maybe"), ("step_time_s", "fast"), ("strategy_pp", "")):
        header, rows = good.splitlines()
        cells = rows.split(",")
        cells[header.split(",").index(column)] = bad
        path.write_text(f"{header}\n{','.join(cells)}\n")
        with pytest.raises(CorruptFile) as err:
            check_runs_csv(tmp_path)
        assert (err.value.where, err.value.field) == (f"{path} line 2", column)


def test_run_never_appends_after_a_torn_last_row(tmp_path):
    write_run(run_record(run_id="a"), tmp_path)
    path = tmp_path / CSV_NAME
    torn = path.read_text()[:-3]  # inside the last cell: every cell is there, the last one cut short
    path.write_text(torn)
    with pytest.raises(CorruptFile) as err:
        write_run(run_record(run_id="b"), tmp_path)
    words = str(err.value)
    assert words.startswith(f"{path} line 2: no line end") and "repair or remove that line" in words
    assert path.read_text() == torn


def test_calibrate_refuses_a_runs_csv_torn_inside_a_cell(tmp_path, capsys):
    write_run(run_record(run_id="a", step_time_s=0.07558), tmp_path)
    path = tmp_path / CSV_NAME
    text = path.read_text()
    path.write_text(text[: text.index("0.07558") + len("0.07")])  # torn inside step_time_s
    assert main(["calibrate", str(path), "--topology", "emu-2x2", "--folds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"shardsim: error: {path} line 2: "), err


@pytest.mark.serial  # a wall-clock promise
def test_a_csv_file_over_the_bound_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "big.csv"
    with open(path, "wb") as f:
        f.truncate(CSV_BYTES + 1)  # sparse: no disk, and no line end either
    t = time.monotonic()
    with pytest.raises(ConfigError, match=f"larger than {CSV_BYTES // (1 << 20)} MiB") as err:
        read_table(path)
    assert err.value.where == str(path) and time.monotonic() - t < 1.0


@pytest.mark.serial  # a wall-clock promise
def test_a_run_record_or_measurements_that_are_a_device_are_refused_at_once(tmp_path, capsys):
    """calibrate reads what it is given: a device (endless) is refused, never read to its end. (A
    runs.csv that is a device is written through by `run`, never read: test_state.py.)"""
    for source in (tmp_path / "run.json", Path("/dev/zero")):
        if source.suffix:
            source.symlink_to("/dev/zero")
        t = time.monotonic()
        assert main(["calibrate", str(source), "--topology", "emu-2x2", "--folds", "0"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"shardsim: error: {source}: "), err
        assert "no such file" not in err and time.monotonic() - t < 2.0, err


def test_a_runs_csv_that_is_a_folder_is_named_before_a_run(tmp_path):
    (tmp_path / CSV_NAME).mkdir()
    with pytest.raises(CorruptFile, match="Is a directory") as err:
        check_runs_csv(tmp_path)
    assert err.value.where == str(tmp_path / CSV_NAME)
