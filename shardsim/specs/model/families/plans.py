"""The tensor-parallel plans the transformer families share, by the runtime layer's module names."""

from __future__ import annotations

from shardsim.specs.model.spec import TPPlan

# attention's fused qkv and the MLP's first matrix by columns, their output projections by rows
GELU_PLAN = TPPlan(colwise=("attn.qkv", "mlp.fc1"), rowwise=("attn.proj", "mlp.fc2"))
# SwiGLU: the gate and up projections by columns, down by rows
SWIGLU_PLAN = TPPlan(colwise=("attn.qkv", "mlp.gate", "mlp.up"), rowwise=("attn.proj", "mlp.down"))
