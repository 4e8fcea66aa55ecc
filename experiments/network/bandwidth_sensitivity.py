"""How a ZeRO-3 (FSDP) step's throughput follows the network: the same cluster with 100, 200,
400 and 800 Gb/s of EFA per node (p4d.24xlarge with 1, 2, 4 and 8 of its 100 Gb/s NICs), for a
few models, and the ratio of throughput at 800 over 100 Gb/s. Prints a table; the ratio is what
experiments/network/README.md compares with published runs (a model whose throughput rises much
more than measured runs' from 100 to 800 Gb/s over-weighs the network).

    python experiments/network/bandwidth_sensitivity.py [--nodes 4]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from shardsim.config import RunConfig
from shardsim.simulator.predict import predict
from shardsim.specs.hardware.topology import Cluster, load_instance

NICS = (1, 2, 4, 8)
CASES = (
    ("llama-2-7b", 2, "bf16"),
    ("gpt-10b", 2, "bf16"),
    ("mpt-7b", 4, "bf16"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    args = ap.parse_args()
    base = load_instance("p4d.24xlarge")
    print(f"ZeRO-3 over {args.nodes} x p4d.24xlarge, NICs of 100 Gb/s per node: samples/s")
    print(f"{'workload':<10} " + " ".join(f"{n * 100:>8} Gb/s" for n in NICS) + "   800/100")
    for workload, bpd, prec in CASES:
        cfg = RunConfig(
            workload=workload,
            topology="p4d.24xlarge",
            nodes=args.nodes,
            batch_per_device=bpd,
            precision=prec,
            sharded_data_parallel_degree=args.nodes * 8,
        )
        rates = []
        for n in NICS:
            inst = replace(base, nic=replace(base.nic, count=n))
            rates.append(predict(cfg, cluster=Cluster(inst, args.nodes)).samples_per_s)
        print(f"{workload:<10} " + " ".join(f"{r:>13.1f}" for r in rates) + f"   {rates[-1] / rates[0]:.2f}x")


if __name__ == "__main__":
    main()
