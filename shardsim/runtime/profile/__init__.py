"""`shardsim profile`: measure a workload's blocks on the local device.

Times each block's forward and backward (and the Adam step per parameter; on CPU, FSDP2's
own work and its Adam's overhead) with real tensors at the configured batch, one torch
thread per rank on CPU as the runtime uses, and writes a profile that `predict`, `sweep`
and `validate` take with `--profile`. The simulator scales the per-sample times linearly
with the microbatch, so profile at the microbatch size you will predict.

- blocks: each block's and the whole model's forward and backward, an Adam step;
- fsdp: FSDP2's own work on a rank and its sharded Adam's overhead;
- cores: what the host's cores give ranks computing at once, and the yardstick;
- links: an emulated cluster's links (linkbench: the gloo timer run under torchrun in a node);
- build: the profile document and writing it; cli: the subcommand.
"""

from shardsim.runtime.profile.build import build_profile, profile_workload, write_json_atomic
from shardsim.runtime.profile.cores import measure_core_sharing, yardstick
from shardsim.runtime.profile.fsdp import fsdp_overhead, sharded_optimizer_step
from shardsim.runtime.profile.links import measure_links, ring_figures

__all__ = [
    "build_profile",
    "fsdp_overhead",
    "measure_core_sharing",
    "measure_links",
    "profile_workload",
    "ring_figures",
    "sharded_optimizer_step",
    "write_json_atomic",
    "yardstick",
]
