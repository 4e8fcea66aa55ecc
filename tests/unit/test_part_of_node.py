"""Part of a node (`gpus_per_node`): the node's device count overridden, each GPU's intra-node
figures kept, the NICs that serve the GPUs used (their share, rounded up, at least one), the
whole instance's price; refused in one line beyond the node's GPUs, at 0 and on emulated
clusters; a whole node's configuration and prediction as before."""

from __future__ import annotations

import json

import pytest

from shardsim.cli import main
from shardsim.config import RunConfig, Strategy
from shardsim.core.errors import ConfigError
from shardsim.simulator.predict import predict
from shardsim.specs.hardware.topology import make_cluster


@pytest.mark.parametrize(
    ("topology", "gpus", "nics"),
    [("p4d.24xlarge", 2, 1), ("p4d.24xlarge", 4, 2), ("p4d.24xlarge", 1, 1), ("p5.48xlarge", 2, 8),
     ("g4dn.12xlarge", 2, 1)],
)  # fmt: skip
def test_the_gpus_used_get_their_share_of_the_nics_and_keep_their_links(topology, gpus, nics):
    whole, part = make_cluster(topology, 2), make_cluster(topology, 2, gpus)
    assert (part.devices_per_node, part.world, part.instance.nic.count) == (gpus, 2 * gpus, nics)
    assert part.instance.nic.rate_gbps == whole.instance.nic.rate_gbps
    assert part.instance.fabric == whole.instance.fabric  # each GPU's NVLink / NVSwitch port, the PCIe bridge
    assert part.price_per_hour_usd == whole.price_per_hour_usd  # the instance is billed whole
    assert "gpus_per_node" in part.instance.sources["device.count"]


def test_all_of_a_nodes_gpus_is_the_node():
    cfg = RunConfig(workload="gpt2-xl", topology="p4d.24xlarge", nodes=2, precision="bf16", strategy=Strategy("zero"))
    assert predict(cfg.replace(gpus_per_node=8)).step_time_s == predict(cfg).step_time_s
    assert "gpus_per_node" not in cfg.to_dict()  # unset: a configuration reads as before the setting
    assert cfg.replace(gpus_per_node=2).to_dict()["gpus_per_node"] == 2


def test_fewer_gpus_per_node_make_a_smaller_world():
    cfg = RunConfig(workload="gpt2-xl", topology="p4d.24xlarge", nodes=2, precision="bf16", gpus_per_node=2)
    p = predict(cfg)
    assert p.world == 4 and p.global_batch == 4 * cfg.batch_per_device


@pytest.mark.parametrize(
    ("topology", "gpus", "match"),
    [("p4d.24xlarge", 16, "16 exceeds the 8 GPUs of a p4d.24xlarge node"), ("emu-2x2", 1, "emulated cluster")],
)
def test_refused_in_one_line(topology, gpus, match):
    with pytest.raises(ConfigError, match=match) as err:
        predict(RunConfig(workload="tiny-gpt", topology=topology, nodes=2, gpus_per_node=gpus))
    assert err.value.field == "gpus_per_node"


def test_zero_is_refused_from_a_file_and_from_the_flag(tmp_path, capsys):
    with pytest.raises(ConfigError) as err:
        RunConfig(gpus_per_node=0)
    assert err.value.field == "gpus_per_node"
    for n in ("0", "9"):
        with pytest.raises(SystemExit) as exit_:
            raise SystemExit(main(["predict", "--topology", "p4d.24xlarge", "--gpus-per-node", n]))
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "gpus" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_flag_predicts_part_of_a_node(capsys):
    assert (
        main(["predict", "--workload", "gpt2-xl", "--topology", "p4d.24xlarge", "--gpus-per-node", "4", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["world"] == 4 and out["config"]["gpus_per_node"] == 4
