"""The schema of a profile file (`shardsim profile`'s JSON): what `hardware.profile` reads from
it, each figure's type and range. Keys it does not name (the raw timings, the device, torch's
version) are kept in the file and ignored here."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from shardsim.simulator.documents import Document

NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]
Pair = Annotated[list[NonNegative], Field(min_length=2, max_length=2)]  # [fwd_s, bwd_s]


def _count(text: str) -> str:
    if not text.isdigit() or int(text) < 1:
        raise ValueError("expected a whole number >= 1 as the key")
    return text


Count = Annotated[str, AfterValidator(_count)]  # a microbatch size or a rank count, as a JSON key


class LinksDoc(Document):
    """One emulated topology's measured links (links.<topology>)."""

    nic_Bps: Positive | None = None
    nic_latency_s: Positive | None = None
    loopback_Bps: Positive | None = None
    loopback_latency_s: Positive | None = None
    gather_cpu_s_per_B: Positive | None = None
    reduce_cpu_s_per_B: Positive | None = None


class FsdpOverheadDoc(Document):
    """FSDP2's own work in a forward and a backward (fsdp_overhead_s)."""

    fwd_s: NonNegative
    bwd_s: NonNegative


class HostDoc(Document):
    """What the host's cores give ranks computing at once (host)."""

    effective_cores: dict[Count, Positive] | None = None
    cpu_capacity: dict[Count, Positive] | None = None
    steal_share: dict[Count, NonNegative] | None = None
    yardstick_all_cores_s: Positive | None = None


class ProfileDoc(Document):
    """A profile file, as far as the simulator reads it."""

    workload: str
    blocks_by_batch_s: dict[Count, dict[str, Pair]] | None = None
    blocks_per_sample_s: dict[str, Pair] | None = None
    optimizer_per_param_s: Positive | None = None
    sharded_optimizer_overhead_s: NonNegative | None = None
    probe_s: Positive | None = None
    fsdp_overhead_s: FsdpOverheadDoc | None = None
    links: dict[str, LinksDoc] | None = None
    host: HostDoc | None = None
