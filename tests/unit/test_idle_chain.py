"""The engine's fast path (`simulator.idle_chain`): a chain of collectives on idle links timed as
one event gives the spans the network gives op by op (`simulate(..., idle_chains=False)`), up to
float rounding, whether or not a transfer interrupts it, and wherever in the chain it does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.config import load_config
from shardsim.simulator import idle_chain
from shardsim.simulator.clock import Clock
from shardsim.simulator.engine import Span, _network, simulate
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.network.fluid import Network
from shardsim.simulator.network.links import links_for
from shardsim.simulator.plan import Plan, RankClass
from shardsim.simulator.predict import _engine_options, prepare
from shardsim.specs.hardware.topology import make_cluster

G = links_for(make_cluster("p4d.24xlarge", 2))
TP = GroupLayout(0, 16, 8)  # a tensor-parallel group per node: NVSwitch ports only
WORLD = GroupLayout.world(16)  # across both nodes: the same ports and the NICs
REL = 1e-12


def _plan(chain: list[tuple[str, float]], gather_after: float | None, gather_bytes: float = 4e8) -> Plan:
    """Class 0 computes 1 ms, then issues `chain` ((collective, bytes), each after the one before)
    on its tp group and computes 1 ms more; beside it, after `gather_after` s of compute on another
    class, an all-gather over the world of `gather_bytes` (none when None): its compute is not slowed
    by the chain's collectives (NCCL's SM share), so it sends when asked."""
    p = Plan()
    p.classes = [RankClass("a", 0, 16, 1.0, 1.0, ()), RankClass("b", 0, 16, 1.0, 1.0, ())]
    op = p.add(0, "compute", "compute", "block", [], duration=1e-3)
    deps = [op]
    for i, (coll, nbytes) in enumerate(chain):
        deps = [p.comm(0, "tp", coll, TP, nbytes, f"tp{i}", deps, "fwd")]
    p.add(0, "compute", "compute", "next", deps, duration=1e-3)
    if gather_after is not None:
        w = p.add(1, "compute", "compute", "wait", [], duration=gather_after)
        p.comm(1, "ag", "all_gather", WORLD, gather_bytes, "gather", [w], "fwd")
    return p


def _same(a: list[Span], b: list[Span]) -> None:
    step = max(s.end for s in a)
    assert [(s.op, s.name) for s in a] == [(s.op, s.name) for s in b]
    for x, y in zip(a, b, strict=True):
        assert x.start == pytest.approx(y.start, rel=0, abs=REL * step), x.name
        assert x.end == pytest.approx(y.end, rel=0, abs=REL * step), x.name


def _both(p: Plan, backend: str = "nccl") -> list[Span]:
    slow = simulate(p, G, "ring", backend, idle_chains=False)
    fast = simulate(p, G, "ring", backend)
    _same(fast, slow)
    return fast


CHAIN = [("all_gather", 2e8), ("reduce_scatter", 2e8), ("all_gather", 2e8), ("reduce_scatter", 2e8)]


def _interrupts(monkeypatch) -> list[str]:
    """Where each IdleChain interrupt found its chain: over, in a latency, or moving bytes."""
    seen: list[str] = []
    plain = idle_chain.IdleChain.interrupt

    def interrupt(self) -> None:
        now, j = self.run.env._now, self.done
        while j < len(self.ends) and self.ends[j] <= now:
            j += 1
        seen.append("over" if j == len(self.ends) else "latency" if now < self.sends[j] else "bytes")
        plain(self)

    monkeypatch.setattr(idle_chain.IdleChain, "interrupt", interrupt)
    return seen


@pytest.mark.parametrize("where", ["latency", "bytes"])
def test_an_interrupted_chain_ends_as_op_by_op(where, monkeypatch) -> None:
    """A world all-gather sent during the latency of the chain's third collective or halfway through
    the second's bytes: the chain's spans are the network's op by op, and the gather slows the
    collectives it shares ports with (so the interrupt is what made them equal)."""
    alone = {s.name: s for s in simulate(_plan(CHAIN, None), G, "ring", "nccl")}
    probe = _plan(CHAIN, 0.0)
    sends = {i: alone[f"tp{i}"].start + _phase(probe, f"tp{i}")[0] for i in (1, 2)}  # when each sends its bytes
    send = {
        "latency": (alone["tp1"].end + sends[2]) / 2,
        "bytes": (sends[1] + alone["tp1"].end) / 2,
    }[where]
    seen = _interrupts(monkeypatch)
    spans = {s.name: s for s in _both(_plan(CHAIN, send - _phase(probe, "gather")[0]))}
    assert seen[0] == where
    assert spans["tp3"].end > alone["tp3"].end * (1 + 1e-6)  # the gather shared the chain's ports


def test_a_chain_interrupted_as_it_ends_is_ended_by_its_call(monkeypatch) -> None:
    """A transfer sent over the chain's links at the very time its last op ends, before the chain's
    own end call (the interrupt made at the start of that call): its end call still ends it, once."""
    seen = _interrupts(monkeypatch)
    plain = idle_chain.IdleChain._end

    def end(self) -> None:
        if self.live:
            self.interrupt()
        plain(self)

    monkeypatch.setattr(idle_chain.IdleChain, "_end", end)
    _both(_plan(CHAIN, None))
    assert seen == ["over"]


def _phase(p: Plan, name: str) -> tuple[float, float]:
    """Op `name`'s latency and the seconds its bytes take alone, from the network's figures."""
    caps, steps, _ = _network(p, G, "ring", "nccl", None, None, False, 0.0)
    op = next(o for o in p.ops if o.name == name)
    ((latency, route),) = steps[op.id]
    return latency, Network(Clock(), caps).alone_s(route, op.nbytes)


def test_a_chain_on_busy_links_runs_op_by_op(monkeypatch) -> None:
    """The gather (a chain of one, alone at first) still moving when the chain starts: the chain
    holds nothing, and its first collective's bytes interrupt the gather; the same spans."""
    seen = _interrupts(monkeypatch)
    _both(_plan(CHAIN, 0.0, gather_bytes=4e9))
    assert seen == ["bytes"]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    chain=st.lists(
        st.tuples(st.sampled_from(["all_gather", "reduce_scatter", "all_reduce"]), st.floats(1e3, 4e8)),
        min_size=1,
        max_size=6,
    ),
    after=st.one_of(st.none(), st.floats(0.0, 0.05)),
    gather=st.floats(1e3, 2e9),
    backend=st.sampled_from(["nccl", "gloo"]),
)
def test_chains_and_gathers_at_any_moment_end_as_op_by_op(chain, after, gather, backend) -> None:
    _both(_plan(chain, after, gather), backend)


