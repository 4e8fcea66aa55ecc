"""A pipeline that does not fit: predict answers (with and without --json, from flags or a
SageMaker block) and its hint names what helps a pipeline: more stages, smaller microbatches,
its stages sharded, a smaller batch."""

from __future__ import annotations

import json

import pytest

from shardsim.cli import main
from shardsim.config import load_config
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import make_cluster
from shardsim.sweep.hints import fit_hint, required_gib

FLAGS = ["--workload", "llama-3.1-8b", "--topology", "p4d.24xlarge", "--nodes", "2", "--precision", "bf16"]
SMP = """workload: llama-3.1-8b
instance_type: ml.p4d.24xlarge
instance_count: 2
precision: bf16
distribution:
  smdistributed:
    modelparallel:
      enabled: true
      parameters:
        {key}: 2
"""


def _argvs(tmp_path) -> list[list[str]]:
    argvs = [["predict", *FLAGS, "--strategy", "pipeline", "--pp", "2"]]
    argvs.append([*argvs[0], "--batch-per-device", "4"])
    for key in ("pipeline_parallel_degree", "partitions"):
        path = tmp_path / f"{key}.yaml"
        path.write_text(SMP.format(key=key))
        argvs.append(["predict", str(path)])
    return argvs


def test_a_pipeline_that_does_not_fit_is_predicted_with_a_hint(tmp_path, capsys) -> None:
    for argv in _argvs(tmp_path):
        assert main(argv) == 0, argv
        out, err = capsys.readouterr()
        assert err == "" and "DOES NOT FIT" in out, err
        hint = next(line for line in out.splitlines() if line.strip().startswith("to fit"))
        assert "stages sharded over 8" in hint, hint
        if "--batch-per-device" in argv:  # 4 a device: no one change is enough, and the hint names each it tried
            assert "pp 4 x 2 microbatches" in hint and "microbatches of 1" in hint and "combine them" in hint, hint
        else:  # the language model's default batch (1): sharding the stages fits
            assert "it fits with stages sharded over 8" in hint, hint
        assert main([*argv, "--json"]) == 0, argv
        assert json.loads(capsys.readouterr().out)["fits"] is False


@pytest.mark.parametrize(
    ("settings", "change"),
    [
        ({"workload": "gpt2-xl", "batch_per_device": 8}, "pp 8 x 4 microbatches"),  # the fewest stages that fit
        ({"workload": "bert-large", "batch_per_device": 32, "pp": 4}, "2 microbatches of 64"),
    ],
)
def test_the_hint_names_a_pipeline_change_that_fits(settings, change) -> None:
    cfg = load_config(None, {"topology": "g4dn.12xlarge", "nodes": 2, "strategy": "pipeline", "pp": 2} | settings)
    cluster = make_cluster(cfg.topology, cfg.nodes)
    w = load_workload(cfg.workload, cfg.shape, cfg.source)
    assert required_gib(cfg, cluster, w) > cluster.instance.device.memory_gib
    hint = fit_hint(cfg, cluster, w)
    assert hint.startswith("it fits with") and change in hint, hint
