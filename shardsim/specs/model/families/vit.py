"""vit: a Vision Transformer (patch embedding, [CLS] token, learned positions, a bidirectional
pre-LN encoder, a classifier on [CLS])."""

from __future__ import annotations

from typing import Any

from shardsim.specs.model.families.plans import GELU_PLAN
from shardsim.specs.model.hf_keys import HFKeys
from shardsim.specs.model.spec import ModelSpec, Traits


def _vit(k: HFKeys) -> dict[str, Any]:
    labels = k.get("id2label")
    classes = k.int("num_labels", default=len(labels) if isinstance(labels, dict) and labels else 2)
    return k.encoder() | dict(
        image=k.int("image_size"),
        patch=k.int("patch_size"),
        channels=k.int("num_channels", default=3),
        classes=classes,
    )


SPEC = ModelSpec(
    name="vit",
    traits=Traits("layernorm", True, "gelu", "learned", False, "image"),
    embed="patches",
    layer="transformer",
    head="cls",
    tp_plan=GELU_PLAN,
    hf_types={"vit": _vit},
)
