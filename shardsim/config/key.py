"""The key every result carries: where it ran or would run, what, and how distributed.

`predict --json`, a run record and its runs.csv row, a sweep row and a validate row each start
with the same fields (docs/results.md): `topology`, `nodes`, `world`, `device`, `workload`,
`strategy` (a `StrategyKey`: one object in JSON, `strategy_<field>` columns in CSV) and
`label`, the strategy's label. `legacy_strategy` reads the spellings of files written before
the key (the kind and its fields as loose columns, the label under `config` or `strategy`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from shardsim.simulator.strategies.kinds import STRATEGIES as KINDS
from shardsim.spec.model.load import spec_name

if TYPE_CHECKING:
    from shardsim.config.schema import RunConfig, Strategy


@dataclass(frozen=True)
class StrategyKey:
    """A strategy as results name it, resolved on its world: `degree` is the ranks a parameter
    is sharded over (SageMaker's `sharded_data_parallel_degree`): 1 where every rank holds it
    whole (ddp, a pipeline stage not sharded), the world for zero. `pp` and `microbatches` are
    1 and `schedule` null without a pipeline; `reshard_after_forward` is null for kinds that do
    not shard with FSDP2 (false: ZeRO-2). `tp` is the tensor-parallel degree (its ranks share
    a parameter's shard: `degree` counts data-parallel ranks), with `sequence_parallel` and
    `async_tp` (files written before tensor parallelism: 1, false, false)."""

    kind: str
    degree: int
    pp: int
    microbatches: int
    schedule: str | None
    reshard_after_forward: bool | None
    tp: int = 1
    sequence_parallel: bool = False
    async_tp: bool = False


@dataclass(frozen=True)
class ResultKey:
    """The shared key of every result (docs/results.md). `label` is the strategy's label; a
    sweep that lists settings adds those that differ from its base's ("zero, ckpt off")."""

    topology: str  # the topology's name (its instance type's: a YAML file's `name`)
    nodes: int  # nodes the ranks fill
    world: int  # ranks
    device: str  # the device's name: the topology's model in a prediction, what ran in a run
    workload: str  # the workload's name (a library name, a file's, or an inline model's family)
    strategy: StrategyKey
    label: str  # the configuration's label, as tables name it: its strategy's ("zero2d d=4"; see below)

    def to_dict(self) -> dict[str, Any]:
        """The key as JSON gives it: `strategy` one object."""
        return asdict(self)

    def columns(self) -> dict[str, Any]:
        """The key as CSV gives it: `strategy_<field>` columns in place of the object."""
        return flatten(self.to_dict())


KEY_FIELDS = tuple(f.name for f in fields(ResultKey))
STRATEGY_FIELDS = tuple(f.name for f in fields(StrategyKey))
STRATEGY_COLUMNS = tuple(f"strategy_{f}" for f in STRATEGY_FIELDS)
# the key's columns in a CSV file, in order
KEY_COLUMNS = (*KEY_FIELDS[: KEY_FIELDS.index("strategy")], *STRATEGY_COLUMNS, "label")


def flatten(row: dict[str, Any]) -> dict[str, Any]:
    """A result's dict with its `strategy` object as `strategy_<field>` entries in its place."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if k == "strategy" and isinstance(v, dict):
            out |= {f"strategy_{f}": v.get(f) for f in STRATEGY_FIELDS}
        else:
            out[k] = v
    return out


def nest(row: dict[str, Any]) -> dict[str, Any]:
    """A result's flat row (CSV columns) with its `strategy_<field>` entries as one `strategy`
    object, where the first of them stood."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if k in STRATEGY_COLUMNS:
            out.setdefault("strategy", {})[k.removeprefix("strategy_")] = v
        else:
            out[k] = v
    return out


def strategy_key(s: Strategy, world: int) -> StrategyKey:
    """The key of strategy `s` on `world` ranks (a field its kind does not carry: its neutral value)."""
    spec = s.spec
    return StrategyKey(
        kind=s.kind,
        degree=s.sharded_degree(world // s.tp),
        pp=getattr(s, "pp", 1),
        microbatches=getattr(s, "microbatches", 1),
        schedule=getattr(s, "schedule", None) if spec.is_pipeline else None,
        reshard_after_forward=getattr(s, "reshard_after_forward", None) if spec.fsdp else None,
        tp=s.tp,
        sequence_parallel=s.sequence_parallel,
        async_tp=s.async_tp,
    )


def result_key(
    cfg: RunConfig, *, topology: str, nodes: int, world: int, device: str, label: str | None = None
) -> ResultKey:
    """The key of configuration `cfg` run (or predicted) on `nodes` nodes of `topology`, `world`
    ranks; `label` in place of the strategy's own (a sweep's, naming settings too)."""
    return ResultKey(
        topology=topology,
        nodes=nodes,
        world=world,
        device=device,
        workload=spec_name(cfg.workload),
        strategy=strategy_key(cfg.strategy, world),
        label=cfg.strategy.label() if label is None else label,
    )


def legacy_strategy(
    kind: str, label: str, world: int, degree: Any = None, pp: Any = 1, microbatches: Any = 1, schedule: Any = None
) -> StrategyKey:
    """The key of a strategy as files written before `StrategyKey` spell it: its kind, label and
    world, and its loose fields (a degree None or empty where the kind implies it, a schedule
    given to every kind). ZeRO-2 is read from the label, where it is named. KeyError for a kind
    the registry does not know, ValueError for fields that contradict it."""
    from shardsim.config.schema import strategy_from_dict
    from shardsim.core.errors import ConfigError

    if kind not in KINDS:
        raise KeyError(kind)
    try:
        s = strategy_from_dict(
            {
                "kind": kind,
                "degree": None if degree in (None, "") else int(degree),
                "pp": int(pp or 1),
                "microbatches": int(microbatches or 1),
                "schedule": schedule or "1f1b",
                "reshard_after_forward": "(ZeRO-2)" not in label,
            }
        )
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return strategy_key(s, world)
