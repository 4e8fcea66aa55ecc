"""Calibration input a real team has: runs on part of a node, one file mixing node and GPU
counts, topologies of one device and throughput metrics, every read column used or refused."""

from __future__ import annotations

import numpy as np
import pytest

from shardsim.cli import main
from shardsim.config import build_config
from shardsim.simulator.calibration import fit as F
from shardsim.simulator.calibration.measurements import read_measurements
from shardsim.simulator.predict import predict
from shardsim.specs.hardware.topology import load_instance
from tests.unit.test_calibration import write_csv

TOPOLOGY = "a100-40gb-roce"  # 8 A100 40GB a node; p4d.24xlarge holds the same device
MODEL = {"family": "mpt", "hidden": 256, "layers": 2, "heads": 4, "ffn": 1024, "vocab": 1000, "seq_len": 128}
BASE = MODEL | {"precision": "bf16", "batch_per_device": 2, "strategy": "zero"}
FASTER = 1.1  # the rows measure the model's own prediction this much faster


def _predicted(topology: str, nodes: int, gpus_per_node: int | None):
    shape = {k: v for k, v in MODEL.items() if k != "family"}
    values = {"workload": {"family": "mpt"} | shape, "topology": topology, "nodes": nodes} | {
        k: v for k, v in BASE.items() if k not in MODEL
    }
    return predict(build_config(values | ({"gpus_per_node": gpus_per_node} if gpus_per_node else {}), "test"))


# (columns of the row, topology, nodes, GPUs a node it ran on, the metric it gives)
ROWS = [
    ({"gpus": 1, "gpus_per_node": 8}, TOPOLOGY, 1, 1, "tokens_per_s_per_gpu"),  # llm-foundry: the node's GPUs
    ({"gpus": 2}, TOPOLOGY, 1, 2, "tokens_per_s"),
    ({"gpus": 4}, TOPOLOGY, 1, 4, "samples_per_s"),
    ({"gpus": 8, "gpus_per_node": 4}, TOPOLOGY, 2, 4, "step_time_s"),  # 4 GPUs of each of 2 nodes
    ({"nodes": 2}, TOPOLOGY, 2, 8, "tokens_per_s_per_gpu"),
    ({"gpus": 16, "topology": "p4d.24xlarge"}, "p4d.24xlarge", 2, 8, "samples_per_s"),
]


def _measured(metric: str, pred, world: int) -> float:
    tokens = pred.samples_per_s * MODEL["seq_len"] * FASTER
    return {
        "tokens_per_s_per_gpu": tokens / world,
        "tokens_per_s": tokens,
        "samples_per_s": pred.samples_per_s * FASTER,
        "step_time_s": pred.step_time_s / FASTER,
    }[metric]


def test_one_file_of_part_nodes_whole_nodes_topologies_and_metrics(tmp_path):
    rows = []
    for cols, topology, nodes, per_node, metric in ROWS:
        pred = _predicted(topology, nodes, per_node if per_node < 8 else None)
        rows.append(BASE | cols | {metric: _measured(metric, pred, nodes * per_node)})
    path = write_csv(tmp_path / "mixed.csv", rows)
    inst = load_instance(TOPOLOGY)
    read = read_measurements(path, TOPOLOGY, inst)
    for m, (_, topology, nodes, per_node, metric) in zip(read, ROWS, strict=True):
        assert (m.nodes, m.world, m.metric, m.instance.name) == (nodes, nodes * per_node, metric, topology)
        assert m.cfg.gpus_per_node == (per_node if per_node < 8 else None)
    # each row is predicted as what it ran on: the model's own prediction, measured FASTER
    assert np.allclose(F.ratios(inst, read, {}), 1 / FASTER, rtol=1e-6)


def test_several_metrics_of_a_row_are_used_together(tmp_path):
    pred = _predicted(TOPOLOGY, 1, None)
    both = {m: _measured(m, pred, 8) for m in ("tokens_per_s_per_gpu", "tokens_per_s", "samples_per_s", "step_time_s")}
    path = write_csv(tmp_path / "all.csv", [BASE | {"gpus": 8, "global_batch": 16} | both])
    (m,) = read_measurements(path, TOPOLOGY, load_instance(TOPOLOGY))
    assert m.metric == "step_time_s" and m.measured == pytest.approx(both["step_time_s"])


def _refused(tmp_path, capsys, row: dict) -> str:
    path = write_csv(tmp_path / "bad.csv", [BASE | {"tokens_per_s_per_gpu": 1000.0} | row])
    assert main(["calibrate", str(path), "--topology", TOPOLOGY, "--folds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shardsim: error: "), err
    return err


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"gpus": 12}, "field 'gpus': 12 devices do not fill whole nodes of a100-40gb-roce (8 devices each)"),
        ({"gpus": 16, "gpus_per_node": 16}, "field 'gpus_per_node': 16 GPUs per node; topology a100-40gb-roce has 8"),
        ({"gpus": 8, "nodes": 2}, "field 'nodes': 2 nodes, but 8 devices at 8 a node fill 1"),
        ({"gpus": 8, "world": 8}, "field 'world': the devices are given twice: gpus and world"),
        ({"gpus": 6, "gpus_per_node": 3}, "field 'gpus_per_node': expected a power of two"),
        ({"gpus": 4, "topology": "g4dn.12xlarge"}, "field 'topology': measured on g4dn.12xlarge (NVIDIA T4); the"),
        ({"gpus": 8, "tokens_per_s": 9000.0}, "field 'tokens_per_s': 9000 disagrees with tokens_per_s_per_gpu 1000"),
        ({"gpus": 8, "samples_per_s": 0.0}, "field 'samples_per_s': expected a finite number from"),
        ({"gpus": 8, "global_batch": 64}, "field 'global_batch': 64 samples; the configuration's global batch is 16"),
    ],
)
def test_a_row_whose_columns_cannot_all_be_used_is_refused_in_one_line(tmp_path, capsys, row, says):
    err = _refused(tmp_path, capsys, row)
    assert "bad.csv line 2: " + says in err, err


def test_a_row_on_the_fits_own_topology_is_predicted_on_the_instance_given(tmp_path):
    """A row on the fit's topology is predicted on the instance the caller passes: the roofline's
    copy without kernel figures predicts differently from the kernels' (compare.py's columns)."""
    from dataclasses import replace
    from pathlib import Path

    inst = load_instance("a100-40gb-roce")
    csv = Path(__file__).resolve().parents[2] / "experiments/calibration/data/mpt-a100-40gb.csv"
    rows = read_measurements(csv, "a100-40gb-roce", inst)[:2]
    roofline = replace(inst, device=replace(inst.device, kernels=None))
    assert list(F.ratios(roofline, rows, {})) != list(F.ratios(inst, rows, {}))
