"""The profile a validation predicts from, and how much slower the host is now than when that
profile was measured."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from shardsim.config import RunConfig
from shardsim.core.errors import ConfigError, CorruptFile
from shardsim.runtime.validation.matrix import Matrix
from shardsim.specs.hardware.topology import make_cluster

if TYPE_CHECKING:
    from shardsim.simulator.hardware.profile import Profile


def host_slowdown(profile: Profile, batch: int) -> float:
    """How much slower this host is now than when the profile was measured (1.0 when the
    profile has no yardstick), timed with the profile's own yardstick."""
    if profile.yardstick_s is None:
        return 1.0
    from shardsim.runtime.profile import yardstick

    return yardstick(profile.workload, batch) / profile.yardstick_s


def ensure_profile(matrix: Matrix, out: Path, given: str | None, log: Callable[[str], None]) -> str:
    """The profile to predict from: `given`, or out/profile.json when it covers the matrix, or a
    new one measured now (blocks at every microbatch size, each topology's links, core sharing).

    An out/profile.json that cannot be read (torn, mistyped, another workload's) is named,
    ConfigError, not measured again over it; one that lacks what the matrix needs is measured
    again, with a note saying what it lacked."""
    from shardsim.runtime.emulation.plan import QUEUE_LATENCY_S
    from shardsim.simulator.hardware.profile import load_profile

    workload = matrix.base.get("workload", RunConfig().workload)
    if given:
        load_profile(given, workload)  # fails here, once, if it is for another workload
        return given
    path = out / "profile.json"
    sizes = matrix.microbatch_sizes()
    worlds = sorted({make_cluster(t).world for t, _ in matrix.topologies})
    layouts = matrix.tp_layouts()
    if path.exists():
        try:
            prof = load_profile(path, workload)
        except ConfigError as exc:
            hint = "validate measured it: move it aside to measure it again, or pass --profile"
            raise CorruptFile(f"{exc.message} ({hint})", where=exc.where, field=exc.field) from None
        lacks = [f"microbatch {b}" for b in sizes if b not in prof.blocks]
        lacks += [f"{t}'s links" for t, _ in matrix.topologies if t not in prof.links]
        lacks += [
            f"{t}'s call wait" for t, _ in matrix.topologies if t in prof.links and prof.links[t].call_wait_s is None
        ]
        lacks += [
            f"{t}'s links at today's NIC queue ({QUEUE_LATENCY_S * 1e3:g} ms)"
            for t, _ in matrix.topologies
            if t in prof.links and prof.links[t].nic_queue_s != QUEUE_LATENCY_S
        ]
        lacks += [f"the cores of {w} ranks" for w in worlds if w not in prof.effective_cores]
        lacks += [
            f"tensor parallel {tp}{' with sp' if sp else ''} at microbatch {b}"
            for tp, sp in layouts
            for b in sizes
            if (tp, sp) not in prof.tp_share_by_batch.get(b, {})
        ]
        if not lacks:
            log(f"profile: reusing {path}")
            return str(path)
        log(f"profile: {path} lacks {', '.join(lacks)}: measuring a new one")
    from shardsim.runtime.profile import build_profile, write_json_atomic

    log(f"profile: timing {workload}'s blocks at microbatch {sizes}, the links of each topology, core sharing")
    doc = build_profile(
        workload,
        sizes,
        precision=matrix.base.get("precision", "fp32"),
        topologies=[(t, None) for t, _ in matrix.topologies],
        ranks=worlds,
        tp_layouts=layouts,
    )
    write_json_atomic(path, doc)
    return str(path)
