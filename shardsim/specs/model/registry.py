"""Every model family's `ModelSpec` by name, and every Hugging Face ``model_type`` by the family
that reads it: a family registers itself by its module under `specs.model.families`."""

from __future__ import annotations

from shardsim.specs.model.families import FAMILY_SPECS
from shardsim.specs.model.spec import HFMapper, ModelSpec

SPECS: dict[str, ModelSpec] = {s.name: s for s in FAMILY_SPECS}
FAMILIES = tuple(SPECS)
# model_type -> (family, mapper)
HF_TYPES: dict[str, tuple[str, HFMapper]] = {t: (s.name, m) for s in FAMILY_SPECS for t, m in s.hf_types.items()}


def model_spec(family: str) -> ModelSpec:
    """The spec of a registered family (KeyError otherwise: `arch.check_arch` names the field first)."""
    return SPECS[family]
