"""The allocations and frees of a rank's training step, for the caching allocator's replay
(`allocator.replay`), built from the memory model's parts and the rank's blocks.

The trace, in the allocator's event form (a size allocates, `~i` frees allocation `i`):
- cuBLAS's workspace, allocated at the first GEMM and kept;
- model states, allocated once and kept: per parameter tensor its (sharded) parameter, its
  gradient and its optimizer state (one tensor per whole fp32 word of state, Adam's two);
- then the step, twice (the steady state: the second step runs in the pool the first left):
  the forward, per unit, gathers its unsharded weights (on the all-gather stream where FSDP
  gathers them; at most `window` units held, the oldest freed first) and saves its activations;
  the backward, per unit in reverse, gathers again and frees the unit's activations; then the
  optimizer step's temporaries, per parameter tensor, allocated together and freed.
One microbatch's pass stands for each: the memory model's activations already count the
microbatches a schedule holds at once, and accumulation's later microbatches reuse the first's
freed blocks in the same order. Each part's bytes are spread over the units by their parameters
(states, gathered weights, temporaries) or saved activations, so the trace's requested peak is
the memory model's allocated peak to the byte: states + max(gathered + activations, temporaries)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from shardsim.simulator.allocator import Pools, Replay, advance, replay

COMPUTE_STREAM, GATHER_STREAM = 0, 1  # FSDP2 all-gathers into buffers of its own stream


@dataclass(frozen=True)
class StepBytes:
    """A rank's parts in bytes, and how they are laid out over its units (hashable: replays are cached)."""

    params: int
    grads: int
    optimizer: int
    gathered: int
    activations: int
    temporaries: int
    tensors: tuple[tuple[float, ...], ...]  # per unit, its parameter tensors' shares of the rank's parameters
    saved: tuple[float, ...]  # per unit, its share of the saved activations
    words: int = 2  # optimizer state tensors per parameter tensor
    window: int = 0  # gathered units held at once (0: every unit, from its forward to the step's end)
    gather_stream: bool = False  # gathered on FSDP's all-gather stream
    workspace: int = 0  # cuBLAS's workspace on the compute stream, allocated first and kept


