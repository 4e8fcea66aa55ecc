"""The emulated cluster: the nodes of an ``emulated:`` topology as network namespaces on this machine,
joined by a bridge, every NIC shaped with ``tc`` tbf.

The flow: `plan.plan_cluster` names and addresses the namespaces, links and shaping (creates
nothing); `namespaces.emulated` holds the topology for a block (`ownership`: one job at a time),
brings it up (`up`) and always down (`down`, which kills only what shardsim started in it);
`processes.run_in_node` starts a command, such as `processes.torchrun_argv`, inside a node and
`processes.kill_group` stops it; `linkprobe.measure_link` measures a link; `status.status` reads
what exists; `iproute` runs the ``ip`` and ``tc`` commands and checks the privileges they need.
The lab's readings of the host it shares: `hostspeed` (a host-speed probe, the hypervisor's
steal) and `readings.HostReadings`, the observer a run on CPU attaches to its Trainer. ::

    cluster = plan_cluster(load_instance("emu-2x2"))
    with emulated(cluster):                      # held, up; always down, also on error and on a signal
        procs = [run_in_node(cluster, i, torchrun_argv(cluster, i, ["-m", "shardsim.runtime.train", ...]))
                 for i in range(len(cluster.nodes))]
        ...
        for p in procs:
            kill_group(p)

Needs root and iproute2 (``ip``, ``tc``); everything else is the standard library.
"""

from shardsim.runtime.emulation.iproute import EmulationError, check_privileges
from shardsim.runtime.emulation.linkprobe import LinkMeasurement, measure_link
from shardsim.runtime.emulation.namespaces import down, emulated, held, up
from shardsim.runtime.emulation.ownership import TopologyBusy
from shardsim.runtime.emulation.plan import EmulatedCluster, EmulatedNode, plan_cluster
from shardsim.runtime.emulation.processes import kill_group, node_env, run_in_node, torchrun_argv

__all__ = [
    "EmulatedCluster",
    "EmulatedNode",
    "EmulationError",
    "LinkMeasurement",
    "TopologyBusy",
    "check_privileges",
    "down",
    "emulated",
    "held",
    "kill_group",
    "measure_link",
    "node_env",
    "plan_cluster",
    "run_in_node",
    "torchrun_argv",
    "up",
]
