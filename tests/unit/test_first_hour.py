"""A new user's first hour: one topology shown and exported (the export loads
back), the library and a model file described (text and JSON), a Hugging Face config.json read at
a stated sequence length under the model's name, and a hint when a step does not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from shardsim.cli import main
from shardsim.config import load_config
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import builtin_topologies, load_instance
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.hf_config import read_hf_config, read_hf_model
from shardsim.specs.model.hf_keys import DEFAULT_SEQ_LEN
from shardsim.specs.model.library import library
from shardsim.specs.model.load import display_name

MISTRAL = {  # mistralai/Mistral-7B-v0.1 config.json's shape keys (its maximum positions: 32,768)
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}
ROOT = Path(__file__).resolve().parents[2]
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}


def _config(tmp_path: Path, folder: str, data: dict) -> Path:
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    return path


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _comparable(inst):
    return (inst.name, inst.description, inst.device, inst.fabric, inst.nic, inst.host, inst.price_per_hour_usd)


@pytest.mark.parametrize("fmt", ["yaml", "json"])
@pytest.mark.parametrize("name", builtin_topologies())
def test_an_exported_topology_loads_back_as_the_same_topology(name, fmt, tmp_path, capsys):
    code, out, _ = _run(["topologies", name, f"--{fmt}"], capsys)
    assert code == 0
    doc = yaml.safe_load(out) if fmt == "yaml" else json.loads(out)
    assert doc["device"]["count"]["source"]  # the figures keep their sources
    path = tmp_path / "mine.yaml"
    path.write_text(out)
    assert _comparable(load_instance(str(path))) == _comparable(load_instance(name))


def test_one_topology_is_shown_with_its_figures(capsys):
    code, out, _ = _run(["topologies", "p5.48xlarge"], capsys)
    assert code == 0
    assert out.startswith("p5.48xlarge: ")
    p5 = load_instance("p5.48xlarge")
    assert f"{p5.nic.count} x {p5.nic.rate_gbps:g} Gbps {p5.nic.fabric}" in out
    assert f"{p5.device.memory_gib:g} GiB" in out and f"${p5.price_per_hour_usd:.3f} per node-hour" in out


def test_an_unknown_topology_is_one_line_naming_the_nearest(capsys):
    code, out, err = _run(["topologies", "p5.48xl"], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "did you mean 'p5.48xlarge'?" in err


def test_export_needs_a_name(capsys):
    code, _, err = _run(["topologies", "--yaml"], capsys)
    assert code == 2 and "NAME" in err


def test_workloads_json_lists_the_library(capsys):
    code, out, _ = _run(["workloads", "--json"], capsys)
    assert code == 0
    rows = {r["model"]: r for r in json.loads(out)}
    assert set(rows) == set(library())
    for name, m in library().items():
        w = from_arch(name, m.arch)
        assert rows[name]["params"] == w.params and rows[name]["train_flops_per_sample"] == w.train_flops
    assert rows["llama-3.1-8b"]["kv_heads"] == 8 and rows["llama-3.1-8b"]["published_params"] == 8.03e9


def test_a_config_json_is_read_at_the_stated_length_not_its_maximum(tmp_path):
    path = _config(tmp_path, "Mistral-7B-v0.1", MISTRAL)
    assert read_hf_config(path).seq_len == DEFAULT_SEQ_LEN == 4096
    assert load_workload(str(path)).tokens_per_sample == 4096
    gpt2 = _config(tmp_path, "gpt2", GPT2)
    assert read_hf_config(gpt2).seq_len == 1024  # a learned position table: no more than its rows
    cfg = load_config(None, {"workload": str(path), "seq_len": 8192})
    assert load_workload(cfg.workload, cfg.shape).tokens_per_sample == 8192


@pytest.mark.parametrize(
    ("folder", "extra", "name"),
    [
        ("Mistral-7B-v0.1", {}, "Mistral-7B-v0.1"),  # the folder names the model type
        ("snapshots/26bca36bde8333b5d7f72e9ed20ccda6a618af24", {}, "mistral"),  # a hash: the model type
        ("x", {"_name_or_path": "mistralai/Mistral-7B-v0.1"}, "mistralai/Mistral-7B-v0.1"),
        ("y", {"_name_or_path": "/home/me/models/my-mistral/"}, "my-mistral"),
    ],
)
def test_a_config_json_is_named_after_its_model(tmp_path, folder, extra, name):
    path = _config(tmp_path, folder, MISTRAL | extra)
    assert read_hf_model(path)[0] == name
    assert display_name(str(path)) == f"{name} seq_len=4096"


def test_predict_names_the_model_and_its_sequence_length(tmp_path, capsys):
    path = _config(tmp_path, "Mistral-7B-v0.1", MISTRAL)
    args = ["predict", "--workload", str(path), "--topology", "p5.48xlarge", "--nodes", "1", "--precision", "bf16"]
    code, out, _ = _run(args, capsys)
    assert code == 0
    assert out.startswith("Mistral-7B-v0.1 seq_len=4096 on 1 x p5.48xlarge") and "config.json" not in out
    code, out, _ = _run([*args, "--seq-len", "2048"], capsys)
    assert out.startswith("Mistral-7B-v0.1 seq_len=2048 on ")


def test_workloads_describes_a_config_json_and_a_model_yaml(tmp_path, capsys):
    path = _config(tmp_path, "Mistral-7B-v0.1", MISTRAL)
    code, out, _ = _run(["workloads", str(path)], capsys)
    assert code == 0
    assert "7.242 B parameters, 32 layers" in out
    assert "4,096 tokens per sample (the default for a config.json, not its maximum positions" in out
    code, out, _ = _run(["workloads", str(path), "--seq-len", "8192", "--json"], capsys)
    row = json.loads(out)
    assert row["seq_len"] == 8192 and row["kv_heads"] == 8 and row["family"] == "llama"
    assert row["params"] == load_workload(str(path)).params
    code, out, _ = _run(["workloads", str(ROOT / "shardsim/data/models/gpt2-xl.yaml"), "--json"], capsys)
    row = json.loads(out)
    assert row["seq_len"] == 1024 and row["published_params"] == library()["gpt2-xl"].published_params


def test_workloads_refuses_a_file_it_cannot_describe(tmp_path, capsys):
    code, _, err = _run(["workloads", str(tmp_path / "model.txt")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    code, _, err = _run(["workloads", "--seq-len", "4"], capsys)
    assert code == 2 and "seq_len" in err


def test_predict_hints_only_when_nothing_fits(capsys):
    base = ["predict", "--workload", "llama-2-70b", "--topology", "p4d.24xlarge", "--precision", "bf16"]
    code, out, _ = _run([*base, "--nodes", "2"], capsys)
    assert code == 0 and "DOES NOT FIT" in out
    assert out.splitlines()[-1].startswith("  to fit           it fits with ") and " nodes (" in out
    code, out, _ = _run([*base, "--nodes", "16", "--batch-per-device", "1"], capsys)
    assert "(fits)" in out and "to fit" not in out


def test_the_shipped_mistral_config_is_the_library_model():
    """The docs' config.json example: read at 4,096 tokens, it is the library's mistral-7b."""
    hf = load_workload(str(ROOT / "experiments/models/Mistral-7B-v0.1/config.json"))
    lib = load_workload("mistral-7b")
    assert hf.name == "Mistral-7B-v0.1 seq_len=4096"  # named after its folder
    assert (hf.params, hf.train_flops, hf.tokens_per_sample) == (lib.params, lib.train_flops, lib.tokens_per_sample)
