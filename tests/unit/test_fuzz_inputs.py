"""The promise of every command, checked by fuzzing what a user can pass: exit 0 with a finite
answer, or exit 2 with exactly one line on stderr — never a traceback, never exit 1.

Hypothesis mutates valid inputs (a configuration file, a topology file, a model file, the flags
of `predict` and `collective`): a value replaced by another type, a number made NaN, infinite,
negative, zero or huge, a key misspelt or added, a mapping emptied, duplicate keys. Each case runs
`shardsim` in-process through `runtime.cli.main`.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shardsim.cli import main
from shardsim.data import TOPOLOGIES

pytestmark = pytest.mark.slow

CASES = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

WEIRD_NUMBERS = [
    0,
    -1,
    1,
    2,
    3,
    7,
    10**6,
    10**23,
    2**63,
    -(10**9),
    0.5,
    -0.5,
    1e-300,
    1e300,
    math.nan,
    math.inf,
    -math.inf,
]
WEIRD_TEXT = [
    "",
    " ",
    "nan",
    "inf",
    "-1",
    "0",
    "1e23",
    "1e309",
    "abc",
    "zero2d",
    "☃",
    "a\nb",
    "{",
    "[1, 2]",
    "99999999999999999999999",
    "0x10",
    "4.5",
    "none",
    "true",
]

scalars = st.one_of(
    st.sampled_from(WEIRD_NUMBERS),
    st.integers(min_value=-(10**25), max_value=10**25),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WEIRD_TEXT),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.sampled_from(["value", "source", "kind", "x", "fp32"]), scalars, max_size=3),
)


def run(argv: list[str]) -> tuple[int, str, str]:
    """`shardsim ARGV` in-process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def _finite(obj: Any) -> bool:
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_finite(v) for v in obj)
    return True


def _refuse_constant(name: str) -> None:
    raise AssertionError(f"{name} in the JSON output")


def check_promise(argv: list[str]) -> None:
    code, out, err = run(argv)
    lines = [line for line in err.splitlines() if line.strip()]
    shown = f"shardsim {' '.join(argv)}\nexit {code}\nstderr:\n{err}"
    assert "Traceback" not in err, shown
    assert code in (0, 2), shown
    if code == 2:
        assert len(lines) == 1, shown
        assert lines[0].startswith("shardsim"), shown
    elif "--json" in argv:
        answer = json.loads(out, parse_constant=_refuse_constant)  # strict JSON: no NaN or Infinity
        assert _finite(answer), shown


