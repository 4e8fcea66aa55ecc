"""Cost a torch model block by block on the meta device (no memory, no compute).

The only module of `simulator` that imports torch; `simulator.workload.resolve.load_workload` imports
it lazily for workloads given as ``pkg.module:build_fn``.

Protocol: the model has ``embed`` (an nn.Module, or None), ``blocks`` (an nn.ModuleList or
nn.Sequential: the units FSDP wraps and pipelines split) and ``head``, and its forward is
``head(blocks[-1](...blocks[0](embed(x))))``. `measure_import_path` also needs
``sample_batch(batch) -> (inputs, targets)`` or ``example_input(batch) -> inputs``.

Each module is run on its own, forward then backward, on a batch of `BATCH` samples, and every
figure is divided by the batch (all `Block` figures are per sample):

* params: numel of the module's parameters (a parameter shared by several modules counts once,
  in the first).
* fwd_flops / bwd_flops: `torch.utils.flop_counter.FlopCounterMode` over the forward alone and
  over the backward alone (2 FLOPs per multiply-add; matmul, conv and attention only).
* act_elems: tensors saved for backward (`torch.autograd.graph.saved_tensors_hooks`) during the
  module's forward, deduplicated by storage (a saved view counts its whole storage: that is what
  stays alive), parameters and buffers (e.g. rotary tables) excluded. Integer tensors (token ids, targets) count too.
* in_elems / out_elems: numel of the module's input / output.
* fwd_mem_elems (an approximation, named here): the sum of numel of the non-parameter tensor
  inputs and of the outputs of every forward aten op that is neither a view nor an op with a
  FlopCounterMode formula (matmul, conv, attention); i.e. each memory-bound op reads its inputs
  and writes its outputs once.

Whether gradients flow into a module's input is reproduced: the input of a module requires grad
iff an earlier module has trainable parameters (the raw batch never does). So the first module's
backward computes weight gradients only (a ViT patch conv, the first block of a model without
``embed``), exactly as in training.

Attention: `F.scaled_dot_product_attention` would take the math path on the meta device (it
materialises and saves the s*s score matrix and counts attention as bmm). A GPU runs a fused
kernel, so while measuring, calls without a mask are routed to the flash-attention op (grouped
key/value heads included) and calls with a mask to the memory-efficient op (saved: q, k, v,
output, log-sum-exp; 5 bmm in backward because the kernel recomputes the scores). A causal call
counts half the s*s product (`CAUSAL_FORMULAS`), the work a causal kernel does; FlopCounterMode
itself counts the full product. Other calls (no head dimension) keep the math path.
* act_matmul_elems: the part of act_elems whose storage an op with a FlopCounterMode formula
  wrote (matmul, conv, the attention kernel): what op-level selective checkpointing keeps.

The head's backward starts from ``model.loss(output, targets)`` when the model has ``loss`` and
targets are given (so the loss' saved tensors, e.g. log-softmax of the logits, count in the
head's act_elems); otherwise from a gradient of ones on the output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from shardsim.core.errors import ConfigError
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.importpath import first_line, resolve_import_path
from shardsim.specs.model.workload import Block, Workload

BATCH = 2  # samples per measured batch (every figure is divided by it)

_aten = torch.ops.aten
# Ops that move no data (or alias), not counted in fwd_mem_elems besides views.
_NO_TRAFFIC = {_aten._unsafe_view.default, _aten.detach.default, _aten.lift_fresh.default}


# --------------------------------------------------------------------------- attention


def _fused_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA through the fused kernels a GPU would run (see module docstring); None: not applicable."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or query.shape[-1] != value.shape[-1]:
        return None
    if query.shape[1] != key.shape[1] and not (enable_gqa and query.shape[1] % key.shape[1] == 0):
        return None
    if attn_mask is None:
        return _aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    if attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            attn_mask.logical_not(), float("-inf")
        )
    if query.shape[1] != key.shape[1]:
        return None  # the memory-efficient kernel takes no grouped heads: the math path
    b, h, s, _ = query.shape
    bias = attn_mask.expand(b, h, s, key.shape[2])
    need_lse = any(t.requires_grad for t in (query, key, value, bias))
    return _aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, need_lse, dropout_p, is_causal, scale=scale
    )[0]


def _causal_half(packet: Any, is_causal_at: int) -> Callable[..., int]:
    """FlopCounterMode's formula for `packet` (an op whose leading arguments are its q, k, v, or
    grad_out, q, k, v), halved when the call is causal: a causal kernel skips the masked blocks,
    half the s*s product (the diagonal's extra s/2 is not counted)."""
    full = flop_registry[packet]

    def count(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        flops = full(*args, out_val=out_val, **kwargs)
        causal = kwargs.get("is_causal", args[is_causal_at] if len(args) > is_causal_at else False)
        return flops // 2 if causal else flops

    count._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode passes the raw arguments
    return count


# Where each fused attention op takes `is_causal` (its position among the op's arguments). The
# CPU's flash kernel (what SDPA runs for a model measured on the CPU, where the GPU's fused ops do
# not exist) takes q, k, v as the GPU's flash kernel does and saves the same: it is counted with
# that kernel's formulas, so that a model measured on the CPU counts its attention as on the meta device.
_FLASH, _FLASH_BWD = _aten._scaled_dot_product_flash_attention, _aten._scaled_dot_product_flash_attention_backward
CAUSAL_FORMULAS = {
    _aten._scaled_dot_product_flash_attention: _causal_half(_aten._scaled_dot_product_flash_attention, 4),
    _aten._scaled_dot_product_efficient_attention: _causal_half(_aten._scaled_dot_product_efficient_attention, 6),
    _aten._scaled_dot_product_flash_attention_backward: _causal_half(
        _aten._scaled_dot_product_flash_attention_backward, 11
    ),
    _aten._scaled_dot_product_efficient_attention_backward: _causal_half(
        _aten._scaled_dot_product_efficient_attention_backward, 11
    ),
    _aten._scaled_dot_product_flash_attention_for_cpu: _causal_half(_FLASH, 4),
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _causal_half(_FLASH_BWD, 7),
}


def _flop_counter() -> FlopCounterMode:
    return FlopCounterMode(display=False, custom_mapping=CAUSAL_FORMULAS)


class _FusedAttention(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            try:
                out = _fused_sdpa(*args, **kwargs)
            except (RuntimeError, TypeError, ValueError, NotImplementedError):
                out = None
            if out is not None:
                return out
        return func(*args, **kwargs)


# --------------------------------------------------------------------------- counters


def _storage_key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # no storage (sparse, nested, some subclasses)
        return id(t)


def _storage_elems(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().nbytes() // max(t.element_size(), 1)
    except (RuntimeError, NotImplementedError):
        return t.numel()


class _MemTraffic(TorchDispatchMode):
    """Sum of numel of non-parameter inputs and of outputs of memory-bound, non-view aten ops."""

    def __init__(self, param_storages: set[int]):
        super().__init__()
        self.param_storages = param_storages
        self.elems = 0
        self.matmul_storages: set[int] = set()  # storages written by matmul, conv, attention
        self._keep: list[torch.Tensor] = []  # keep those storages alive so their ids stay unique

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in flop_registry or func.overloadpacket in flop_registry or func.overloadpacket in CAUSAL_FORMULAS:
            self._keep.extend(_tensors(out))
            self.matmul_storages.update(_storage_key(t) for t in self._keep[-len(_tensors(out)) :])
            return out
        if func.is_view or func in _NO_TRAFFIC:
            return out
        ins, _ = tree_flatten((args, kwargs))
        outs, _ = tree_flatten(out)
        for t in ins:
            if isinstance(t, torch.Tensor) and _storage_key(t) not in self.param_storages:
                self.elems += t.numel()
        for t in outs:
            if isinstance(t, torch.Tensor):
                self.elems += t.numel()
        return out


class _SavedTensors:
    """Elements saved for backward, by storage, parameters excluded (use as saved_tensors_hooks)."""

    def __init__(self, param_storages: set[int]):
        self.param_storages = param_storages
        self.storages: dict[int, int] = {}
        self._keep: list[torch.Tensor] = []  # keep storages alive so their ids stay unique

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in self.param_storages and key not in self.storages:
            self.storages[key] = _storage_elems(t)
            self._keep.append(t)
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    @property
    def elems(self) -> int:
        return sum(self.storages.values())

    def elems_of(self, keys: set[int]) -> int:
        return sum(n for k, n in self.storages.items() if k in keys)


# --------------------------------------------------------------------------- measuring


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _numel(x: Any) -> int:
    return sum(t.numel() for t in _tensors(x))


def _detach(x: Any, requires_grad: bool) -> Any:
    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        t = t.detach()
        if requires_grad and (t.is_floating_point() or t.is_complex()):
            t.requires_grad_(True)
        return t

    return tree_map(one, x)


def _call(module: nn.Module, x: Any) -> Any:
    return module(*x) if isinstance(x, tuple) else module(x)


def _measure_one(
    module: nn.Module,
    x: Any,
    *,
    name: str,
    kind: str,
    batch: int,
    param_storages: set[int],
    seen_params: set[int],
    loss: Callable[[Any], torch.Tensor] | None = None,
    like: tuple[Block, Any] | None = None,
) -> tuple[Block, Any]:
    params = tensors = largest = 0
    for p in module.parameters():
        if _storage_key(p) not in seen_params:
            seen_params.add(_storage_key(p))
            params += p.numel()
            tensors += 1
            largest = max(largest, p.numel())
    if like is not None:  # an identical module on an identical input, measured just before
        same = replace(like[0], name=name, kind=kind, params=params, param_tensors=tensors, largest_tensor=largest)
        return same, like[1]

    saved = _SavedTensors(param_storages)
    mem = _MemTraffic(param_storages)
    with _FusedAttention(), _flop_counter() as fwd_counter, mem:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            out = _call(module, x)
            root = loss(out) if loss is not None else None
    fwd_flops = fwd_counter.get_total_flops()

    bwd_flops = 0
    if root is not None and root.requires_grad:
        roots, grads = [root], [torch.ones_like(root)]
    else:
        roots = [t for t in _tensors(out) if t.requires_grad]
        grads = [torch.ones_like(t) for t in roots]
    if roots:
        with _flop_counter() as bwd_counter:
            torch.autograd.backward(roots, grads)
        bwd_flops = bwd_counter.get_total_flops()

    block = Block(
        name,
        params,
        fwd_flops / batch,
        bwd_flops / batch,
        mem.elems / batch,
        saved.elems / batch,
        _numel(x) / batch,
        _numel(out) / batch,
        kind,
        act_matmul_elems=saved.elems_of(mem.matmul_storages) / batch,
        param_tensors=tensors,
        largest_tensor=largest,
    )
    return block, out


def _tensor_sig(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), tuple(t.stride()), t.dtype, t.device.type, t.requires_grad)


def _signature(module: nn.Module, x: Any) -> tuple:
    """What a module's costs depend on: its class tree, public attributes (heads, causal, eps,
    activation functions...), parameter and buffer shapes, and the input's shapes. Anything
    unusual only makes two signatures differ, never wrongly equal, barring state kept outside
    the modules."""
    parts: list[tuple] = [tuple(_tensor_sig(t) if isinstance(t, torch.Tensor) else repr(t) for t in tree_flatten(x)[0])]
    for name, m in module.named_modules():
        attrs = tuple(
            (k, _tensor_sig(v) if isinstance(v, torch.Tensor) else repr(v))
            for k, v in sorted(vars(m).items())
            if not k.startswith("_")
        )
        hooks = tuple(len(getattr(m, h, ())) for h in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks"))
        parts.append((name, type(m), attrs, hooks))
    parts.extend((n, _tensor_sig(p)) for n, p in module.named_parameters())
    parts.extend((n, _tensor_sig(b)) for n, b in module.named_buffers())
    return tuple(parts)


def _batch_size(x: Any) -> int:
    ts = _tensors(x)
    if not ts or ts[0].dim() == 0:
        raise ValueError("the sample input must hold a tensor whose first dimension is the batch")
    return int(ts[0].shape[0])


def _device_of(model: nn.Module) -> torch.device:
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("meta")


def measure_module(
    model: nn.Module,
    name: str,
    sample_input: Any,
    *,
    targets: Any = None,
    import_path: str | None = None,
    reuse: bool = True,
) -> Workload:
    """The workload of `model` (``embed`` optional, ``blocks``, ``head``), measured per sample.

    `sample_input` is the batch given to the first module (a tuple is passed as positional
    arguments); its first dimension is the batch. `targets`, with a ``model.loss(output,
    targets)``, make the head's backward start from the loss. With `reuse`, a block identical to
    the one before it (same `_signature`: class tree, attributes, shapes, input) is not run again,
    its figures are copied (a 50-layer model costs one layer). Build the model on the meta device
    (``with torch.device("meta")``): a model elsewhere is measured where it is, at real cost.
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        raise ValueError("the model must have `blocks` (an nn.ModuleList of the layers) besides `embed` and `head`")
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        raise ValueError("the model must have `head` (an nn.Module applied after `blocks`)")
    embed = getattr(model, "embed", None)
    if embed is not None and not isinstance(embed, nn.Module):
        raise ValueError("`embed` must be an nn.Module or None")

    device = _device_of(model)
    to_dev = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    x = tree_map(to_dev, sample_input)
    if isinstance(x, list):
        x = tuple(x)
    targets = tree_map(to_dev, targets)
    batch = _batch_size(x)

    param_storages = {_storage_key(t) for t in (*model.parameters(), *model.buffers())}
    seen: set[int] = set()
    common = {"batch": batch, "param_storages": param_storages, "seen_params": seen}
    modules: list[tuple[str, str, nn.Module]] = []
    if embed is not None:
        modules.append(("embed", "embed", embed))
    modules.extend((f"layer{i}", "layer", b) for i, b in enumerate(blocks))
    modules.append(("head", "head", head))

    loss_fn = getattr(model, "loss", None)
    head_loss = (lambda out: loss_fn(out, targets)) if callable(loss_fn) and targets is not None else None

    grad_flows = any(t.requires_grad for t in _tensors(x))
    x = _detach(x, grad_flows)
    out_blocks: list[Block] = []
    tokens = 0
    prev: tuple[tuple, Block, Any] | None = None
    reused = 0
    for bname, kind, module in modules:
        if kind == "layer" and not tokens:
            first = _tensors(x)
            tokens = int(first[0].shape[1]) if first and first[0].dim() >= 3 else 1
        sig = _signature(module, x) if reuse and kind == "layer" else None
        like = (prev[1], prev[2]) if sig is not None and prev is not None and prev[0] == sig else None
        reused += like is not None
        block, out = _measure_one(
            module, x, name=bname, kind=kind, loss=head_loss if kind == "head" else None, like=like, **common
        )
        prev = (sig, block, out) if sig is not None else None
        out_blocks.append(block)
        grad_flows = grad_flows or any(p.requires_grad for p in module.parameters())
        x = _detach(out, grad_flows)

    arch = getattr(model, "arch", None)
    if isinstance(arch, Arch):
        tokens = arch.tokens
    else:
        arch = None
    notes = {
        "measured": f"meta device, batch {batch}, FlopCounterMode, fused attention; {reused} identical blocks reused"
    }
    total = sum(p.numel() for p in model.parameters())
    counted = sum(b.params for b in out_blocks)
    if total != counted:
        notes["params"] = f"{total - counted} parameters outside embed/blocks/head are not costed"
    return Workload(
        name=name,
        blocks=tuple(out_blocks),
        tokens_per_sample=tokens or 1,
        arch=arch,
        import_path=import_path,
        notes=notes,
    )


# --------------------------------------------------------------------------- import paths


def _sample(model: nn.Module, path: str) -> tuple[Any, Any]:
    if callable(getattr(model, "sample_batch", None)):
        make, what = (lambda: model.sample_batch(BATCH)), "sample_batch"
    elif callable(getattr(model, "example_input", None)):
        make, what = (lambda: (model.example_input(BATCH), None)), "example_input"
    else:
        raise ConfigError(
            f"workload {path!r}: the model has neither sample_batch(batch) -> (inputs, targets) "
            "nor example_input(batch) -> inputs"
        )
    try:
        try:
            with torch.device("meta"):
                got = make()
        except Exception:
            got = make()  # e.g. a CPU generator inside: make it on the CPU and move it
    except Exception as err:
        raise ConfigError(f"workload {path!r}: model.{what}({BATCH}) failed: {first_line(err)}") from None
    if what == "sample_batch":
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise ConfigError(f"workload {path!r}: model.sample_batch must return (inputs, targets)")
        return got[0], got[1]
    return got


def measure_import_path(path: str) -> Workload:
    """Build ``pkg.module:build_fn`` on the meta device and measure it (`measure_module`)."""
    build = resolve_import_path(path)
    try:
        with torch.device("meta"):
            model = build()
    except Exception as err:
        raise ConfigError(f"workload {path!r}: building the model failed: {first_line(err)}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"workload {path!r}: the build function returned {type(model).__name__}, not an nn.Module")
    for part, want in (("blocks", "an nn.ModuleList of the layers"), ("head", "an nn.Module")):
        if not isinstance(getattr(model, part, None), nn.Module):
            raise ConfigError(
                f"workload {path!r}: the model has no `{part}` ({want}); expected `embed` (or None), `blocks`, `head`"
            )
    if any(t.device.type != "meta" for t in _iter_tensors(model)):
        model = model.to("meta")  # the build function chose a device itself: cost it free anyway
    inputs, targets = _sample(model, path)
    try:
        return measure_module(model, path, inputs, targets=targets, import_path=path)
    except Exception as err:
        raise ConfigError(f"workload {path!r}: measuring the model failed: {first_line(err)}") from None


def _iter_tensors(model: nn.Module) -> Iterable[torch.Tensor]:
    yield from model.parameters()
    yield from model.buffers()
