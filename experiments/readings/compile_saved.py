"""What a transformer layer saves for backward, eager against torch.compile (inductor), on CPU.

One layer of the runtime's own modules (`runtime.models.transformer.TransformerLayer`) of a
small llama and of a small gpt, fp32 and bf16: every tensor autograd keeps for backward is
seen by `torch.autograd.graph.saved_tensors_hooks` around the forward (eager: each op's saved
tensors; compiled: what AOTAutograd's partitioner hands the compiled backward), counted once
per storage, the layer's input and parameters apart. Prints one JSON object per case (the
saved tensors' shapes and dtypes listed) and a table of elements and bytes per token.

    python experiments/readings/compile_saved.py

The reading is compile-saved.md beside this file.
"""

from __future__ import annotations

import json
import sys

import torch

from shardsim.runtime.models.transformer import TransformerLayer
from shardsim.specs.model.arch import Shape
from shardsim.specs.model.blocks import from_arch
from shardsim.specs.model.load import resolve_arch

BATCH, SEQ = 2, 64


def saved_elements(layer: torch.nn.Module, x: torch.Tensor) -> dict:
    """Elements and bytes saved for backward by one forward of `layer` on `x` (each storage once),
    apart from the layer's input and its parameters, and each such tensor's shape and dtype."""
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: dict[int, tuple[int, int, str]] = {}
    kept = {"input": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr == x.untyped_storage().data_ptr():
            kept["input"] = x.numel()
        elif ptr not in params and ptr not in seen:
            seen[ptr] = (s.nbytes() // t.element_size(), s.nbytes(), f"{list(t.shape)} {t.dtype}".replace("torch.", ""))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    out.sum().backward()
    return {
        "activations": float(sum(e for e, _, _ in seen.values())),
        "bytes": float(sum(b for _, b, _ in seen.values())),
        "tensors": sorted(d for _, _, d in seen.values()),
        "input": float(kept["input"]),
    }


def case(family: str, dtype: torch.dtype) -> dict:
    ffn = 704 if family.startswith("llama") else 1024
    name, arch = resolve_arch(family, Shape(seq_len=SEQ, hidden=256, heads=4, kv_heads=4, ffn=ffn, layers=1))
    torch.manual_seed(0)
    layer = TransformerLayer(arch).to(dtype)
    x = torch.randn(BATCH, SEQ, arch.hidden, dtype=dtype, requires_grad=True)
    eager = saved_elements(layer, x)
    torch._dynamo.reset()
    compiled = torch.compile(layer)
    saved_elements(compiled, x)  # the first call compiles
    comp = saved_elements(compiled, x)
    tokens = BATCH * SEQ
    h, f = arch.hidden, arch.ffn_size
    return {
        "workload": name,
        "family": arch.family,
        "dtype": str(dtype).removeprefix("torch."),
        "hidden": h,
        "ffn": f,
        "tokens": tokens,
        "eager": eager,
        "compiled": comp,
        "eager_per_token": eager["activations"] / tokens,
        "compiled_per_token": comp["activations"] / tokens,
        "eager_bytes_per_token": eager["bytes"] / tokens,
        "compiled_bytes_per_token": comp["bytes"] / tokens,
        "model_per_token": from_arch(name, arch).layers[0].act_elems / SEQ,  # what the memory model counts
    }


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for family in ("llama-3.1-8b", "tiny-gpt"):
        for dtype in (torch.float32, torch.bfloat16):
            r = case(family, dtype)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print(f"torch {torch.__version__}", file=sys.stderr)
    print("| family | dtype | hidden h | ffn f | model's count | eager | compiled | eager bytes | compiled bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        counts = (r[k] for k in ("model_per_token", "eager_per_token", "compiled_per_token"))
        nbytes = (r[k] for k in ("eager_bytes_per_token", "compiled_bytes_per_token"))
        cells = [r["family"], r["dtype"], r["hidden"], r["ffn"], *(f"{c:.0f}" for c in (*counts, *nbytes))]
        print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
