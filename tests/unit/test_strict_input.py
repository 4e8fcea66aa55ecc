"""Files and mappings the user passes are read strictly: a key nobody reads, a misspelt key, a
figure that is not a finite number, a key given twice, a file that is not UTF-8 text, nested
without end or too large, a shape field the model's family does not use: each is one line naming
the file and the field (exit status 2, ConfigError in the Python API), never a changed answer."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from shardsim.cli import main
from shardsim.config import load_config
from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import FILE_BYTES, MAX_DEPTH, load_yaml
from shardsim.specs.hardware.topology import builtin_topology_dir, load_instance
from shardsim.specs.model.describe import read_model_file

TOPOLOGY = (builtin_topology_dir() / "g4dn.12xlarge.yaml").read_text()
PREDICT = ["predict", "--workload", "tiny-gpt", "--topology", "emu-2x2", "--backend", "gloo"]


def cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def refused(argv: list[str], capsys) -> str:
    """The one line a refused command prints (exit status 2, no traceback)."""
    assert cli(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardsim: error: "), err
    return err.strip()


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def topology(tmp_path: Path, old: str, new: str) -> Path:
    """The shipped g4dn.12xlarge file with one line's start `old` replaced by `new`."""
    assert TOPOLOGY.count(old) == 1, old
    return write(tmp_path, "topo.yaml", TOPOLOGY.replace(old, new))


# --- SageMaker and FSDP keys ------------------------------------------------------------------

SMP_BLOCK = """distribution:
  smdistributed:
    modelparallel:
      enabled: true
      parameters:
        {param}
  mpi: {{enabled: true, processes_per_host: 4}}
"""


@pytest.mark.parametrize(
    ("text", "field", "near"),
    [
        ("sharded_data_parallel_degre: 8\n", "sharded_data_parallel_degre", "sharded_data_parallel_degree"),
        (
            SMP_BLOCK.format(param="sharded_data_parallel_degre: 8"),
            "distribution.smdistributed.modelparallel.parameters.sharded_data_parallel_degre",
            "sharded_data_parallel_degree",
        ),
        (
            SMP_BLOCK.format(param="sharded_data_parallel_degree: 8").replace("  smdistributed:", "  smdistribute:"),
            "distribution.smdistribute",
            "smdistributed",
        ),
        (
            SMP_BLOCK.format(param="sharded_data_parallel_degree: 8").replace("parameters:", "parameter:"),
            "distribution.smdistributed.modelparallel.parameter",
            "parameters",
        ),
        (
            SMP_BLOCK.format(param="sharded_data_parallel_degree: 8").replace("processes_per_host", "process_per_host"),
            "distribution.mpi.process_per_host",
            "processes_per_host",
        ),
        ("mixed_precision: {param_dtype: bf16, reduce_dtpye: fp32}\n", "mixed_precision.reduce_dtpye", "reduce_dtype"),
        ("strategy: {kind: zero2d, degre: 4}\n", "strategy.degre", "degree"),
        ("batch_per_devise: 2\n", "batch_per_devise", "batch_per_device"),
    ],
    ids=["flat", "parameters", "distribution", "modelparallel", "mpi", "mixed-precision", "strategy", "top"],
)
def test_a_misspelt_configuration_key_is_refused_with_the_key_meant(tmp_path, capsys, text, field, near):
    path = write(tmp_path, "c.yaml", text)
    err = refused(["predict", str(path)], capsys)
    assert f"{path}: field '{field}': unknown key; did you mean '{near}'?" in err, err


def test_an_unknown_key_with_no_near_name_lists_what_is_expected(tmp_path, capsys):
    path = write(tmp_path, "c.yaml", "colour: red\n")
    err = refused(["predict", str(path)], capsys)
    assert f"{path}: field 'colour': unknown key; expected one of workload, topology" in err, err


def test_a_disabled_model_parallel_block_is_not_applied(tmp_path, capsys):
    text = SMP_BLOCK.format(param="sharded_data_parallel_degree: 8").replace("enabled: true", "enabled: false", 1)
    path = write(tmp_path, "c.yaml", text)
    err = refused(["predict", str(path)], capsys)
    assert f"{path}: field 'distribution.smdistributed.modelparallel.enabled': " in err and "disabled" in err, err