def _paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a nested mapping (mappings and their leaves)."""
    found = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            found.append((*prefix, k))
            found.extend(_paths(v, (*prefix, k)))
    return found


def _leaves(tree: Any, prefix: tuple = ()) -> list[tuple]:
    """Key paths of the leaves (non-mapping values) of a nested mapping."""
    return [p for p in _paths(tree, prefix) if not isinstance(_at(tree, p), dict)]


def _at(tree: Any, path: tuple) -> Any:
    for k in path:
        tree = tree[k]
    return tree


ACTIONS = ["number"] * 5 + ["any"] * 2 + ["delete", "misspell", "add", "dup"]


def mutate(data: st.DataObject, tree: dict[str, Any]) -> str:
    """YAML text of `tree` with one or two mutations drawn by hypothesis: mostly a leaf made a
    weird number (so that the check behind the reader is reached), else a leaf of another type, a
    key deleted, misspelt or added, or a top-level key repeated."""
    tree = json.loads(json.dumps(tree))  # a deep copy
    extra_text = ""
    for _ in range(data.draw(st.integers(1, 2))):
        action = data.draw(st.sampled_from(ACTIONS))
        paths = _leaves(tree) if action in ("number", "any") else _paths(tree)
        if not paths:
            continue
        path = data.draw(st.sampled_from(paths))
        parent = _at(tree, path[:-1])
        key = path[-1]
        if action == "number":
            parent[key] = data.draw(st.one_of(st.sampled_from(WEIRD_NUMBERS), st.integers(-(10**12), 10**12)))
        elif action == "any":
            parent[key] = data.draw(values)
        elif action == "delete":
            del parent[key]
        elif action == "misspell":
            parent[str(key)[:-1] + str(key)[-1:].upper() + "_"] = parent.pop(key)
        elif action == "add":
            parent[data.draw(st.sampled_from(["kernel", "shared_Gbps", "degre", "extra", "value"]))] = data.draw(values)
        else:
            extra_text += f"{path[0]}: {json.dumps(data.draw(scalars))}\n"
    return yaml.safe_dump(tree, allow_unicode=True, sort_keys=False) + extra_text


BASE_CONFIG = {
    "workload": "tiny-gpt",
    "topology": "p4d.24xlarge",
    "nodes": 2,
    "strategy": {"kind": "zero2d", "degree": 4},
    "batch_per_device": 2,
    "grad_accum": 1,
    "precision": "bf16",
    "checkpointing": "none",
}
BASE_SMP = {
    "workload": "tiny-gpt",
    "instance_type": "ml.p4d.24xlarge",
    "instance_count": 2,
    "distribution": {
        "smdistributed": {
            "modelparallel": {"enabled": True, "parameters": {"sharded_data_parallel_degree": 8, "ddp": True}}
        }
    },
}
BASE_MODEL = {
    "family": "llama",
    "hidden": 256,
    "layers": 4,
    "heads": 8,
    "kv_heads": 4,
    "ffn": 512,
    "vocab": 1000,
    "seq_len": 128,
}


def _write(folder: str, name: str, text: str) -> str:
    path = Path(folder) / name
    path.write_text(text)
    return str(path)


@CASES
@given(data=st.data(), base=st.sampled_from([BASE_CONFIG, BASE_SMP]))
def test_configuration_files(data: st.DataObject, base: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        check_promise(["predict", _write(tmp, "c.yaml", mutate(data, base)), "--json"])


@CASES
@given(data=st.data(), name=st.sampled_from(["p4d.24xlarge", "g4dn.12xlarge", "emu-2x2"]))
def test_topology_files(data: st.DataObject, name: str) -> None:
    tree = yaml.safe_load((TOPOLOGIES / f"{name}.yaml").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "t.yaml", mutate(data, tree))
        check_promise(["predict", "--topology", path, "--nodes", "2", "--workload", "tiny-gpt", "--json"])


@CASES
@given(data=st.data())
def test_model_files(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "m.yaml", mutate(data, BASE_MODEL))
        check_promise(["predict", "--workload", path, "--topology", "p4d.24xlarge", "--nodes", "1", "--json"])


PREDICT_FLAGS = [
    "--nodes",
    "--degree",
    "--pp",
    "--microbatches",
    "--batch-per-device",
    "--grad-accum",
    "--seq-len",
    "--hidden",
    "--layers",
    "--heads",
    "--kv-heads",
    "--ffn",
    "--vocab",
    "--precision",
    "--strategy",
    "--checkpointing",
    "--schedule",
    "--seed",
    "--reduce-dtype",
    "--workload",
    "--topology",
    "--optimizer-impl",
    "--selective-ac-option",
]
flag_value = st.one_of(st.sampled_from(WEIRD_TEXT), st.integers(-5, 10**6).map(str), st.text(max_size=8))


@CASES
@given(
    flags=st.lists(
        st.tuples(st.sampled_from(PREDICT_FLAGS), flag_value), min_size=1, max_size=3, unique_by=lambda f: f[0]
    )
)
@example(flags=[("--workload", "tiny-vit"), ("--seq-len", "77")])
@example(flags=[("--layers", "100000000")])
@example(flags=[("--layers", "1e8")])
def test_predict_flags(flags: list[tuple[str, str]]) -> None:
    argv = ["predict", "--workload", "tiny-gpt", "--topology", "p4d.24xlarge", "--nodes", "1"]
    for flag, value in flags:
        argv += [flag, value] if not value.startswith("-") else [f"{flag}={value}"]
    check_promise([*argv, "--json"])


COLLECTIVE_FLAGS = ["--ranks", "--size", "--nodes", "--topology", "--op", "--algo"]


@CASES
@given(
    flags=st.lists(
        st.tuples(st.sampled_from(COLLECTIVE_FLAGS), flag_value), min_size=1, max_size=3, unique_by=lambda f: f[0]
    )
)
@example(flags=[("--ranks", "9")])
@example(flags=[("--ranks", "-1")])
@example(flags=[("--ranks", "1e23")])
@example(flags=[("--size", "1e309")])
def test_collective_flags(flags: list[tuple[str, str]]) -> None:
    argv = ["collective", "--topology", "p4d.24xlarge"]
    for flag, value in flags:
        argv += [flag, value] if not value.startswith("-") else [f"{flag}={value}"]
    check_promise([*argv, "--json"])


SWEEP_FLAGS = [
    "--nodes",
    "--strategies",
    "--degrees",
    "--pp",
    "--microbatches",
    "--schedules",
    "--global-batch",
    "--batch-per-device",
    "--grad-accum",
    "--layers",
    "--checkpointing",
    "--reduce-dtypes",
    "--top",
]
list_value = st.one_of(
    flag_value,
    st.lists(st.sampled_from(["1", "2", "4", "0", "-1", "nan", "zero", "ddp", "x"]), min_size=1, max_size=3).map(
        ",".join
    ),
)


@settings(CASES, max_examples=60)
@given(
    flags=st.lists(
        st.tuples(st.sampled_from(SWEEP_FLAGS), list_value), min_size=1, max_size=3, unique_by=lambda f: f[0]
    )
)
def test_sweep_flags(flags: list[tuple[str, str]]) -> None:
    argv = [
        "sweep",
        "--workload",
        "tiny-gpt",
        "--topology",
        "p4d.24xlarge",
        "--nodes",
        "1",
        "--workers",
        "1",
        "--no-progress",
    ]
    for flag, value in flags:
        argv += [flag, value] if not value.startswith("-") else [f"{flag}={value}"]
    check_promise([*argv, "--json"])


# Pipelines that do not fit: predict answers, and its `to fit` hint, from flags or a SageMaker block.
BIG_MODELS = ["llama-3.1-8b", "gpt2-xl", "llama-2-13b", "bert-large", "gpt-neox-20b"]


@settings(CASES, max_examples=40)
@given(
    workload=st.sampled_from(BIG_MODELS),
    topology=st.sampled_from(["p4d.24xlarge", "g4dn.12xlarge"]),
    nodes=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([2, 4, 8, 3]),
    microbatches=st.sampled_from([None, 1, 2, 4, 3]),
    batch=st.sampled_from([None, 1, 4, 16]),
    smp=st.sampled_from([None, "pipeline_parallel_degree", "partitions"]),
    json_out=st.booleans(),
)
@example("llama-3.1-8b", "p4d.24xlarge", 2, 2, None, None, None, False)
@example("llama-3.1-8b", "p4d.24xlarge", 2, 2, None, None, "pipeline_parallel_degree", False)
@example("llama-3.1-8b", "p4d.24xlarge", 2, 2, None, None, "partitions", True)
def test_pipelines_that_do_not_fit(workload, topology, nodes, pp, microbatches, batch, smp, json_out) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        if smp is None:
            argv = ["predict", "--workload", workload, "--topology", topology, "--nodes", str(nodes)]
            argv += ["--strategy", "pipeline", "--pp", str(pp)]
        else:
            parameters = {smp: pp} | ({"microbatches": microbatches} if microbatches else {})
            tree = {
                "workload": workload,
                "instance_type": f"ml.{topology}",
                "instance_count": nodes,
                "distribution": {"smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}}},
            }
            argv = ["predict", _write(tmp, "smp.yaml", yaml.safe_dump(tree))]
        if microbatches and smp is None:
            argv += ["--microbatches", str(microbatches)]
        if batch:
            argv += ["--batch-per-device", str(batch)]
        check_promise([*argv, "--json"] if json_out else argv)
        code, out, _ = run(argv)
        if (workload, topology, nodes, pp, microbatches, batch) == ("llama-3.1-8b", "p4d.24xlarge", 2, 2, None, None):
            assert code == 0 and "DOES NOT FIT" in out  # the case a user met
        if code == 0 and "DOES NOT FIT" in out:
            assert any(line.strip().startswith("to fit") for line in out.splitlines()), out


# The sweep's result cache: a stored row of any JSON shape is dropped and predicted again.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)
CACHED_SWEEP = ["sweep", "--workload", "tiny-gpt", "--topology", "p4d.24xlarge", "--nodes", "1"]
CACHED_SWEEP += ["--strategies", "ddp,zero", "--tp-degrees", "1", "--workers", "1", "--no-progress", "--json"]


@pytest.fixture(scope="module")
def cache_folder(tmp_path_factory) -> tuple[Path, dict]:
    """A cache folder filled by a small sweep, and that sweep's answer."""
    folder = tmp_path_factory.mktemp("cache")
    code, out, err = run([*CACHED_SWEEP, "--cache-dir", str(folder)])
    assert code == 0, err
    return folder, json.loads(out)


