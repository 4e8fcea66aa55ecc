"""Node fabrics as they are: the rings NCCL finds over p3dn.24xlarge's NVLink hybrid cube-mesh for
the GPU groups a layout makes, the NICs a send between nodes crosses on p4d and p5, and InfiniBand
HDR (dgx-a100) beside EFA (p4de.24xlarge, the same A100 80 GB board).

    python experiments/network/fabrics.py

Prints four markdown tables (the reading is in this folder's README, "Node fabrics").
"""

from __future__ import annotations

import itertools

from shardsim.simulator.network.collectives import GroupLayout, call_alone_s
from shardsim.simulator.network.links import links_for
from shardsim.simulator.network.nccl_runs import compute_capability
from shardsim.simulator.network.nvlink_mesh import nccl_rings, nvlink_GBps, ring_share
from shardsim.specs.hardware.topology import load_instance, make_cluster

GiB = 2**30


def mesh_table() -> list[str]:
    """The rings of the groups of consecutive and of strided GPUs on one p3dn node, and of every set."""
    inst = load_instance("p3dn.24xlarge")
    mesh, link = inst.fabric.nvlink_mesh, nvlink_GBps(compute_capability(inst.device.model))
    g = links_for(make_cluster(inst, 1))
    out = [
        "| group of GPUs | rings (channels) | path | GB/s per GPU (NCCL's) | share of the port"
        " | all-gather busbw, 1 GiB, every group at once |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for size, strided in ((2, False), (4, False), (8, False), (2, True), (4, True)):
        layout = GroupLayout(0, 8, size, strided=strided)
        t = call_alone_s(g, "all_gather", layout, GiB, "ring", "nccl")
        busbw = GiB * (size - 1) / size / t / 1e9
        for row in layout.groups()[:2]:
            gpus = tuple(int(x) for x in row)
            r, share = nccl_rings(mesh, gpus, link), ring_share(mesh, gpus, link)
            name = ", ".join(map(str, gpus)) + (" (strided)" if strided else "")
            rings = f"{len(r.rings)} x {r.speed_GBps:g} GB/s"
            out.append(f"| {name} | {rings} | {r.path} | {r.total_GBps:g} | {share:.3f} | {busbw:.1f} GB/s |")
    counts: dict[tuple[int, str, float], int] = {}
    for n in range(2, 9):
        for gpus in itertools.combinations(range(8), n):
            r = nccl_rings(mesh, gpus, link)
            counts[n, r.path, r.total_GBps] = counts.get((n, r.path, r.total_GBps), 0) + 1
    out += ["", "| GPUs in the set | path | GB/s per GPU | sets |", "| --- | --- | --- | --- |"]
    out += [f"| {n} | {p} | {bw:g} | {c} |" for (n, p, bw), c in sorted(counts.items())]
    return out


def nic_table() -> list[str]:
    """A send of 1 GiB from node 0's GPU 7 to node 1's GPU 0 (a pipeline's stage boundary)."""
    out = ["| instance | NICs of GPU 7 | send, 1 GiB | GB/s |", "| --- | --- | --- | --- |"]
    for name in ("p3dn.24xlarge", "p4d.24xlarge", "p5.48xlarge", "dgx-a100"):
        g = links_for(make_cluster(name, 2))
        first, per = g.rails()
        t = call_alone_s(g, "send_recv", GroupLayout(7, 2, 2), GiB, "ring", "nccl")
        nics = f"{first[7]}" if per == 1 else f"{first[7]}-{first[7] + per - 1}"
        out.append(f"| {name} | {nics} of {g.cluster.instance.nic.count} | {t * 1e3:.2f} ms | {GiB / t / 1e9:.1f} |")
    return out


def ib_table() -> list[str]:
    """All-reduce over 2 nodes (16 ranks): 8 HDR InfiniBand HCAs against 4 EFA v1."""
    out = ["| bytes | dgx-a100 (8 x HDR IB) | p4de.24xlarge (4 x EFA) | ratio |", "| --- | --- | --- | --- |"]
    graphs = {n: links_for(make_cluster(n, 2)) for n in ("dgx-a100", "p4de.24xlarge")}
    for nbytes in (2**16, 2**20, 2**24, GiB):
        t = {
            n: call_alone_s(g, "all_reduce", GroupLayout(0, 16, 16), nbytes, "auto", "nccl") for n, g in graphs.items()
        }
        ib, efa = t["dgx-a100"], t["p4de.24xlarge"]
        out.append(f"| {nbytes:,} | {ib * 1e6:.1f} µs | {efa * 1e6:.1f} µs | {efa / ib:.2f} |")
    return out


if __name__ == "__main__":
    print("\n".join([*mesh_table(), "", *nic_table(), "", *ib_table()]))