def test_a_pasted_sagemaker_block_still_reads_as_before(tmp_path):
    path = write(tmp_path, "c.yaml", "instance_count: 8\n" + SMP_BLOCK.format(param="sharded_data_parallel_degree: 8"))
    cfg = load_config(path)
    assert (cfg.strategy.kind, cfg.strategy.degree, cfg.nodes) == ("zero2d", 8, 8)


def test_an_unknown_override_is_refused_in_the_python_api(tmp_path):
    path = write(tmp_path, "c.yaml", "batch_per_device: 4\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, {"batch_per_devcie": 2})
    assert e.value.field == "batch_per_devcie" and "did you mean 'batch_per_device'?" in str(e.value)
    assert load_config(path, {"batch_per_device": 2}).batch_per_device == 2


def test_build_config_refuses_a_key_it_would_not_read():
    from shardsim.config import build_config

    with pytest.raises(ConfigError) as e:
        build_config({"workload": "tiny-gpt", "grad_acum": 2}, "api")
    assert (e.value.where, e.value.field) == ("api", "grad_acum") and "did you mean 'grad_accum'?" in str(e.value)


# --- topology files -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "field", "near"),
    [
        ("  shared_GBps:", "  shared_Gbps:", "fabric.shared_Gbps", "shared_GBps"),
        ("  kernels:", "  kernel:", "device.kernel", "kernels"),
        ("price_per_hour_usd:", "price_per_hour:", "price_per_hour", "price_per_hour_usd"),
        ("  memory_bandwidth_GBps:", "  memory_bandwidth_Gbps:", "device.memory_bandwidth_Gbps", None),
        ("    sms:", "    sm:", "device.kernels.sm", "sms"),
        ("    fp16: {value: 65,", "    fp61: {value: 65,", "device.peak_tflops.fp61", "fp16"),
        ("  rate_gbps:", "  rate_Gbps:", "nic.rate_Gbps", "rate_gbps"),
        ("  cores:", "  core:", "host.core", "cores"),
        (
            "  port_GBps: {value: 15.75, source:",
            "  port_GBps: {value: 15.75, sorce:",
            "fabric.port_GBps.sorce",
            "source",
        ),
    ],
    ids=["fabric", "kernels", "top", "device", "kernel", "peak", "nic", "host", "figure"],
)
def test_a_misspelt_topology_key_is_refused_with_the_key_meant(tmp_path, capsys, old, new, field, near):
    path = topology(tmp_path, old, new)
    err = refused([*PREDICT[:3], "--topology", str(path)], capsys)
    assert f"{path}: field '{field}': unknown key; " in err, err
    if near:
        assert f"did you mean '{near}'?" in err, err


def test_an_emulated_block_is_closed_too(tmp_path, capsys):
    text = (builtin_topology_dir() / "emu-2x2.yaml").read_text().replace("  subnet:", "  subnets:")
    path = write(tmp_path, "emu.yaml", text)
    err = refused([*PREDICT[:3], "--topology", str(path), "--backend", "gloo"], capsys)
    assert f"{path}: field 'emulated.subnets': unknown key; did you mean 'subnet'?" in err, err


# --- figures that are not finite numbers --------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        (
            "  rate_gbps: {value: 50,",
            "  rate_gbps: {value: .nan,",
            "field 'nic.rate_gbps': expected a finite number, got nan",
        ),
        (
            "    fp32: {value: 0.6,",
            "    fp32: {value: .nan,",
            "field 'device.matmul_efficiency.fp32': expected a finite number, got nan",
        ),
        (
            "  rate_gbps: {value: 50,",
            "  rate_gbps: {value: .inf,",
            "field 'nic.rate_gbps': expected a finite number, got inf",
        ),
        (
            "  efficiency: {value: 0.98,",
            "  efficiency: {value: .inf,",
            "field 'nic.efficiency': expected a finite number, got inf",
        ),
        (
            "  latency_us: {value: 30,",
            "  latency_us: {value: .nan,",
            "field 'nic.latency_us': expected a finite number, got nan",
        ),
        (
            "    kernel_floor_us: {value: 35,",
            "    kernel_floor_us: {value: .inf,",
            "field 'device.kernels.kernel_floor_us': expected a finite number, got inf",
        ),
    ],
    ids=["nan-rate", "nan-matmul", "inf-rate", "inf-efficiency", "nan-latency", "inf-floor"],
)
def test_a_figure_that_is_not_a_finite_number_is_refused(tmp_path, capsys, old, new, needle):
    path = topology(tmp_path, old, new)
    err = refused([*PREDICT[:3], "--topology", str(path)], capsys)
    assert f"{path}: {needle}" in err, err


