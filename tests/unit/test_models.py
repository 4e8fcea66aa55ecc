"""Describing models without Python: the library and its published counts, model YAML files,
inline mappings, Hugging Face config.json files, shape flags, and bad input."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from shardsim.config import load_config
from shardsim.core.errors import ConfigError
from shardsim.simulator.predict import predict
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.model.arch import Arch, Shape
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.hf_config import read_hf_config
from shardsim.specs.model.library import library

PUBLISHED = [name for name, m in library().items() if m.published_params]
# The CPU-sized and shardsim's own shapes keep their parameter counts and training FLOPs (causal
# attention now counted as half the s*s products: the FLOPs of the gpt ones fall by that much).
KEPT = {
    "gpt-10b": 10593587200,
    "gpt-100b": 101724200960,
    "tiny-gpt": 234880,
    "small-gpt": 8448512,
    "tiny-vit": 214218,
    "tiny-mlp": 133002,
    "mlp-4x16k": 541049832,
    "vit-630m": 631828456,
}
BIDIRECTIONAL_TRAIN_FLOPS = {
    "tiny-vit": 21880064.0,
    "vit-630m": 772091097088.0,
    "tiny-mlp": 757504.0,
    "tiny-gpt": 44564480.0,
}

SMALL_HF = {
    "llama": {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "vocab_size": 256,
        "max_position_embeddings": 32,
        "tie_word_embeddings": False,
    },
    "mistral": {
        "model_type": "mistral",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "intermediate_size": 160,
        "vocab_size": 300,
        "max_position_embeddings": 64,
        "tie_word_embeddings": True,
    },
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 32},
    "gpt_neox": {
        "model_type": "gpt_neox",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "vocab_size": 256,
        "max_position_embeddings": 32,
        "tie_word_embeddings": False,
    },
    "mpt": {"model_type": "mpt", "d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 256, "max_seq_len": 32},
    "vit": {
        "model_type": "vit",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "image_size": 32,
        "patch_size": 8,
        "num_labels": 10,
    },
    "bert": {
        "model_type": "bert",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "vocab_size": 256,
        "max_position_embeddings": 32,
        "type_vocab_size": 2,
    },
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_library_count_is_the_published_one(name: str) -> None:
    m = library()[name]
    got = from_arch(name, m.arch).params
    assert abs(got / m.published_params - 1) <= 0.005, (name, got, m.published_params)
    assert m.source and m.params_source


def test_every_library_model_names_its_source() -> None:
    assert {"llama-3.1-8b", "llama-3.1-405b", "mistral-7b", "mpt-30b", "gpt-neox-20b", "bert-large"} <= set(library())
    assert all(m.source for m in library().values())


@pytest.mark.parametrize(("name", "params"), KEPT.items())
def test_existing_models_keep_their_parameter_counts(name: str, params: int) -> None:
    w = load_workload(name)
    assert w.params == params
    if name in BIDIRECTIONAL_TRAIN_FLOPS and w.arch.family != "gpt":
        assert w.train_flops == BIDIRECTIONAL_TRAIN_FLOPS[name]  # bidirectional: unchanged


def test_workloads_cli_lists_families_and_counts() -> None:
    out = subprocess.run([sys.executable, "-m", "shardsim.cli", "workloads"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "llama-3.1-8b " in x)
    assert "llama" in line and "8.030 B" in line and " 32 " in line and "embedding, head" in line


def test_inline_mapping_and_flags_give_the_same_model(tmp_path: Path) -> None:
    text = "{family: llama, hidden: 4096, layers: 32, heads: 32, kv_heads: 8, ffn: 14336, vocab: 128256, seq_len: 8192}"
    cfg = load_config(None, {"workload": text, "seq_len": 4096})
    assert isinstance(cfg.workload, Arch) and cfg.shape == Shape(seq_len=4096)
    assert pickle.loads(pickle.dumps(cfg)) == cfg and hash(cfg)
    w = load_workload(cfg.workload, cfg.shape)
    lib = load_workload("llama-3.1-8b", Shape(seq_len=4096))
    assert w.params == lib.params and w.train_flops == lib.train_flops
    assert lib.name == "llama-3.1-8b seq_len=4096"
    f = tmp_path / "run.yaml"
    f.write_text(f"workload: {text}\nseq_len: 4096\ntopology: p5.48xlarge\nnodes: 1\nbackend: nccl\n")
    assert load_config(f).workload == cfg.workload


def test_model_yaml_file(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text("family: mpt\nhidden: 256\nlayers: 4\nheads: 8\nvocab: 1000\nseq_len: 128\ntied_embeddings: true\n")
    w = load_workload(str(f), Shape(layers=6))
    assert len(w.layers) == 6 and w.arch.family == "mpt"


def test_predict_json_reports_params() -> None:
    cfg = load_config(
        None,
        {"workload": "llama-3.1-8b", "topology": "p5.48xlarge", "nodes": 1, "precision": "bf16", "seq_len": 8192},
    )
    p = predict(cfg)
    assert p.params == load_workload("llama-3.1-8b").params
    assert json.loads(p.to_json())["params"] == p.params


@pytest.mark.parametrize("kind", SMALL_HF)
def test_hf_config_builds_the_same_shapes(kind: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from shardsim.runtime.models.builders import build_model

    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL_HF[kind]))
    arch = read_hf_config(path)
    with torch.device("meta"):
        ours = sum(p.numel() for p in build_model(arch).parameters())
    assert ours == load_workload(str(path)).params
    transformers = pytest.importorskip("transformers")
    conf = transformers.AutoConfig.for_model(**SMALL_HF[kind])
    with torch.device("meta"):
        if kind == "vit":
            theirs = transformers.ViTForImageClassification(conf)
        elif kind == "bert":
            theirs = transformers.BertForMaskedLM(conf)
        else:
            theirs = transformers.AutoModelForCausalLM.from_config(conf)
    n = sum(p.numel() for p in theirs.parameters())
    if kind == "bert":
        # left out of the bert family (named in arch.TRAITS): token types, the embedding
        # LayerNorm, the MLM head's transform (dense, LayerNorm) and its output bias; pre-LN
        # adds a final LayerNorm that post-LN BERT has not
        h = arch.hidden
        ours += conf.type_vocab_size * h + 2 * h + (h * h + h + 2 * h) + arch.vocab - 2 * h
    assert ours == n


@pytest.mark.parametrize(
    ("mapping", "field"),
    [
        ({"family": "rnn", "hidden": 64, "layers": 2}, "workload.family"),
        ({"family": "gpt", "hidden": 64, "layers": 2, "heads": 5, "seq_len": 8, "vocab": 10}, "workload.heads"),
        (
            {"family": "llama", "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 3, "seq_len": 8, "vocab": 10},
            "workload.kv_heads",
        ),
        ({"family": "gpt", "layers": 2, "heads": 4, "seq_len": 8, "vocab": 10}, "workload.hidden"),
        ({"family": "gpt", "hidden": 64, "layers": 2, "heads": 4, "seq_len": 8, "vocab": -1}, "workload.vocab"),
        ({"family": "gpt", "hidden": 64, "layers": 2, "heads": 4, "vocab": 10}, "workload.seq_len"),
        ({"family": "gpt", "hidden": 64, "layers": 2, "depth": 4}, "workload.depth"),
    ],
)
def test_bad_inline_model_names_the_field_and_file(tmp_path: Path, mapping: dict, field: str) -> None:
    f = tmp_path / "run.yaml"
    f.write_text(json.dumps({"workload": mapping}))
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert err.value.field == field and err.value.where == str(f)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"model_type": "t5"}, "model_type"),
        ({"num_attention_heads": 5}, "num_attention_heads"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"hidden_size": None}, "hidden_size"),
        ({"intermediate_size": -4}, "intermediate_size"),
    ],
)
def test_bad_hf_config_names_the_field_and_file(tmp_path: Path, patch: dict, field: str) -> None:
    data = {**SMALL_HF["llama"], **patch}
    f = tmp_path / "config.json"
    f.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    with pytest.raises(ConfigError) as err:
        load_workload(str(f))
    assert err.value.field == field and err.value.where == str(f)


def test_bad_shape_flag_and_unknown_name() -> None:
    with pytest.raises(ConfigError) as err:
        load_workload("llama-3.1-8b", Shape(kv_heads=5))
    assert err.value.field == "kv_heads"
    with pytest.raises(ConfigError) as err:
        load_config(None, {"seq_len": 0})
    assert err.value.field == "seq_len"
    with pytest.raises(ConfigError, match="unknown workload"):
        load_workload("llama-9")


def test_bad_model_exits_2_through_the_cli(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "t5"}))
    out = subprocess.run(
        [sys.executable, "-m", "shardsim.cli", "predict", "--workload", str(f)], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert str(f) in out.stderr and "model_type" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_the_ranks_json_carries_an_inline_model_and_shape(tmp_path) -> None:
    """The launcher hands each rank the configuration as JSON: an inline model as its fields."""
    from shardsim.config.load import load_config_json
    from shardsim.runtime.launch import write_config

    text = "{family: llama, hidden: 64, layers: 2, heads: 4, kv_heads: 2, vocab: 128, seq_len: 16}"
    cfg = load_config(None, {"workload": text, "seq_len": 8, "topology": "emu-2x2", "backend": "gloo"})
    again = load_config_json(write_config(tmp_path, cfg))
    assert again.workload == cfg.workload and again.shape == cfg.shape
