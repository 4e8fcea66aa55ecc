"""The schema of a profile file (`shardsim profile`'s JSON): what `hardware.profile` reads from
it, each figure's type and range. Keys it does not name (the raw timings, the device, torch's
version) are kept in the file and ignored here. Every timing is 0 or from `MIN_SECONDS` to `MAX_SECONDS`, and a
microbatch size or rank count (a key) at most `specs.bounds.MAX_BATCH`."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from shardsim.core.documents import Document
from shardsim.specs.bounds import MAX_BATCH

# one timing: at most a day, and none or at least a femtosecond (beyond either, a rate or a step's
# sum overflows the float)
MAX_SECONDS = 86_400.0
MIN_SECONDS = 1e-15
NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]
PositiveSeconds = Annotated[float, Field(ge=MIN_SECONDS, le=MAX_SECONDS)]


def _seconds(v: float) -> float:
    if v != 0 and not MIN_SECONDS <= v <= MAX_SECONDS:
        raise ValueError(f"expected 0 or a number from {MIN_SECONDS:g} to {MAX_SECONDS:g}")
    return v


Seconds = Annotated[float, Field(ge=0), AfterValidator(_seconds)]
Pair = Annotated[list[Seconds], Field(min_length=2, max_length=2)]  # [fwd_s, bwd_s]


def _count(text: str) -> str:
    if not text.isdigit() or not 1 <= int(text) <= MAX_BATCH:
        raise ValueError(f"expected a whole number from 1 to {MAX_BATCH:,} as the key")
    return text


Count = Annotated[str, AfterValidator(_count)]  # a microbatch size or a rank count, as a JSON key


class LinksDoc(Document):
    """One emulated topology's measured links (links.<topology>)."""

    nic_Bps: Positive | None = None
    nic_latency_s: PositiveSeconds | None = None
    nic_pair_gather_Bps: Positive | None = None
    loopback_Bps: Positive | None = None
    loopback_latency_s: PositiveSeconds | None = None
    gather_cpu_s_per_B: PositiveSeconds | None = None
    reduce_cpu_s_per_B: PositiveSeconds | None = None
    call_wait_s: Seconds | None = None
    nic_queue_s: PositiveSeconds | None = None


class FsdpOverheadDoc(Document):
    """FSDP2's own work in a forward and a backward (fsdp_overhead_s)."""

    fwd_s: Seconds
    bwd_s: Seconds


class HostDoc(Document):
    """What the host's cores give ranks computing at once (host)."""

    effective_cores: dict[Count, Positive] | None = None
    cpu_capacity: dict[Count, Positive] | None = None
    steal_share: dict[Count, NonNegative] | None = None
    yardstick_all_cores_s: PositiveSeconds | None = None


class ProfileDoc(Document):
    """A profile file, as far as the simulator reads it."""

    workload: str
    blocks_by_batch_s: dict[Count, dict[str, Pair]] | None = None
    blocks_per_sample_s: dict[str, Pair] | None = None
    optimizer_per_param_s: PositiveSeconds | None = None
    sharded_optimizer_overhead_s: Seconds | None = None
    probe_s: PositiveSeconds | None = None
    fsdp_overhead_s: FsdpOverheadDoc | None = None
    tp_share: dict[str, Pair] | None = None  # "2" / "2+sp" → a tensor-parallel rank's [fwd, bwd] over the model's
    tp_share_by_batch: dict[Count, dict[str, Pair]] | None = None  # the same at each microbatch size
    links: dict[str, LinksDoc] | None = None
    host: HostDoc | None = None