@settings(CASES, max_examples=40)
@given(rows=st.lists(JSON_VALUES, min_size=1, max_size=3))
def test_cache_rows_of_any_json_shape(cache_folder, rows) -> None:
    import sqlite3

    from shardsim.sweep.cache import FILE

    folder, fresh = cache_folder
    with sqlite3.connect(folder / FILE) as db:
        keys = [k for (k,) in db.execute("SELECT key FROM rows ORDER BY key")]
        for i, key in enumerate(keys):
            db.execute("UPDATE rows SET row = ? WHERE key = ?", (json.dumps(rows[i % len(rows)]), key))
    argv = [*CACHED_SWEEP, "--cache-dir", str(folder)]
    check_promise(argv)
    code, out, err = run(argv)  # the rows predicted again were stored: served now
    assert code == 0 and json.loads(out) == fresh, err


# The Python API's keywords given values of any type: a result, or one ConfigError of one line.
API_VALUES = st.one_of(
    values,
    st.sampled_from([object(), 1.5, b"x", (1,), {"kind": "pipeline", "pp": 2}, Path("no-such-dir/x"), print]),
)
TINY_P4D = {"workload": "tiny-gpt", "topology": "p4d.24xlarge", "nodes": 1}
API_KEYWORDS = {
    "load_config": (lambda **kw: __import__("shardsim").load_config(None, TINY_P4D, **kw)),
    "predict": (lambda **kw: __import__("shardsim").predict(TINY_P4D, **kw)),
    "sweep": (lambda **kw: __import__("shardsim").sweep(TINY_P4D, **{"strategies": ["ddp"], "workers": 1, **kw})),
    "calibrate": (lambda **kw: __import__("shardsim").calibrate(kw.pop("measurements", None), "p4d.24xlarge", **kw)),
    "collective": (lambda **kw: __import__("shardsim").collective(**kw)),
    "recommend": (lambda **kw: __import__("shardsim").recommend(kw["table_or_result"])),
}
KEYWORDS = {
    "load_config": ["nodes", "strategy", "degree", "pp", "batch_per_device", "precision", "workload", "checkpointing"],
    "predict": ["algo", "trace", "nodes", "strategy", "degree", "pp", "microbatches", "tp", "grad_accum"],
    "sweep": [
        "algo",
        "workers",
        "progress",
        "strategies",
        "degrees",
        "nodes",
        "global_batch",
        "max_batch",
        "precisions",
        "compile",
        "tp_degrees",
        "batch_sizes",
        "topologies",
    ],
    "calibrate": ["measurements", "params", "folds", "force", "out", "nccl_tests", "nodes"],
    "collective": ["op", "size", "topology", "nodes", "algo", "backend", "ranks"],
    "recommend": ["table_or_result"],
}


