"""The emulated cluster's plan (runtime/emulation/plan.py: namespaces, addresses, rates, torchrun's
arguments) and its refusals without root or iproute2, in-process: nothing is brought up (that,
as root: tests/integration/test_emulation.py)."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import shutil
import sys

import pytest

from shardsim.cli import cluster as cluster_cli
from shardsim.core.errors import ConfigError
from shardsim.runtime.emulation.namespaces import down, up
from shardsim.runtime.emulation.plan import plan_cluster
from shardsim.runtime.emulation.processes import node_env, torchrun_argv
from shardsim.runtime.emulation.status import status
from shardsim.specs.hardware.topology import load_instance

TAG = f"t{os.getpid()}"  # our own names: a cluster someone else has up on this machine is left alone


def test_plan_names_addresses_and_rate():
    c = plan_cluster(load_instance("emu-2x2"))
    assert c.namespaces == ("ss-emu-2x2-n0", "ss-emu-2x2-n1", "ss-emu-2x2-br")
    assert c.rate_bps == 200_000_000 and c.ranks_per_node == 2 and c.world == 4
    net = ipaddress.ip_network("10.213.0.0/24")
    addrs = [n.address for n in c.nodes]
    assert len(set(addrs)) == 2 and all(ipaddress.ip_address(a) in net for a in addrs)
    assert c.master_addr == c.nodes[0].address == "10.213.0.1"
    assert c.burst_bytes >= c.mtu + 14  # the bucket holds a full frame
    for n in c.nodes:
        assert len(n.ifname) <= 15 and len(n.peer_ifname) <= 15  # IFNAMSIZ
    c4 = plan_cluster("emu-4x2", tag="x")
    assert len(c4.nodes) == 4 and c4.rate_bps == 300_000_000 and c4.nodes[3].address == "10.213.1.4"
    assert c4.prefix == "ss-x-emu-4x2" and all(ns.startswith("ss-x-emu-4x2-") for ns in c4.namespaces)
    assert "tbf" in c4.tbf_args() and "300000000bit" in c4.tbf_args()


def test_plan_refuses_non_emulated_and_bad_counts():
    with pytest.raises(ConfigError, match="not emulated") as err:
        plan_cluster(load_instance("p4d.24xlarge"))
    assert "\n" not in str(err.value)
    inst = load_instance("emu-2x2")
    with pytest.raises(ConfigError, match="node count"):
        plan_cluster(inst, 0)
    tiny = dataclasses.replace(inst, emulated=dataclasses.replace(inst.emulated, subnet="10.9.0.0/30"))
    assert len(plan_cluster(tiny, 2).nodes) == 2
    with pytest.raises(ConfigError, match="too few for 3 nodes"):
        plan_cluster(tiny, 3)


def test_torchrun_argv():
    c = plan_cluster("emu-2x2")
    argv = torchrun_argv(c, 1, ["-m", "shardsim.runtime.train", "--steps", "3"], master_port=29600)
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    joined = " ".join(argv)
    assert "--nnodes 2 --node_rank 1 --nproc_per_node 2 --master_addr 10.213.0.1 --master_port 29600" in joined
    assert joined.endswith("--module shardsim.runtime.train --steps 3")
    assert node_env(c, 1, {"X": "1"})["GLOO_SOCKET_IFNAME"] == "nic0"


def test_refuses_without_root_or_tools(monkeypatch):
    c = plan_cluster("emu-2x2", tag=TAG)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for fn in (up, down, status):
        with pytest.raises(ConfigError, match="needs root") as err:
            fn(c)
        assert "\n" not in str(err.value)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else real_which(tool))
    with pytest.raises(ConfigError, match="needs `tc`"):
        up(c)


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    p = argparse.ArgumentParser(prog="shardsim")
    cluster_cli.register(p.add_subparsers(dest="command", required=True))
    ns = p.parse_args(argv)
    try:
        rc = ns.func(ns)
    except ConfigError as exc:  # as runtime.cli.main does
        print(f"shardsim: error: {exc}", file=sys.stderr)
        rc = 2
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_refusals(capsys, monkeypatch):
    rc, _, err = _cli(["cluster", "up", "p4d.24xlarge"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "not emulated" in err
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    rc, _, err = _cli(["cluster", "status", "emu-2x2"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "needs root" in err
