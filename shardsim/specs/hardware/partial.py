"""Part of a node: `gpus_per_node` of an instance type's GPUs used on each node (1, 2 or 4 of
an 8-GPU instance), as `make_cluster` builds it. Assumptions, named:

- intra-node links: each GPU keeps its own NVLink / NVSwitch port and its figures (a GPU's
  ports do not depend on how many of the node's GPUs a job uses); a PCIe host bridge shared
  node-wide keeps its bandwidth (shared by fewer GPUs).
- NICs: the GPUs used get the NICs that serve them (AWS's GPU instances attach NICs per PCIe
  switch, a fixed number per GPU: p4d one EFA per two GPUs, p5 four per GPU), so the node's NIC
  count scales with the share of its GPUs, rounded up, at least one, at the same rate per NIC
  (g4dn.12xlarge's one NIC stays whole with 2 of its 4 GPUs).
- host: its cores and memory unchanged (used by emulation only, which part of a node is not).
- price: unchanged, the whole instance's: AWS bills the instance, whatever share of its GPUs
  a job uses.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from shardsim.core.errors import ConfigError

if TYPE_CHECKING:
    from shardsim.specs.hardware.topology import InstanceType

FIELD = "gpus_per_node"


def part_of_node(inst: InstanceType, gpus: int) -> InstanceType:
    """`inst` with `gpus` of its devices per node and their share of its NICs; ConfigError
    (field gpus_per_node) when `gpus` is not between 1 and the node's GPUs, or the topology is
    not an instance type's GPUs."""
    dev = inst.device
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"expected an integer >= 1, got {gpus!r}", field=FIELD)
    if inst.emulated is not None or dev.kind != "gpu":
        why = f"{inst.name} is an emulated cluster of CPU ranks; part of a node applies to an instance's GPUs"
        raise ConfigError(why, field=FIELD)
    if gpus > dev.count:
        raise ConfigError(f"{gpus} exceeds the {dev.count} GPUs of a {inst.name} node", field=FIELD)
    if gpus == dev.count:
        return inst
    nics = max(1, math.ceil(inst.nic.count * gpus / dev.count))
    note = f"{FIELD} {gpus} of the instance's {dev.count} (configuration; shardsim/specs/hardware/partial.py)"
    sources = {
        **inst.sources,
        "device.count": note,
        "nic.count": f"{nics} of {inst.nic.count}: the GPUs' share, {note}",
    }
    return replace(
        inst,
        description=f"{inst.description} ({gpus} of its {dev.count} GPUs)",
        device=replace(dev, count=gpus),
        nic=replace(inst.nic, count=nics),
        sources=sources,
    )
