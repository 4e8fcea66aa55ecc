"""Exit statuses and streams as documented: a closed stdout or a broken pipe ends a command with
141 and no word; a Ctrl-C as the process starts is one line; stdout that cannot encode a
character gets it escaped; a message is one line whatever it quotes; a file that cannot be
written (the disk full) is one line, status 1, naming what was written and what was not."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from shardsim.cli import main
from tests.helpers import private_device

ROOT = Path(__file__).resolve().parents[2]
SHARDSIM = [sys.executable, "-m", "shardsim.cli"]
SWEEP = ["sweep", "--strategies", "ddp,zero2d", "--degrees", "4,8", "--no-progress", "--workers", "1"]


@pytest.mark.parametrize("args", [["predict"], ["predict", "--json"], SWEEP], ids=["text", "json", "table"])
def test_a_closed_stdout_ends_the_command_with_141_and_no_word(args):
    proc = subprocess.run(
        [*SHARDSIM, *args], cwd=ROOT, preexec_fn=lambda: os.close(1), stderr=subprocess.PIPE, text=True, timeout=120
    )
    assert (proc.returncode, proc.stderr) == (141, "")


@pytest.mark.parametrize("args", [["predict", "--json"], SWEEP], ids=["print", "table"])
def test_a_pipe_closed_before_the_result_ends_the_command_with_141_and_no_word(args):
    """`shardsim sweep | head -1` with head gone before the table comes."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [*SHARDSIM, *args], cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")


# the program as `python -m shardsim.cli` runs it, with a Ctrl-C `delay` seconds after
# Python itself is ready (before that, an interrupt is the interpreter's own start to handle)
CTRL_C_AFTER = """
import os, runpy, signal, sys, threading
threading.Timer(float(sys.argv[1]), os.kill, (os.getpid(), signal.SIGINT)).start()
sys.argv = ["shardsim", *sys.argv[2:]]
runpy.run_module("shardsim.cli", run_name="__main__")
"""


@pytest.mark.parametrize("delay", [0.2, 0.3, 0.5])
def test_a_ctrl_c_as_the_command_starts_is_one_line(delay):
    """Whenever it comes: while the command's modules load, while it parses, while it works."""
    proc = subprocess.run(
        [sys.executable, "-c", CTRL_C_AFTER, str(delay), *SWEEP],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stderr) == (130, "shardsim: interrupted\n")


def test_a_stdout_that_cannot_encode_a_character_gets_it_escaped():
    env = {**os.environ, "LC_ALL": "C", "PYTHONIOENCODING": "ascii"}
    proc = subprocess.run([*SHARDSIM, *SWEEP], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "\\u2717" in proc.stdout  # ✗, the mark of a configuration that does not fit


@pytest.mark.parametrize("inject", ["\nshardsim: error: fake", "\r\x1b[2Kfake", "\x85\u2028"])
def test_a_message_is_one_line_whatever_it_quotes(capsys, tmp_path, inject):
    Path(f"{tmp_path}/file{inject}").write_text("")
    path = f"{tmp_path}/file{inject}/trace.json"
    assert main(["predict", "--trace", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardsim: error: ") and err.endswith("is not a folder\n")
    assert len(err.splitlines()) == 1 and "\x1b" not in err and "\r" not in err, repr(err)


def test_a_full_device_as_the_trace_is_one_line_and_status_1(capsys, tmp_path):
    full = private_device(tmp_path / "full", 1, 7)
    assert main(["predict", "--trace", str(full)]) == 1
    assert capsys.readouterr().err == f"shardsim: error: cannot write {full}: No space left on device\n"
    assert stat.S_ISCHR(os.lstat(full).st_mode) and os.listdir(tmp_path) == ["full"]


def test_a_sweep_that_cannot_write_a_file_prints_its_table_and_names_what_was_written(capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.parquet").symlink_to(private_device(tmp_path / "full", 1, 7))  # the disk full at the second file
    assert main([*SWEEP, "--out", str(out), "--no-plots", "--force"]) == 1  # forced: no manifest yet
    captured = capsys.readouterr()
    assert "Recommended sharded_data_parallel_degree" in captured.out and "sweep.csv" in captured.out
    assert captured.err == (
        f"shardsim: error: cannot write {out}/sweep.parquet: No space left on device; written: sweep.csv; "
        "not written: recommended.json\n"
    )
    assert sorted(os.listdir(out)) == ["manifest.json", "sweep.csv", "sweep.parquet"]
    assert (out / "sweep.parquet").is_symlink()  # a link stays a link
    assert json.loads((out / "manifest.json").read_text())["files"] == ["sweep.csv"]  # what this sweep wrote
