"""What the mixture-of-experts settings ask of a model: the checks `resolve` makes of
`moe_imbalance` and `moe_capacity`."""

from __future__ import annotations

from shardsim.core.errors import ConfigError
from shardsim.specs.model.arch import Arch


def check_moe(imbalance: float, capacity: float, arch: Arch | None, where: str | None) -> None:
    """Refuse (ConfigError naming the setting) a mixture-of-experts setting given for a model
    without experts, or an imbalance no router can produce: the busiest expert receives each
    token at most once, so at most experts / top_k times the mean."""
    given = [name for name, value, off in (("moe_imbalance", imbalance, 1.0), ("moe_capacity", capacity, 0.0))
             if value != off]  # fmt: skip
    if not given:
        return
    if arch is None or not arch.spec.moe:
        what = "a model given by import path" if arch is None else f"the {arch.family} family"
        raise ConfigError(f"applies to a mixture-of-experts model, not {what}", where=where, field=given[0])
    most = arch.experts / arch.top_k
    if imbalance > most:
        why = f"the busiest of {arch.experts} experts (top-{arch.top_k}) takes at most {most:g} x the mean"
        why += f", got {imbalance:g}"
        raise ConfigError(why, where=where, field="moe_imbalance")