@pytest.mark.parametrize(
    ("old", "field", "bound"),
    [("  count: {value: 4,", "device.count", "65,536"), ("  count: {value: 1,", "nic.count", "64")],
)
def test_a_count_beyond_its_bound_is_refused_naming_the_file(tmp_path, capsys, old, field, bound):
    path = topology(tmp_path, old, "  count: {value: " + "9" * 20 + ",")
    err = refused([*PREDICT[:3], "--topology", str(path)], capsys)
    assert f"{path}: field '{field}': 99,999,999,999,999,999,999 is beyond the simulator's bound of {bound}" in err


def test_a_calibration_with_inf_is_one_line(tmp_path, capsys):
    path = write(
        tmp_path,
        "cal.yaml",
        "device: NVIDIA A100 SXM4 40GB\ntopology: a100-40gb-roce\nparameters:\n"
        "  kernel_floor_us: {value: .inf, default: 35.0, low: 2.0, high: .inf}\n",
    )
    err = refused(["predict", "--topology", "a100-40gb-roce", "--nodes", "1", "--calibration", str(path)], capsys)
    assert f"{path}: field 'parameters.kernel_floor_us.value': expected a finite number, got inf" in err, err


def test_a_profile_with_nan_is_one_line(tmp_path, capsys):
    from tests.unit.test_validation import _profile

    path = _profile(tmp_path)
    doc = json.loads(path.read_text())
    doc["optimizer_per_param_s"] = float("nan")
    path.write_text(json.dumps(doc))  # json writes NaN, and reads it back, unless told not to
    err = refused(["predict", "--workload", "small-gpt", *PREDICT[3:], "--profile", str(path)], capsys)
    assert f"{path}: field 'optimizer_per_param_s': expected a finite number, got nan" in err, err


def test_a_profile_figure_beyond_its_bound_is_one_line(tmp_path, capsys):
    from tests.unit.test_validation import _profile

    path = _profile(tmp_path)
    good = json.loads(path.read_text())
    block = next(iter(good["blocks_by_batch_s"]["4"]))
    huge = "9" * 23  # a microbatch size
    slow, fast, optimizer, batch = (json.loads(json.dumps(good)) for _ in range(4))
    slow["blocks_by_batch_s"]["4"][block][0] = 1e308  # a forward that overflowed the step's sums
    fast["blocks_by_batch_s"]["4"][block][1] = 5e-324  # a backward whose rate overflowed
    optimizer["optimizer_per_param_s"] = 1e308
    batch["blocks_by_batch_s"][huge] = batch["blocks_by_batch_s"].pop("4")
    for doc, field in (
        (slow, f"blocks_by_batch_s.4.{block}[0]"),
        (fast, f"blocks_by_batch_s.4.{block}[1]"),
        (optimizer, "optimizer_per_param_s"),
        (batch, f"blocks_by_batch_s.{huge}"),
    ):
        path.write_text(json.dumps(doc))
        err = refused(["predict", "--workload", "small-gpt", *PREDICT[3:], "--profile", str(path)], capsys)
        assert f"{path}: field '{field}': expected " in err, err


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e400"])
def test_a_hugging_face_config_with_a_non_finite_size_is_refused(tmp_path, capsys, value):
    doc = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 32}
    text = json.dumps(doc).replace('"n_embd": 64', f'"n_embd": {value}')
    path = write(tmp_path, "config.json", text)
    err = refused([*PREDICT[:1], "--workload", str(path), *PREDICT[3:]], capsys)
    assert f"{path}: field 'n_embd': expected a finite number, got " in err, err