def spread(total: int, weights: Sequence[float]) -> list[int]:
    """`total` in integer parts by `weights`, summing to `total` exactly: each its share rounded
    down, the remainder (under one byte a part) to the largest."""
    s = sum(weights)
    if total <= 0 or s <= 0:
        return [0] * len(weights)
    parts = [int(total * w // s) for w in weights]
    parts[parts.index(max(parts))] += total - sum(parts)
    return parts


def tensor_shares(
    params: Sequence[int], counts: Sequence[int], largest: Sequence[int]
) -> tuple[tuple[float, ...], ...]:
    """Per unit, its parameter tensors' sizes (elements): the largest where known, the rest in equal parts."""
    out = []
    for p, n, big in zip(params, counts, largest, strict=True):
        n = max(1, n)
        if p <= 0:
            out.append(())
        elif n > 1 and 0 < big < p:
            out.append((float(big), *[(p - big) / (n - 1)] * (n - 1)))
        else:
            out.append((p / n,) * n)
    return tuple(out)


@dataclass(frozen=True)
class Unit:
    """One unit's allocations in bytes: per parameter tensor its parameter, gradient and optimizer
    state and step temporary; its gathered weights and saved activations."""

    params: tuple[int, ...]
    grads: tuple[int, ...]
    optimizer: tuple[int, ...]
    temporaries: tuple[int, ...]
    gathered: int
    saved: int


def units_of(b: StepBytes) -> list[Unit]:
    """`b`'s parts spread over its units."""
    n = len(b.tensors)
    weights = [sum(t) for t in b.tensors]
    weights = weights if any(weights) else [1.0] * n
    words = max(1, b.words)
    window = n if b.window <= 0 else min(b.window, n)
    saved = spread(b.activations, b.saved if any(b.saved) else [1.0] * n)
    if window == n:  # each unit's own share, all held at once
        gathered = spread(b.gathered, weights)
    else:  # equal pieces, any `window` consecutive units holding the whole (the rest with the first
        # unit's activations, alive with them at the peak)
        gathered = [b.gathered // window] * n
        saved[0] += b.gathered % window

    def per_tensor(total: int, copies: int = 1) -> list[tuple[int, ...]]:
        return [
            tuple(spread(unit, [t for t in ts for _ in range(copies)])) if ts else ()
            for unit, ts in zip(spread(total, weights), b.tensors, strict=True)
        ]

    states = per_tensor(b.params), per_tensor(b.grads), per_tensor(b.optimizer, words)
    parts = zip(*states, per_tensor(b.temporaries), strict=True)
    return [Unit(p, g, o, t, gathered[u], saved[u]) for u, (p, g, o, t) in enumerate(parts)]


def state_events(units: Sequence[Unit], workspace: int = 0) -> list[int]:
    """The trace's first part, all on the compute stream: cuBLAS's `workspace` bytes (when any),
    then every unit's model states (allocations 0, 1, ...; nothing freed)."""
    events = [workspace] if workspace else []
    for u in units:
        events += (*u.params, *u.grads, *u.optimizer)
    return events


def step_part(units: Sequence[Unit], window: int, gather_stream: bool, first: int) -> tuple[list[int], list[int]]:
    """The trace's second part (events and, parallel, each allocation's stream): the step twice,
    `window` units gathered at once (0: every one); its allocations numbered from `first`."""
    events: list[int] = []
    streams: list[int] = []
    count = first

    def alloc(n: int, stream: int = COMPUTE_STREAM) -> int:
        nonlocal count
        events.append(n)
        streams.append(stream)
        count += 1
        return count - 1

    def free(i: int) -> None:
        events.append(~i)
        streams.append(COMPUTE_STREAM)

    n = len(units)
    window = n if window <= 0 else min(window, n)
    stream = GATHER_STREAM if gather_stream else COMPUTE_STREAM
    for _ in range(2):
        held: list[int] = []
        acts: list[int] = []
        for step, u in enumerate([*range(n), *reversed(range(n))]):
            forward = step < n
            if units[u].gathered and (window < n or forward):
                if len(held) == window:
                    free(held.pop(0))
                held.append(alloc(units[u].gathered, stream))
            if forward:
                acts.append(alloc(units[u].saved))
            else:
                free(acts.pop())
        for i in held:
            free(i)
        for i in [alloc(size) for unit in units for size in unit.temporaries]:
            free(i)
    return events, streams


def step_events(
    units: Sequence[Unit], window: int, gather_stream: bool, workspace: int = 0
) -> tuple[list[int], list[int]]:
    """The trace of `units` (events and, parallel, each allocation's stream), `window` units
    gathered at once (0: every one), after `workspace` bytes kept on the compute stream:
    `state_events`, then `step_part`."""
    head = state_events(units, workspace)
    events, streams = step_part(units, window, gather_stream, len(head))
    return head + events, [COMPUTE_STREAM] * len(head) + streams


@lru_cache(maxsize=512)
def replay_step(b: StepBytes, expandable_segments: bool = False) -> Replay:
    """The caching allocator's replay of `b`'s steady-state step (every unit: a model's identical
    layers are not cut short, since which moment is the peak, the forward's or the optimizer
    step's, can change with their number): the pools after its model states (`_after_states`,
    shared by the steps of every rank with the same states), then the step."""
    units = units_of(b)
    head = _after_states(b.params, b.grads, b.optimizer, b.tensors, b.words, b.workspace, expandable_segments)
    events, streams = step_part(units, b.window, b.gather_stream, len(head.asked))
    return replay(events, streams, expandable_segments=expandable_segments, start=head)


@lru_cache(maxsize=64)
def _after_states(
    params: int, grads: int, optimizer: int, tensors: tuple, words: int, workspace: int, expandable_segments: bool
) -> Pools:
    """The allocator's pools after `state_events` of a rank's states (the StepBytes fields they
    depend on); kept, never changed (`replay` resumes from a copy)."""
    b = StepBytes(params, grads, optimizer, 0, 0, 0, tensors, (), words, 0, False, workspace)
    return advance(Pools(), state_events(units_of(b), workspace), expandable_segments=expandable_segments)
