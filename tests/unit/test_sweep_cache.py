"""The result cache: rows keyed by the content of what a prediction depends on, served identical
to fresh ones; an interrupted sweep resumes; an axis added simulates only the new points; a
cache that cannot be used is one warning and the sweep runs without it."""

from __future__ import annotations

import json
import math
import multiprocessing
import sqlite3
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.cli import main
from shardsim.config import RunConfig
from shardsim.simulator.workload.resolve import load_workload
from shardsim.sweep.cache import (
    FILE,
    KeyMaker,
    ResultCache,
    cache_dir,
    cached_rows,
    decode_row,
    encode_row,
    is_row,
)
from shardsim.sweep.execute import predict_all
from shardsim.sweep.search import sweep
from shardsim.sweep.space import SweepSpace, enumerate_configs

# 2 x g4dn.12xlarge = 8 T4s, tiny-gpt: a few dozen configurations, some that do not fit (NaN times)
TINY = RunConfig(workload="tiny-gpt", topology="g4dn.12xlarge", nodes=2)
SPACE = SweepSpace(strategies=("ddp", "zero", "zero2d"))


class Stop(Exception):
    pass


def test_rows_from_the_cache_are_identical_to_fresh_ones(tmp_path) -> None:
    fresh = sweep(TINY, SPACE, workers=1).table  # no cache
    with ResultCache(tmp_path) as cache:
        first = sweep(TINY, SPACE, workers=1, cache=cache).table
        assert (cache.hits, cache.simulated) == (0, len(fresh))
    with ResultCache(tmp_path) as cache:
        again = sweep(TINY, SPACE, workers=1, cache=cache).table
        assert (cache.hits, cache.simulated) == (len(fresh), 0)
    pd.testing.assert_frame_equal(first, fresh, check_exact=True)
    pd.testing.assert_frame_equal(again, fresh, check_exact=True)


def test_a_row_round_trips_exactly_nan_and_all() -> None:
    row = {"a": 0.1 + 0.2, "b": float("nan"), "c": float("inf"), "d": None, "e": True, "f": 3, "g": 1e-300}
    back = decode_row(encode_row(row))
    assert math.isnan(back.pop("b")) and back == {k: v for k, v in row.items() if k != "b"}
    assert [type(v) for v in back.values()] == [type(row[k]) for k in back]


def test_an_interrupted_sweep_resumes_where_it_stopped(tmp_path) -> None:
    w = load_workload(TINY.workload, TINY.shape, TINY.source)
    cands = enumerate_configs(TINY, SPACE, w).candidates
    k = 5

    def stop_after_k(done: int, total: int, work: float) -> None:
        if done == k:
            raise Stop

    with ResultCache(tmp_path) as cache, pytest.raises(Stop):
        predict_all(cands, w, workers=1, progress=stop_after_k, cache=cache)
    with ResultCache(tmp_path) as cache:
        rows = predict_all(cands, w, workers=1, cache=cache)
        assert (cache.hits, cache.simulated) == (k, len(cands) - k)
    assert len(rows) == len(cands) and all(r is not None for r in rows)


def test_an_axis_added_simulates_only_the_new_points(tmp_path) -> None:
    with ResultCache(tmp_path) as cache:
        one = sweep(TINY, SPACE, workers=1, cache=cache).table
    wider = replace(SPACE, checkpointing=("full", "none"))  # the base's value first: its rows keep their labels
    with ResultCache(tmp_path) as cache:
        two = sweep(TINY, wider, workers=1, cache=cache).table
        assert (cache.hits, cache.simulated) == (len(one), len(two) - len(one))
    fresh = sweep(TINY, wider, workers=1).table
    pd.testing.assert_frame_equal(two, fresh, check_exact=True)


