"""Shipped topology files: they parse, every figure carries a source, and a few facts hold."""

from __future__ import annotations

import pytest
import yaml

from shardsim.simulator.collective import simulate_collective
from shardsim.simulator.hardware.topology import builtin_topologies, builtin_topology_dir, load_instance, make_cluster

SHIPPED = builtin_topologies()
EMULATED = ("emu-2x2", "emu-4x2")
EXPECTED = ("g4dn.12xlarge", "g4dn.metal", "p3dn.24xlarge", "p4d.24xlarge", "p5.48xlarge", *EMULATED)


def _raw(name: str) -> dict:
    return yaml.safe_load((builtin_topology_dir() / f"{name}.yaml").read_text())


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def unsourced_figures(node: object, path: str = "") -> list[str]:
    """Paths of numeric leaves not written as {value: X, source: "..."} with a non-empty source."""
    bad: list[str] = []
    if isinstance(node, dict):
        if "value" in node:
            src = node.get("source")
            if not _is_number(node["value"]):
                bad.append(f"{path}: value is not a number ({node['value']!r})")
            if not isinstance(src, str) or not src.strip():
                bad.append(f"{path}: missing or empty source")
            extra = set(node) - {"value", "source"}
            if extra:
                bad.append(f"{path}: unexpected keys {sorted(extra)}")
            return bad
        for key, child in node.items():
            bad += unsourced_figures(child, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            bad += unsourced_figures(child, f"{path}[{i}]")
    elif _is_number(node):
        bad.append(f"{path}: bare number {node!r} (write it as {{value, source}})")
    return bad


def test_expected_files_are_shipped():
    assert set(EXPECTED) <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_loads_by_name(name):
    inst = load_instance(name)
    assert inst.name == name
    assert inst.device.count >= 1 and inst.nic.count >= 1
    assert inst.device.peak_tflops and set(inst.device.matmul_efficiency) == set(inst.device.peak_tflops)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_figure_has_a_source(name):
    assert unsourced_figures(_raw(name)) == []


def test_checker_flags_bare_and_unsourced_numbers():
    raw = {
        "name": "x",
        "device": {"count": 8, "model": "m", "memory_gib": {"value": 16, "source": ""}},
        "nic": {"count": {"value": 1, "source": "ok"}, "rate_gbps": {"value": 100}},
        "emulated": {"subnet": "10.0.0.0/24", "nodes": True},
    }
    bad = unsourced_figures(raw)
    assert any(b.startswith("device.count:") for b in bad)
    assert any(b.startswith("device.memory_gib:") for b in bad)
    assert any(b.startswith("nic.rate_gbps:") for b in bad)
    assert len(bad) == 3  # strings and booleans are not figures; nic.count is fine


def test_p4d_facts():
    inst = load_instance("p4d.24xlarge")
    assert inst.device.count == 8
    assert inst.nic.count == 4
    assert inst.fabric.kind == "nvswitch"
    assert inst.device.supports("bf16")
    assert inst.fabric.efficiency == pytest.approx(230.8 / 300, abs=1e-3)


def test_p4d_single_node_allreduce_reproduces_its_calibration():
    # NVIDIA/nccl #527: 230.8 GB/s busbw, 1 GiB all-reduce on one p4d node
    r = simulate_collective(make_cluster("p4d.24xlarge", 1), "all_reduce", 1 << 30)
    assert r.busbw_GBps == pytest.approx(230.8, rel=0.02)


def test_g4dn_facts():
    small, metal = load_instance("g4dn.12xlarge"), load_instance("g4dn.metal")
    assert small.device.count == 4
    assert metal.device.count == 8
    for inst in (small, metal):
        assert inst.fabric.kind == "pcie" and inst.fabric.shared_GBps
        assert not inst.device.supports("bf16")


def test_no_bf16_on_volta():
    assert not load_instance("p3dn.24xlarge").device.supports("bf16")


@pytest.mark.parametrize("name", EMULATED)
def test_emulated_have_block_and_no_price(name):
    raw = _raw(name)
    assert "emulated" in raw
    assert "price_per_hour_usd" not in raw
    inst = load_instance(name)
    assert inst.emulated is not None and inst.price_per_hour_usd is None
    assert inst.device.kind == "cpu" and inst.fabric.kind == "loopback"
    assert make_cluster(name).nodes == inst.emulated.nodes


def test_emulated_subnets_differ():
    subnets = [load_instance(n).emulated.subnet for n in EMULATED]
    assert len(set(subnets)) == len(subnets)


@pytest.mark.parametrize("name", [n for n in EXPECTED if n not in EMULATED])
def test_cloud_instances_have_a_price_and_no_emulation(name):
    inst = load_instance(name)
    assert inst.emulated is None
    assert inst.price_per_hour_usd and inst.price_per_hour_usd > 0
