"""mlp: a stack of MLP blocks (Linear-GELU-Linear and a residual) on vectors, and a classifier."""

from __future__ import annotations

from shardsim.specs.model.spec import ModelSpec, Traits

SPEC = ModelSpec(
    name="mlp",
    traits=Traits("layernorm", True, "gelu", "none", False, "vector"),
    embed="none",
    layer="mlp",
    head="linear",
    tp_plan=None,
)