@settings(CASES, max_examples=150)
@given(data=st.data(), function=st.sampled_from(sorted(KEYWORDS)))
def test_api_keywords_of_any_type(data: st.DataObject, function: str) -> None:
    import shardsim

    keyword = data.draw(st.sampled_from(KEYWORDS[function]), label="keyword")
    value = data.draw(API_VALUES, label="value")
    try:
        result = API_KEYWORDS[function](**{keyword: value})
    except shardsim.ConfigError as err:
        assert "\n" not in str(err), (function, keyword, value, str(err))
    else:
        if hasattr(result, "to_json"):
            assert _finite(json.loads(result.to_json(), parse_constant=_refuse_constant))


# A size is a whole number of bytes: exact, or refused in one line.
@settings(CASES, max_examples=60)
@given(
    number=st.one_of(st.floats(0, 1e6, allow_nan=False), st.fractions(0, 10**6).map(lambda f: float(f))),
    unit=st.sampled_from(["", "B", "KB", "KiB", "MB", "MiB"]),
    as_text=st.booleans(),
)
def test_fractional_sizes(number: float, unit: str, as_text: bool) -> None:
    from fractions import Fraction

    import shardsim
    from shardsim.core.units import _SIZE_UNITS

    size = f"{number!r}{unit}" if as_text or unit else number
    exact = Fraction(repr(number)) * _SIZE_UNITS[unit.lower()]
    try:
        r = shardsim.collective("all_reduce", size, topology="p4d.24xlarge", nodes=1)
    except shardsim.ConfigError as err:
        assert "\n" not in str(err) and err.field == "size"
        assert exact.denominator != 1 or not 1 <= exact <= 2**40, (size, str(err))
    else:
        assert r.size_bytes == exact and math.isfinite(r.time_s)
    check_promise(["collective", "--topology", "p4d.24xlarge", "--size", str(size), "--json"])


# --- pasted DeepSpeed and SageMaker blocks, list flags, empty files ------------------------------