def _keys(cfg: RunConfig, algo: str = "auto", **cluster_changes) -> list[str | None]:
    w = load_workload(cfg.workload, cfg.shape, cfg.source)
    cands = enumerate_configs(cfg, SPACE, w).candidates[:3]
    if cluster_changes:
        inst = cands[0].cluster.instance
        fabric = replace(inst.fabric, **cluster_changes)
        cands = [replace(c, cluster=replace(c.cluster, instance=replace(inst, fabric=fabric))) for c in cands]
    maker = KeyMaker(w, algo)
    return [maker.key(c) for c in cands]


def test_the_key_follows_the_content_not_the_names(tmp_path) -> None:
    base = _keys(TINY)
    assert all(base) and len(set(base)) == 3
    assert _keys(TINY) == base  # the same content, the same keys
    assert _keys(TINY, algo="ring") != base
    assert _keys(TINY, efficiency=0.5) != base  # the same topology's name, another figure
    assert _keys(TINY.replace(shape={"seq_len": 64})) != base  # the same workload's name, another model
    cal = tmp_path / "cal.yaml"
    cal.write_text("a: 1\n")
    with_cal = _keys(TINY.replace(calibration=str(cal)))
    cal.write_text("a: 2\n")
    assert _keys(TINY.replace(calibration=str(cal))) != with_cal  # the file's bytes, not its name


def test_a_label_is_the_asking_sweeps(tmp_path) -> None:
    w = load_workload(TINY.workload, TINY.shape, TINY.source)
    cands = enumerate_configs(TINY, SPACE, w).candidates[:2]
    with ResultCache(tmp_path) as cache:
        predict_all(cands, w, workers=1, cache=cache)
    renamed = [replace(c, label=f"{c.label}, renamed") for c in cands]
    with ResultCache(tmp_path) as cache:
        rows = predict_all(renamed, w, workers=1, cache=cache)
        assert cache.hits == 2
    assert [r["label"] for r in rows] == [c.label for c in renamed]


