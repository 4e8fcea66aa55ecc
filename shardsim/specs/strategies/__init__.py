"""The strategy kinds' specs, one module each, behind one protocol (`base.StrategySpec`), and
their registry `STRATEGIES`: name → spec, in the order sweeps and tables list them (zero1, added
last, keeps the others' places). The other concerns of a kind are registries of their own under
these names (see `base`)."""

from __future__ import annotations

from shardsim.specs.strategies.base import StrategySpec
from shardsim.specs.strategies.ddp import DDP
from shardsim.specs.strategies.pipeline import PIPELINE
from shardsim.specs.strategies.zero import ZERO
from shardsim.specs.strategies.zero1 import ZERO1
from shardsim.specs.strategies.zero2d import ZERO2D

STRATEGIES: dict[str, StrategySpec] = {k.name: k for k in (DDP, ZERO, ZERO2D, PIPELINE, ZERO1)}
# FSDP1's ShardingStrategy names → (kind, reshard_after_forward)
FSDP_SHARDING = {name: (k, raf) for k, v in STRATEGIES.items() for name, raf in v.fsdp_sharding.items()}
DEFAULT_KIND = ZERO.name  # a configuration's strategy unless it names one
# other names of kinds, taken wherever a kind's name is (PyTorch's FSDP and HSDP); outputs name the kind
ALIASES = {"fsdp": ZERO.name, "hsdp": ZERO2D.name}


def kind_name(name: str) -> str:
    """The kind `name` stands for: an alias's kind (``fsdp`` → ``zero``), else `name` as given."""
    return ALIASES.get(name, name)


__all__ = [
    "ALIASES",
    "DDP",
    "DEFAULT_KIND",
    "FSDP_SHARDING",
    "PIPELINE",
    "STRATEGIES",
    "ZERO",
    "ZERO1",
    "ZERO2D",
    "StrategySpec",
    "kind_name",
]