def test_an_inline_model_with_nan_is_refused(tmp_path, capsys):
    path = write(
        tmp_path, "c.yaml", "workload: {family: gpt, hidden: .nan, layers: 2, heads: 2, seq_len: 8, vocab: 64}\n"
    )
    err = refused(["predict", str(path)], capsys)
    assert f"{path}: field 'workload.hidden': expected a finite number, got nan" in err, err


# --- duplicate keys -----------------------------------------------------------------------------


def test_a_key_given_twice_is_refused_in_every_kind_of_file(tmp_path, capsys):
    config = write(tmp_path, "c.yaml", "batch_per_device: 2\nseed: 1\nbatch_per_device: 4\n")
    err = refused(["predict", str(config)], capsys)
    assert f"{config}: duplicate key 'batch_per_device' at line 3 (first at line 1)" in err, err

    topo = topology(tmp_path, "  rate_gbps:", "  rate_gbps: {value: 5}\n  rate_gbps:")
    err = refused([*PREDICT[:3], "--topology", str(topo)], capsys)
    assert f"{topo}: duplicate key 'rate_gbps'" in err, err

    model = write(
        tmp_path, "m.yaml", "family: gpt\nhidden: 64\nlayers: 2\nheads: 2\nseq_len: 8\nvocab: 64\nhidden: 32\n"
    )
    err = refused([*PREDICT[:1], "--workload", str(model), *PREDICT[3:]], capsys)
    assert f"{model}: duplicate key 'hidden' at line 7 (first at line 2)" in err, err

    matrix = write(tmp_path, "mx.yaml", "steps: 2\ntopologies: {emu-2x2: [ddp]}\nsteps: 3\n")
    err = refused(["validate", "--matrix", str(matrix), "--out", str(tmp_path / "out")], capsys)
    assert f"{matrix}: duplicate key 'steps'" in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())

    cal = write(
        tmp_path,
        "cal.yaml",
        "device: NVIDIA A100 SXM4 40GB\ndevice: NVIDIA T4\nparameters: {}\n",
    )
    err = refused(["predict", "--topology", "a100-40gb-roce", "--nodes", "1", "--calibration", str(cal)], capsys)
    assert f"{cal}: duplicate key 'device'" in err, err

    inline = "{family: gpt, hidden: 64, hidden: 32, layers: 2, heads: 2, seq_len: 8, vocab: 64}"
    err = refused([*PREDICT[:1], "--workload", inline, *PREDICT[3:]], capsys)
    assert "duplicate key 'hidden'" in err, err


def test_a_merge_key_may_be_overridden(tmp_path):
    data = load_yaml(write(tmp_path, "m.yaml", "a: &a {x: 1, y: 2}\nb: {<<: *a, y: 3}\n"))
    assert data["b"] == {"x": 1, "y": 3}


# --- text, nesting and size ---------------------------------------------------------------------


def test_a_file_that_is_not_utf8_is_one_line(tmp_path, capsys):
    config = write(tmp_path, "c.yaml", b"seed: \xff\xfe\n")
    assert f"{config}: not UTF-8 text at byte 6" in refused(["predict", str(config)], capsys)
    topo = write(tmp_path, "t.yaml", TOPOLOGY.encode() + b"# \xe9\n")
    assert f"{topo}: not UTF-8 text at byte {len(TOPOLOGY.encode()) + 2}" in refused(
        [*PREDICT[:3], "--topology", str(topo)], capsys
    )
    hf = write(tmp_path, "config.json", b'{"model_type": "gpt2\xff"}')
    assert f"{hf}: not UTF-8 text at byte 20" in refused([*PREDICT[:1], "--workload", str(hf), *PREDICT[3:]], capsys)