def test_a_corrupt_cache_is_one_warning_and_the_sweep_runs(tmp_path, capsys) -> None:
    (tmp_path / FILE).write_bytes(b"not a database, " * 100)
    argv = ["sweep", "--workload", "tiny-gpt", "--nodes", "2", "--strategies", "ddp,zero", "--workers", "1"]
    assert main([*argv, "--cache-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unusable" in err and "sweeping without the cache" in err, err
    assert "Traceback" not in err


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _overwrite_rows(folder: Path, text: str) -> int:
    """Every stored row replaced by `text`; how many there are."""
    with sqlite3.connect(folder / FILE) as db:
        db.execute("UPDATE rows SET row = ?", (text,))
        return int(db.execute("SELECT count(*) FROM rows").fetchone()[0])


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> tuple[Path, list, object, dict]:
    """A cache folder holding the rows of a small sweep, its candidates, workload and one real row."""
    folder = tmp_path_factory.mktemp("rows")
    w = load_workload(TINY.workload, TINY.shape, TINY.source)
    cands = enumerate_configs(TINY, SweepSpace(strategies=("ddp", "zero")), w).candidates[:4]
    with ResultCache(folder) as cache:
        rows = predict_all(cands, w, workers=1, cache=cache)
    return folder, cands, w, rows[0]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(value=JSON)
def test_a_stored_row_of_any_json_shape_is_dropped_not_served(stored, value) -> None:
    folder, cands, w, _ = stored
    n = _overwrite_rows(folder, json.dumps(value))
    with ResultCache(folder) as cache:
        _, served = cached_rows(cache, cands, w, "auto")
        assert served == {} and cache.dropped == n == len(cands)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_a_row_with_a_key_missing_or_a_value_of_another_shape_is_no_row(stored, data) -> None:
    row = dict(stored[3])
    assert is_row(row)
    key = data.draw(st.sampled_from(sorted(row)), label="key")
    if data.draw(st.booleans(), label="delete"):
        del row[key]
    else:  # no column holds a list or a mapping
        row[key] = data.draw(st.lists(JSON, max_size=2) | st.dictionaries(st.text(max_size=4), JSON, max_size=2))
    assert not is_row(row)


def test_a_row_with_text_for_a_figure_is_no_row(stored) -> None:
    row = stored[3]
    assert not is_row({**row, "step_time_s": "1.5"})
    assert not is_row({**row, "fits": 1}) and not is_row({**row, "nodes": True}) and not is_row({**row, "label": 3})
    assert is_row({**row, "cost_per_hour_usd": None})  # a topology with no price


def test_bad_stored_rows_are_one_warning_and_predicted_again(tmp_path, capsys) -> None:
    argv = ["sweep", "--workload", "tiny-gpt", "--nodes", "2", "--strategies", "ddp,zero", "--workers", "1", "--json"]
    argv += ["--cache-dir", str(tmp_path)]
    assert main(argv) == 0
    fresh = json.loads(capsys.readouterr().out)
    for text in ("null", "{}", "[]", "42", '"x"', '{"step_time_s": "1"}', "not json"):
        n = _overwrite_rows(tmp_path, text)
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert json.loads(out) == fresh
        assert err.count("\n") == 1 and f"{n} stored row(s) were not sweep rows" in err, err
    assert main(argv) == 0  # replaced by the rows predicted again
    assert capsys.readouterr().err == f"shardsim: cache: {len(fresh['rows'])} hits, 0 simulated\n"


def test_an_unwritable_cache_folder_is_one_warning(tmp_path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = ["sweep", "--workload", "tiny-gpt", "--nodes", "2", "--strategies", "ddp,zero", "--workers", "1"]
    assert main([*argv, "--cache-dir", str(blocker / "cache")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sweeping without the cache" in err, err


def test_the_cli_says_its_hits_and_no_cache_reads_and_writes_nothing(tmp_path, capsys) -> None:
    argv = ["sweep", "--workload", "tiny-gpt", "--nodes", "2", "--strategies", "ddp,zero", "--workers", "1", "--json"]
    assert main([*argv, "--cache-dir", str(tmp_path), "--no-cache"]) == 0
    assert capsys.readouterr().err == "" and not (tmp_path / FILE).exists()
    assert main([*argv, "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().err == ""  # nothing served: no line (-v says it)
    assert main([*argv, "--cache-dir", str(tmp_path / "other"), "-v"]) == 0
    n = capsys.readouterr().err.split("cache: 0 hits, ")[1].split(" simulated")[0]
    assert int(n) > 0
    assert main([*argv, "--cache-dir", str(tmp_path)]) == 0
    assert f"cache: {n} hits, 0 simulated" in capsys.readouterr().err


def test_the_default_folder(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SHARDSIM_CACHE_DIR", str(tmp_path / "a"))
    assert cache_dir() == tmp_path / "a" and cache_dir(tmp_path / "b") == tmp_path / "b"
    monkeypatch.delenv("SHARDSIM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "shardsim"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "shardsim"


def _writer(folder: str, start: int, n: int) -> None:
    with ResultCache(folder) as cache:
        for i in range(start, start + n):
            cache.store(f"key-{i}", {"i": i, "x": i / 7})
        assert cache.usable


def test_concurrent_writers_share_one_cache(tmp_path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), s, 300)) for s in (0, 150, 300)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    with ResultCache(tmp_path) as cache:
        assert cache.count() == 600
        assert cache.lookup(["key-450"]) == {"key-450": {"i": 450, "x": 450 / 7}}


def test_the_code_fingerprint_reads_the_package_and_nothing_beside_it():
    """The rows' key holds the package's own files: a checkout's tests, experiments and build
    folders (which tests write to while a sweep runs) or an install's site-packages change nothing."""
    from shardsim.sweep.cache import PACKAGE, code_files

    files = code_files()
    assert PACKAGE.name == "shardsim" and all(PACKAGE in p.parents for p in files)
    names = {p.relative_to(PACKAGE).as_posix() for p in files}
    assert {"sweep/cache.py", "data/topologies/p4d.24xlarge.yaml", "simulator/engine.py"} <= names
    assert not any("__pycache__" in n for n in names)
