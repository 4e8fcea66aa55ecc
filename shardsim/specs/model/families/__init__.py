"""The model families, one module each: its `ModelSpec` (traits, blocks, tensor-parallel plan,
Hugging Face mappers). A new family is its module here and its entry in `FAMILY_SPECS`."""

from __future__ import annotations

from shardsim.specs.model.families import bert, gpt, llama, mlp, moe, mpt, vit

FAMILY_SPECS = (gpt.SPEC, llama.SPEC, mpt.SPEC, bert.SPEC, vit.SPEC, mlp.SPEC, moe.SPEC)