def test_deep_nesting_is_one_line(tmp_path, capsys):
    deep = "[" * 5000 + "]" * 5000
    config = write(tmp_path, "c.yaml", f"workload: {deep}\n")
    assert f"{config}: nested deeper than {MAX_DEPTH} levels at line 1" in refused(["predict", str(config)], capsys)
    hf = write(tmp_path, "config.json", f'{{"model_type": "gpt2", "x": {deep}}}')
    err = refused([*PREDICT[:1], "--workload", str(hf), *PREDICT[3:]], capsys)
    assert f"{hf}: nested deeper than {MAX_DEPTH} levels" in err
    shallow = "[" * 80 + "]" * 80  # deeper than any real file, shallow enough for Python's recursion
    hf.write_text(f'{{"model_type": "gpt2", "x": {shallow}}}')
    assert f"{hf}: nested deeper than {MAX_DEPTH} levels" in refused(
        [*PREDICT[:1], "--workload", str(hf), *PREDICT[3:]], capsys
    )


def _alias_chain(levels: int, key: str) -> str:
    """A configuration whose `key` holds a list nested `levels` deep, one anchor and alias a level."""
    lines = ["description:", "  k0: &a0 [1]"]
    lines += [f"  k{i}: &a{i} [*a{i - 1}]" for i in range(1, levels)]
    return "\n".join([*lines, f"{key}: *a{levels - 1}", ""])


def test_nesting_through_aliases_is_bounded_too(tmp_path, capsys):
    deep = write(tmp_path, "deep.yaml", _alias_chain(5000, "seed"))
    err = refused(["predict", str(deep)], capsys)
    assert f"{deep}: nested deeper than {MAX_DEPTH} levels at line " in err, err
    loop = write(tmp_path, "loop.yaml", "name: &a [1, *a]\n")
    assert f"{loop}: an alias at line 1 refers to a value that holds it" in refused(["predict", str(loop)], capsys)
    shallow = write(tmp_path, "ok.yaml", _alias_chain(MAX_DEPTH - 3, "name"))  # 3 levels: the file's, k's, [1]
    assert load_config(shallow).seed == 0


def test_a_key_given_twice_in_a_json_file_is_refused(tmp_path, capsys):
    doc = '{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 32'
    twice = write(tmp_path, "config.json", doc + ', "n_embd": 32}')
    err = refused([*PREDICT[:1], "--workload", str(twice), *PREDICT[3:]], capsys)
    assert f"{twice}: duplicate key 'n_embd'" in err, err