BASE_DS = {
    "workload": "tiny-gpt",
    "topology": "p4d.24xlarge",
    "nodes": 1,
    "zero_optimization": {
        "stage": 3,
        "mics_shard_size": 4,
        "overlap_comm": True,
        "reduce_bucket_size": 500000000,
        "offload_optimizer": {"device": "none", "pin_memory": True},
        "offload_param": {"device": "none", "buffer_count": 4},
    },
}
BASE_SMP_BLOCK = {
    "workload": "tiny-gpt",
    "instance_type": "ml.p4d.24xlarge",
    "instance_count": 1,
    "bf16": True,
    "mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "fp32"},
    "distribution": {
        "smdistributed": {
            "modelparallel": {
                "enabled": True,
                "parameters": {
                    "sharded_data_parallel_degree": 4,
                    "ddp": True,
                    "activation_loading_horizon": 4,
                    "placement_strategy": "cluster",
                    "microbatches": 1,
                },
            }
        },
        "mpi": {"enabled": True, "processes_per_host": 8, "custom_mpi_options": "-x NCCL_DEBUG=WARN"},
    },
}
# keys that disagree with a base's (or with another key of the same file)
CLASHES = [
    {"fp16": True},
    {"precision": "fp16"},
    {"sharding_strategy": "NO_SHARD"},
    {"hybrid_shard_degree": 2},
    {"degree": 2},
    {"strategy": "ddp"},
    {"pipeline_parallel_degree": 2, "partitions": 4},
    {"zero_optimization": {"stage": 1}},
]


@CASES
@given(
    data=st.data(),
    base=st.sampled_from([BASE_DS, BASE_SMP_BLOCK]),
    clash=st.one_of(st.none(), st.sampled_from(CLASHES)),
    suffix=st.sampled_from([".yaml", ".json"]),
)
def test_deepspeed_and_sagemaker_blocks(data: st.DataObject, base: dict, clash: dict | None, suffix: str) -> None:
    """Misspelt keys at any depth (offload_optimizer's too), disagreeing keys, NaN or infinity
    anywhere; as YAML, and as JSON (NaN and Infinity as JSON writes them)."""
    text = mutate(data, {**base, **(clash or {})})
    if suffix == ".json":
        text = json.dumps(yaml.safe_load(text))  # a repeated key: the last, as YAML reads it
    with tempfile.TemporaryDirectory() as tmp:
        check_promise(["predict", _write(tmp, f"c{suffix}", text), "--json"])


SWEEP_LISTS = {  # a list flag of the sweep → good elements, space-separated
    "--nodes": "1 2",
    "--strategies": "ddp zero",
    "--degrees": "2 4",
    "--pp": "2",
    "--microbatches": "2 4",
    "--schedules": "gpipe 1f1b",
    "--batch-per-device": "2 4",
    "--grad-accum": "1 2",
    "--checkpointing": "none full",
    "--reduce-dtypes": "fp32 bf16",
    "--topology": "p4d.24xlarge",
    "--compile": "true false",
}
LIST_FLAGS = [("sweep", f, good.split()) for f, good in SWEEP_LISTS.items()] + [("collective", "--sizes", ["1MiB"])]
SWEEP_BASE = ["--workload", "tiny-gpt", "--topology", "p4d.24xlarge", "--nodes", "1", "--workers", "1", "--no-progress"]


@settings(CASES, max_examples=60)
@given(flag=st.sampled_from(LIST_FLAGS), data=st.data())
def test_an_empty_list_element(flag: tuple[str, str, list[str]], data: st.DataObject) -> None:
    """A list flag with an empty element (``1,,2``, a trailing comma, blanks): refused, one line."""
    command, name, good = flag
    items = data.draw(st.lists(st.sampled_from(good), max_size=3))
    blank = data.draw(st.sampled_from(["", " ", "\t"]))
    items.insert(data.draw(st.integers(0, len(items))), blank)
    argv = [command, *(SWEEP_BASE if command == "sweep" else ["--topology", "p4d.24xlarge"])]
    argv = [*argv, f"{name}={','.join(items)}", "--json"]
    check_promise(argv)
    code, _, err = run(argv)
    assert code == 2 and "none of them empty" in err, (argv, err)


PREDICT_TINY = ["predict", "--workload", "tiny-gpt", "--topology", "p4d.24xlarge", "--nodes", "1"]
EMPTY_FILES = {  # a file's name → the flag that passes it to predict (None: the configuration)
    "c.yaml": None,
    "c.json": None,
    "t.yaml": "--topology",
    "m.yaml": "--workload",
    "config.json": "--workload",
    "cal.yaml": "--calibration",
    "p.json": "--profile",
}


@pytest.mark.parametrize("name", sorted(EMPTY_FILES))
def test_a_file_of_0_bytes(name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path, flag = _write(tmp, name, ""), EMPTY_FILES[name]
        argv = [*PREDICT_TINY, *([flag, path] if flag else [path]), "--json"]
        check_promise(argv)
        code, _, err = run(argv)
        assert code == 2 and "empty file (0 bytes)" in err, (argv, err)