LLAMA = {"workload": "llama-3.1-8b", "layers": 4}
CONFIGS = {  # plans whose chains meet FSDP's collectives and a pipeline's sends
    "llama tp 8 sp, zero": {**LLAMA, "strategy": "zero", "tp": 8, "sequence_parallel": True},
    "llama pp 2 interleaved-zb v 2, d 2 tp 4 sp": {
        "workload": "llama-3.1-8b", "layers": 8, "strategy": "pipeline", "pp": 2, "microbatches": 4,
        "batch_per_device": 2, "schedule": "interleaved-zb", "stages_per_rank": 2, "degree": 2, "tp": 4,
        "sequence_parallel": True,
    },
    "llama cp 4 tp 2 zero": {**LLAMA, "strategy": "zero", "cp": 4, "tp": 2, "seq_len": 32768},
    "mixtral ep 4 tp 2 zero": {"workload": "mixtral-8x7b", "layers": 2, "strategy": "zero", "tp": 2, "ep": 4},
    "gpt2-xl ddp": {"workload": "gpt2-xl", "strategy": "ddp"},
}  # fmt: skip


@pytest.mark.parametrize("name", list(CONFIGS))
def test_predictions_are_the_op_by_op_ones(name) -> None:
    """Whole plans on 2 x p5.48xlarge: every span within a relative 1e-12 of the step."""
    cfg = load_config(None, {"topology": "p5.48xlarge", "nodes": 2, "precision": "bf16", **CONFIGS[name]})
    s = prepare(cfg)
    p, g, opts = s.plan(), links_for(s.cluster), _engine_options(s)
    _same(
        simulate(p, g, "auto", s.cfg.backend, **opts), simulate(p, g, "auto", s.cfg.backend, **opts, idle_chains=False)
    )
