"""Shipped topology files: they parse, every figure carries a source, and a few facts hold."""

from __future__ import annotations

import re

import pytest
import yaml

from shardsim.simulator.collective import simulate_collective
from shardsim.specs.hardware.topology import builtin_topologies, builtin_topology_dir, load_instance, make_cluster

SHIPPED = builtin_topologies()
EMULATED = ("emu-2x2", "emu-4x2")
AWS_GPU = (
    "g4dn.12xlarge",
    "g4dn.metal",
    "p3dn.24xlarge",
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.48xlarge",
    "p5e.48xlarge",
    "p5en.48xlarge",
)
PRICED = tuple(n for n in AWS_GPU if n != "p5e.48xlarge")  # p5e.48xlarge: no on-demand price listed
EXPECTED = (*AWS_GPU, "a100-40gb-roce", *EMULATED)
EC2_NAME = re.compile(r"^[a-z][a-z0-9-]*\.(\d*x?large|metal)$")  # an EC2 instance type: family.size
# The figures NCCL's cost model and the network model read besides the rates; an AWS GPU instance
# type must give each with its source (the loader's defaults would silently describe another machine).
NETWORK_FIELDS = (
    "fabric.generation",
    "fabric.nvls",
    "nic.fabric",
    "nic.generation",
    "nic.gpudirect_rdma",
    "host.cpu_vendor",
)


def _raw(name: str) -> dict:
    return yaml.safe_load((builtin_topology_dir() / f"{name}.yaml").read_text())


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_figure_value(x: object) -> bool:
    """A figure's value: a number, a sourced fact (true/false, a non-empty name) such as fabric.nvls,
    or a sourced table of numbers such as fabric.nvlink_mesh."""
    table = isinstance(x, list) and bool(x) and all(isinstance(r, list) and all(map(_is_number, r)) for r in x)
    return _is_number(x) or isinstance(x, bool) or (isinstance(x, str) and bool(x.strip())) or table


def unsourced_figures(node: object, path: str = "") -> list[str]:
    """Paths of numeric leaves not written as {value: X, source: "..."} with a non-empty source, and of
    {value, source} pairs whose value is neither a number, a boolean nor a non-empty string."""
    bad: list[str] = []
    if isinstance(node, dict):
        if "value" in node:
            src = node.get("source")
            if not _is_figure_value(node["value"]):
                bad.append(f"{path}: value is not a number, boolean or name ({node['value']!r})")
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
        "fabric": {"nvls": {"value": True, "source": ""}, "generation": {"value": "", "source": "ok"}},
        "host": {"cpu_vendor": {"value": "intel", "source": "ok"}},
    }
    bad = unsourced_figures(raw)
    assert any(b.startswith("device.count:") for b in bad)
    assert any(b.startswith("device.memory_gib:") for b in bad)
    assert any(b.startswith("nic.rate_gbps:") for b in bad)
    assert any(b.startswith("fabric.nvls:") for b in bad)  # a sourced fact needs its source too
    assert any(b.startswith("fabric.generation:") for b in bad)  # and a value
    assert len(bad) == 5  # bare strings and booleans are not figures; nic.count and host.cpu_vendor are fine


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


@pytest.mark.parametrize("name", PRICED)
def test_cloud_instances_have_a_price_and_no_emulation(name):
    inst = load_instance(name)
    assert inst.emulated is None
    assert inst.price_per_hour_usd and inst.price_per_hour_usd > 0


def test_the_aws_gpu_instance_types_are_the_shipped_ec2_names():
    shipped = {n for n in SHIPPED if EC2_NAME.match(n) and load_instance(n).device.kind == "gpu"}
    assert shipped == set(AWS_GPU)


@pytest.mark.parametrize("name", AWS_GPU)
def test_aws_gpu_instances_give_the_network_fields_with_sources(name):
    inst = load_instance(name)
    missing = [f for f in NETWORK_FIELDS if not inst.sources.get(f, "").strip()]
    assert missing == []
    assert inst.nic.fabric == "efa" and inst.nic.generation in ("EFA v1", "EFA v2", "EFA v3")
    assert inst.fabric.generation


# name: (NVLink SHARP, EFA generation, GPUDirect RDMA, CPU vendor, NICs, Gbps per NIC)
AWS_FACTS = {
    "g4dn.12xlarge": (False, "EFA v1", False, "intel", 1, 50),
    "g4dn.metal": (False, "EFA v1", False, "intel", 1, 100),
    "p3dn.24xlarge": (False, "EFA v1", False, "intel", 1, 100),
    "p4d.24xlarge": (False, "EFA v1", True, "intel", 4, 100),
    "p4de.24xlarge": (False, "EFA v1", True, "intel", 4, 100),
    "p5.48xlarge": (True, "EFA v2", True, "amd", 32, 100),
    "p5e.48xlarge": (True, "EFA v2", True, "amd", 32, 100),
    "p5en.48xlarge": (True, "EFA v3", True, "intel", 16, 200),
}


@pytest.mark.parametrize("name", AWS_GPU)
def test_aws_network_facts(name):
    nvls, efa, gdr, vendor, nics, gbps = AWS_FACTS[name]
    inst = load_instance(name)
    assert (inst.fabric.nvls, inst.nic.generation, inst.nic.gpudirect_rdma) == (nvls, efa, gdr)
    assert (inst.host.cpu_vendor, inst.nic.count, inst.nic.rate_gbps) == (vendor, nics, gbps)


def test_h200_instances_share_the_h100_die_and_differ_in_memory():
    h100 = load_instance("p5.48xlarge").device
    for name in ("p5e.48xlarge", "p5en.48xlarge"):
        h200 = load_instance(name).device
        assert h200.kernels == h100.kernels and h200.peak_tflops == h100.peak_tflops
        assert h200.memory_gib > 1.7 * h100.memory_gib and h200.memory_bandwidth_GBps == 4800
    # the same 3200 Gbps per node, as 32 x 100 and as 16 x 200 Gbps
    for name in ("p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"):
        nic = load_instance(name).nic
        assert nic.count * nic.rate_gbps == 3200


def test_the_roce_cluster_is_not_efa():
    inst = load_instance("a100-40gb-roce")
    assert inst.nic.fabric == "roce" and not inst.fabric.nvls
