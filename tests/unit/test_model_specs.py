"""Model families are specs, not if-chains: every family's `ModelSpec` in its own module, the
simulator, config and runtime asking the spec rather than comparing family names; a llama-shaped
Hugging Face type is one mapper entry, and its parameter count matches its model card's."""

from __future__ import annotations

import ast
import json
import logging
import re
from pathlib import Path

import pytest

from shardsim.core.errors import ConfigError
from shardsim.runtime.models.builders import BUILDERS
from shardsim.runtime.models.checks import check_runtime_tp
from shardsim.specs.model import families
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.hf_config import read_hf_model
from shardsim.specs.model.registry import HF_TYPES, SPECS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "shardsim"
FAMILY_MODULES = Path(families.__file__).parent
HF = ROOT / "tests" / "fixtures" / "hf"

# Published parameter counts of the models whose config.json the fixtures hold (the published files'
# values): (count, where it is stated)
PUBLISHED = {
    "Qwen2-7B": (7.62e9, "huggingface.co/Qwen/Qwen2-7B: 7.62B params"),
    "Qwen3-8B": (8.2e9, "Qwen3-8B model card: Number of Parameters 8.2B"),
    "Mistral-7B-v0.1": (7.3e9, "Mistral AI, 'Announcing Mistral 7B': a 7.3B parameter model"),
    "gemma-2-9b": (9.242e9, "Gemma 2 report, table: 917,504,000 embedding + 8,324,201,984 non-embedding"),
    "gemma-3-4b-pt": (3.884e9, "Gemma 3 report, table 1, 4B: 675M embedding + 3,209M non-embedding (text)"),
    "Phi-3-mini-4k-instruct": (3.8e9, "Phi-3-mini-4k-instruct model card: 3.8B parameters"),
}


def _family_comparisons(path: Path) -> list[str]:
    """`x.family == ...`, `family in ...` (and != / not in) comparisons in a module, by line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        if not any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
            continue
        for side in (node.left, *node.comparators):
            name = side.attr if isinstance(side, ast.Attribute) else side.id if isinstance(side, ast.Name) else ""
            if name == "family":
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_family_name_is_compared_outside_its_own_module():
    offenders = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if FAMILY_MODULES not in path.parents
        for hit in _family_comparisons(path)
    ]
    assert offenders == []


def test_the_counter_finds_family_comparisons(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('if a.family == "vit" or family in ("mlp",):\n    pass\nif a.spec.embed == "patches":\n    pass\n')
    assert _family_comparisons(probe) == ["probe.py:1", "probe.py:1"]


def test_every_family_has_a_runtime_builder_and_no_other():
    assert set(BUILDERS) == set(SPECS)


def test_hugging_face_type_names_live_in_their_family_module_alone():
    """Adding a llama-shaped type touches one file: the name of a type that is not also a family's
    is written nowhere else in the package."""
    for kind, (family, _) in HF_TYPES.items():
        if kind in SPECS:
            continue
        word = re.compile(rf"(?<![\w-]){re.escape(kind)}(?![\w-])")
        holders = [p for p in PACKAGE.rglob("*.py") if word.search(p.read_text())]
        assert holders == [FAMILY_MODULES / f"{family}.py"], kind


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_a_config_json_counts_the_parameters_its_model_card_states(model):
    name, arch = read_hf_model(HF / model / "config.json")
    published, _ = PUBLISHED[model]
    assert name == model
    assert abs(from_arch(name, arch).params / published - 1) <= 0.01


@pytest.mark.parametrize(
    ("model", "fields"),
    [
        ("Qwen2-7B", {"qkv_bias": True, "qk_norm": False, "head_size": 0, "tied_embeddings": False}),
        ("Qwen3-8B", {"qkv_bias": False, "qk_norm": True, "head_size": 0, "kv_heads": 8}),
        ("gemma-2-9b", {"qk_norm": False, "head_size": 256, "tied_embeddings": True}),
        ("gemma-3-4b-pt", {"qk_norm": True, "head_size": 256, "tied_embeddings": True, "vocab": 262_208}),
        ("Phi-3-mini-4k-instruct", {"qkv_bias": False, "kv_heads": 32, "tied_embeddings": False}),
    ],
)
def test_each_type_reads_what_it_changes_of_the_llama_shape(model, fields):
    _, arch = read_hf_model(HF / model / "config.json")
    assert arch.family == "llama"
    assert {k: getattr(arch, k) for k in fields} == fields


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("Mistral-7B-v0.1", "sliding_window"),
        ("gemma-2-9b", "final_logit_softcapping"),
        ("gemma-3-4b-pt", "text_config.sliding_window"),
        ("gemma-3-4b-pt", "vision_config"),
    ],
)
def test_what_is_not_modelled_is_said_once(model, key, caplog):
    with caplog.at_level(logging.WARNING):
        read_hf_model(HF / model / "config.json")
    lines = [r.getMessage() for r in caplog.records if "not modelled" in r.getMessage()]
    assert len(lines) == 1
    assert key in lines[0].split(" accepted, ")[0].split(", ")


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_the_runtime_models_import_one_another_without_a_circle():
    folder = PACKAGE / "runtime" / "models"
    modules = {f"shardsim.runtime.models.{p.stem}": p for p in folder.glob("*.py") if p.stem != "__init__"}
    edges = {m: _imported_modules(p) & set(modules) - {m} for m, p in modules.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in edges[start])

    assert [m for m in modules if reaches(m, m, set())] == []


def _written(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def test_a_gemma3_file_without_its_text_model_is_one_line_naming_the_key(tmp_path):
    with pytest.raises(ConfigError) as err:
        read_hf_model(_written(tmp_path, {"model_type": "gemma3", "vision_config": {}}))
    assert err.value.field == "text_config"


def test_a_key_of_the_text_model_is_named_by_its_path(tmp_path):
    data = json.loads((HF / "gemma-3-4b-pt" / "config.json").read_text())
    data["text_config"]["num_attention_heads"] = 3  # does not divide the 4 key/value heads
    with pytest.raises(ConfigError) as err:
        read_hf_model(_written(tmp_path, data))
    assert err.value.field == "text_config.num_key_value_heads"


def test_an_unknown_model_type_lists_the_supported_ones(tmp_path):
    with pytest.raises(ConfigError) as err:
        read_hf_model(_written(tmp_path, {"model_type": "qwen9"}))
    assert all(t in err.value.message for t in ("qwen2", "qwen3", "gemma2", "gemma3", "phi3", "mistral"))


def test_the_runtime_refuses_q_k_norms_under_tensor_parallelism_in_one_line():
    _, arch = read_hf_model(HF / "Qwen3-8B" / "config.json")
    with pytest.raises(ConfigError) as err:
        check_runtime_tp(arch, 2)
    assert err.value.field == "tp"
    check_runtime_tp(arch, 1)
