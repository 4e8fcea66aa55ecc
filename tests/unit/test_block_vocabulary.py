"""One vocabulary for a model's parts everywhere: "layers" are its transformer (or MLP) layers,
and where the embedding and head count too, the words say so."""

from __future__ import annotations

import re

import pytest

from shardsim.cli import main


def _listed_layers(capsys, model: str) -> tuple[int, str]:
    assert main(["workloads"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if f" {model} " in x)
    cells = [c.strip() for c in line.strip("│ ").split("│")]
    return int(cells[3]), cells[4]


@pytest.mark.parametrize(("model", "others"), [("tiny-gpt", "embedding, head"), ("tiny-mlp", "head")])
def test_workloads_counts_layers_as_the_pipeline_check_does(capsys, monkeypatch, model, others):
    monkeypatch.delenv("COLUMNS", raising=False)
    layers, listed_others = _listed_layers(capsys, model)
    assert listed_others == others
    argv = ["predict", "--workload", model, "--strategy", "pipeline", "--topology", "p4d.24xlarge", "--nodes", "1"]
    assert main([*argv, "--pp", str(2 * layers)]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"exceeds the model's {layers} layers\b", err) and "blocks" not in err
    assert main([*argv, "--pp", str(layers), "--microbatches", str(layers)]) == 0  # as many stages as layers


def test_the_help_speaks_of_layers_where_it_means_them(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "every k-th layer" in text and "checkpointing of the layers" in text and "k-th block" not in text