@pytest.mark.serial  # a wall-clock promise
def test_a_file_over_the_bound_is_refused_at_once(tmp_path, capsys):
    big = write(tmp_path, "c.yaml", "seed: 1\n" + "#" * FILE_BYTES + "\n")
    for path in (big, Path("/dev/zero")):
        t = time.monotonic()
        err = refused(["predict", str(path)], capsys)
        assert time.monotonic() - t < 1.0
        assert f"{path}: larger than 1 MiB" in err, err
    assert load_config(write(tmp_path, "ok.yaml", "seed: 1\n" + "#" * (FILE_BYTES // 2) + "\n")).seed == 1


# --- shape fields the family does not use -------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "field", "family"),
    [
        (["--workload", "tiny-vit", "--seq-len", "999"], "seq_len", "vit"),
        (["--workload", "tiny-vit", "--vocab", "7"], "vocab", "vit"),
        (["--workload", "tiny-mlp", "--heads", "4"], "heads", "mlp"),
        (["--workload", "tiny-mlp", "--seq-len", "4"], "seq_len", "mlp"),
    ],
    ids=["vit-seq-len", "vit-vocab", "mlp-heads", "mlp-seq-len"],
)
def test_a_shape_flag_the_family_does_not_use_is_refused(capsys, argv, field, family):
    err = refused(["predict", "--topology", "emu-2x2", "--backend", "gloo", *argv], capsys)
    assert f"field '{field}': not used by the {family} family" in err, err


def test_a_shape_key_the_family_does_not_use_is_refused_in_a_file(tmp_path, capsys):
    config = write(tmp_path, "c.yaml", "workload: tiny-vit\nseq_len: 64\ntopology: emu-2x2\nbackend: gloo\n")
    err = refused(["predict", str(config)], capsys)
    assert f"{config}: field 'seq_len': not used by the vit family" in err, err
    inline = write(tmp_path, "i.yaml", "workload: {family: vit, hidden: 64, layers: 2, heads: 2, vocab: 100}\n")
    err = refused(["predict", str(inline)], capsys)
    assert f"{inline}: field 'workload.vocab': not used by the vit family" in err, err
    model = write(
        tmp_path, "m.yaml", "family: gpt\nhidden: 64\nlayers: 2\nheads: 2\nseq_len: 8\nvocab: 64\nimage: 32\n"
    )
    with pytest.raises(ConfigError, match="field 'image': not used by the gpt family"):
        read_model_file(model)


# --- model files ---------------------------------------------------------------------------------


def test_a_misspelt_model_key_is_refused_with_the_key_meant(tmp_path, capsys):
    model = write(tmp_path, "m.yaml", "family: gpt\nhiden: 64\nlayers: 2\nheads: 2\nseq_len: 8\nvocab: 64\n")
    err = refused([*PREDICT[:1], "--workload", str(model), *PREDICT[3:]], capsys)
    assert f"{model}: field 'hiden': unknown key; did you mean 'hidden'?" in err, err


@pytest.mark.parametrize("value", [".nan", ".inf", "lots", "{value: .nan, source: x}"])
def test_a_model_files_published_count_is_a_finite_number(tmp_path, capsys, value):
    text = f"family: gpt\nhidden: 64\nlayers: 2\nheads: 2\nseq_len: 8\nvocab: 64\nparams: {value}\n"
    model = write(tmp_path, "m.yaml", text)
    err = refused([*PREDICT[:1], "--workload", str(model), *PREDICT[3:]], capsys)
    assert f"{model}: field 'params': expected a " in err, err


@pytest.mark.parametrize(
    ("flag", "name", "meant"),
    [("--workload", "tiny-gtp", "tiny-gpt"), ("--topology", "p4d.24xlarg", "p4d.24xlarge")],
)
def test_a_misspelt_name_is_refused_with_the_name_meant(capsys, flag, name, meant):
    err = refused(["predict", flag, name], capsys)
    assert f"{name!r}; did you mean {meant!r}?" in err, err


def test_a_topology_path_that_is_a_device_is_read_as_one_bounded_file(capsys):
    err = refused([*PREDICT[:3], "--topology", "/dev/zero"], capsys)
    assert "/dev/zero: larger than 1 MiB" in err, err


# --- every shipped file still reads -------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_every_shipped_file_reads_strictly():
    from shardsim.runtime.validation.matrix import MATRICES, load_matrix

    for path in sorted(builtin_topology_dir().glob("*.yaml")):
        load_instance(str(path))
    for path in sorted((ROOT / "experiments").rglob("*.yaml")):
        data = load_yaml(path)
        if "family" in data:
            read_model_file(path)
        else:
            load_config(path)
    for path in sorted(MATRICES.glob("*.yaml")):
        load_matrix(path)


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["profile", "--workload", "tiny-gpt", "--layers", "40", "--no-links"], "layers"),
        (["profile", "--workload", "{family: gpt, hidden: 64, layers: 2, heads: 4, ffn: 256, vocab: 100, seq_len: 16}",
          "--no-links"], "workload"),
        (["run", "--topology", "emu-2x2", "--no-emulate", "--workload", "tiny-gpt", "--profile", "p.json"], "profile"),
        (["run", "--topology", "emu-2x2", "--no-emulate", "--workload", "tiny-gpt", "--calibration", "c.yaml"],
         "calibration"),
    ],
    ids=["profile-shape", "profile-inline", "run-profile", "run-calibration"],
)  # fmt: skip
def test_what_a_command_cannot_apply_is_refused_not_ignored(argv, field, tmp_path, capsys, monkeypatch):
    """profile times a named model as its file defines it; a run measures and predicts nothing:
    a shape flag, an inline model, a profile or a calibration given to them is one line naming
    it, before any work."""
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardsim: error: ") and f"field '{field}'" in err, err
    assert os.listdir(tmp_path) == []  # nothing made
