"""Compute time of blocks on a device: roofline-style, per operation kind.

time = matmul FLOPs / (peak[precision] × matmul_efficiency[precision])
     + memory-bound bytes / (memory bandwidth × memory_efficiency)
The two terms add (no overlap between GEMMs and elementwise kernels): a named
simplification. A measured profile (`shardsim profile`) replaces both when given.

On a GPU whose topology file gives kernel-level figures (`device.kernels`), a block of a
model described by an `Arch` is costed from its kernels instead (`simulator.gpu_kernels`:
GEMMs at their shapes, fused attention, memory-bound kernels, the eager per-kernel floor);
the roofline stays for CPUs and for models given by import path (no `Arch`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from shardsim.core.errors import ConfigError
from shardsim.simulator import attention_impl as ai
from shardsim.simulator import float8 as f8
from shardsim.simulator import fusion, optimizers
from shardsim.simulator import gpu_kernels as gk
from shardsim.simulator.hardware.profile import Profile
from shardsim.specs.hardware.topology import DeviceSpec, KernelSpec
from shardsim.specs.model.blocks import attention_flops
from shardsim.specs.model.float8 import converted_gemms
from shardsim.specs.model.workload import Arch, Block

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "tf32": 4}  # tf32 stores fp32
BWD_MEM_FACTOR = 2.0  # backward touches each elementwise tensor about twice (grad in, grad out)
ADAM_BYTES_PER_PARAM = optimizers.OPTIMIZERS["adam"].step_words * 4  # read param, grad, m, v; write param, m, v
# The optimizers' implementations (torch.optim's foreach=True | fused=True | foreach=False) in time:
# foreach and fused are charged the same minimal traffic (`optimizers`: foreach's extra passes
# over its temporaries are not counted, an assumption); per-parameter adds, per parameter tensor,
# one launch per elementwise op of torch's _single_tensor_<optimizer>.
ADAM_OPS_PER_TENSOR = optimizers.OPTIMIZERS["adam"].ops_per_tensor
KERNEL_LAUNCH_S = 5e-6  # one op's launch and dispatch (assumption)


@lru_cache(maxsize=16)
def _whole_blocks(arch: Arch) -> dict[str, Block]:
    """The blocks of a model of `arch` as one rank holds them whole, by name."""
    from shardsim.specs.model.blocks import from_arch

    return {b.name: b for b in from_arch("whole", arch).blocks}


@dataclass(frozen=True)
class BlockCost:
    fwd_s: float  # per microbatch
    bwd_s: float  # per microbatch, without recompute
    fwd_mem_s: float = 0.0  # the memory-bound part of fwd_s (what op-level selective checkpointing recomputes)


@dataclass(frozen=True)
class FsdpCpu:
    """FSDP2's own work on a rank's compute stream, per parameter of a unit: per all-gather
    (copying the shard in and the gathered unit out, the unshard hooks), and per
    reduce-scatter (copying the unsharded gradients in, the shard out, the post-backward hooks)."""

    gather_s_per_param: float = 0.0
    reduce_s_per_param: float = 0.0


@dataclass(frozen=True)
class ComputeModel:
    device: DeviceSpec
    precision: str
    profile: Profile | None = None  # measured block and optimizer times replace the roofline
    optimizer_impl: str = "foreach"  # foreach | fused | per-parameter
    arch: Arch | None = None  # the model's shape: with a GPU's kernel figures, blocks are costed from kernels
    # Kernels each block launches per pass beyond its own (forward, backward), in the model from
    # kernels: e.g. autocast's casts of fp32 parameters, or a timing harness's ops.
    extra_kernels: tuple[int, int] = (0, 0)
    sync_ranks: int = 1  # ranks that wait on each other every step (the slowest sets the pace)
    reduce_dtype: str | None = None  # FSDP's reduce-scatter dtype (None: the training precision)
    tp: int = 1  # tensor-parallel degree: the blocks' kernels are one rank's shards of them
    sequence_parallel: bool = False
    optimizer_kind: str = "adam"  # `simulator.optimizers` (the `optimizer` setting)
    attention: str = "flash"  # flash | efficient | cudnn | math | eager (`simulator.attention_impl`)
    compile: bool = False  # torch.compile of the layers (`simulator.fusion`)
    float8: str = "none"  # Float8 training of the layers' linears: none | tensorwise | rowwise (`simulator.float8`)
    float8_all_gather: bool = False  # FSDP2's float8 all-gather: the weights arrive cast (`simulator.float8`)
    cp: int = 1  # context-parallel degree: `arch` is one rank's share of the sequence (`cp_workload`)
    # mixture of experts (`gpu_kernels.GroupedGemm`): the busiest expert's tokens over the mean, and
    # the capacity factor (0: dropless)
    moe_imbalance: float = 1.0
    moe_capacity: float = 0.0
    ep: int = 1  # expert-parallel degree: an MoE layer's grouped GEMMs are the busiest EP rank's

    def __post_init__(self) -> None:
        if not self.device.supports(self.precision):
            have = ", ".join(self.device.peak_tflops)
            raise ConfigError(
                f"{self.device.model} has no {self.precision} support (peak_tflops lists {have})", field="precision"
            )

    @property
    def flops_per_s(self) -> float:
        d = self.device
        return d.peak_tflops[self.precision] * 1e12 * d.matmul_efficiency[self.precision]

    @property
    def mem_bytes_per_s(self) -> float:
        return self.device.memory_bandwidth_GBps * 1e9 * self.device.memory_efficiency

    @property
    def by_name(self) -> bool:
        """Whether a block's cost depends on its name, not only on its shape: a profile measures
        blocks by name, and an MLP's first block computes no input gradient (`gpu_kernels`)."""
        return self.profile is not None or (self.arch is not None and not self.arch.spec.transformer)

    def block(self, b: Block, batch: int) -> BlockCost:
        esize = DTYPE_BYTES[self.precision]
        mem = b.fwd_mem_elems * self._fused_share(b) * batch * esize / self.mem_bytes_per_s
        measured = self.profile.block_time(b.name, batch) if self.profile else None
        if measured is not None and self.tp > 1:
            measured = self._tp_share(b, batch, measured)
        if measured is not None:  # its memory-bound part from the roofline, at most the measured forward
            return BlockCost(measured[0], measured[1], min(mem, measured[0]))
        kernels = self._kernels(b, batch)
        if kernels is not None:
            return self._from_kernels(kernels, mem, self._layer(b), b.kind)
        fwd = b.fwd_flops * batch / self.flops_per_s + mem
        bwd = b.bwd_flops * batch / self.flops_per_s + BWD_MEM_FACTOR * mem
        attn = self._attention(b, batch)
        if self.attention in ("math", "eager") and attn is not None:
            # the roofline's unfused attention: the work beyond the fused kernels' (full S x S;
            # backward 4 GEMMs against their 2.5) and the score tensor's traffic (the roofline
            # keeps the precision's matmul rate for math's too: CPUs have fp32 only)
            ff, bf = ai.math_flops(attn)
            fm, bm = self._score_bytes(attn)
            fwd += (ff - attn.fwd_flops) / self.flops_per_s + fm / self.mem_bytes_per_s
            bwd += (bf - gk.BWD_ATTN_WORK * attn.fwd_flops) / self.flops_per_s + bm / self.mem_bytes_per_s
        return BlockCost(fwd, bwd, mem)

    def _score_bytes(self, a: gk.Attention) -> tuple[float, float]:
        """Bytes the unfused attention's memory-bound kernels move over the score tensor (forward,
        backward): math's fp32 passes, or eager's kernels in the training precision."""
        if self.attention == "math":
            fm, bm = ai.math_mem_elems(a)
            return fm * ai.SCORE_BYTES, bm * ai.SCORE_BYTES
        e = ai.score_elems(a)
        return e * sum(ai.eager_fwd_kernels(a.causal, self.precision)), e * sum(ai.eager_bwd_kernels(self.precision))

    def _layer(self, b: Block) -> bool:
        """Whether `b` is a transformer layer of a described model (what compile and the attention choice change)."""
        return b.kind == "layer" and self.arch is not None and self.arch.spec.transformer

    def _fused_share(self, b: Block) -> float:
        """The share of a block's memory-bound traffic left under torch.compile (1 in eager)."""
        if not self.compile or not self._layer(b):
            return 1.0
        assert self.arch is not None
        return fusion.compiled_share(self.arch, self.tp, self.sequence_parallel)

    def _attention(self, b: Block, batch: int) -> gk.Attention | None:
        """The attention call of a transformer layer for `batch` samples (one rank's heads)."""
        if not self._layer(b):
            return None
        a = self.arch
        assert a is not None
        return gk.Attention(batch * a.heads // self.tp, a.tokens, a.head_dim, causal=a.traits.causal)

    def _tp_share(self, b: Block, batch: int, measured: tuple[float, float]) -> tuple[float, float]:
        """A tensor-parallel rank's share of a block the profile measured whole: the measured
        times scaled by the profile's measured share of the rank's whole model over the model's
        at this microbatch size or the nearest measured (`Profile.tp_share_at`: its shards and
        DTensor's dispatch), or without one by the
        roofline's time of the rank's shard over the whole block's (a named approximation: on a
        CPU it takes a rank of small-gpt for 0.54 of the model, where it runs 0.81)."""
        assert self.profile is not None and self.arch is not None  # tensor parallelism needs an Arch
        share = self.profile.tp_share_at(self.tp, self.sequence_parallel, batch)
        if share is not None:
            return measured[0] * share[0], measured[1] * share[1]
        whole = _whole_blocks(self.arch)[b.name]
        one = ComputeModel(self.device, self.precision)  # the roofline alone
        mine, full = one.block(b, batch), one.block(whole, batch)
        return measured[0] * mine.fwd_s / full.fwd_s, measured[1] * mine.bwd_s / full.bwd_s

    def _kernels(self, b: Block, batch: int) -> gk.BlockKernels | None:
        if self.device.kind != "gpu" or self.device.kernels is None or self.arch is None:
            return None
        return gk.block_kernels(self.arch, b, batch, self.tp, self.moe_imbalance, self.moe_capacity, self.ep)

    def _from_kernels(self, k: gk.BlockKernels, mem: float, layer: bool = False, kind: str = "") -> BlockCost:
        """A block's cost from its kernels (`simulator.gpu_kernels`); `mem` is its memory-bound
        forward time (the same traffic as the roofline's, at the achieved HBM bandwidth); the
        attention as configured (`attention_impl`); `layer`: a transformer layer, whose
        memory-bound kernels torch.compile fuses (`fusion`); `kind` the block's (a layer's
        linears are the ones Float8 training converts)."""
        spec, esize, bw = self.device.kernels, DTYPE_BYTES[self.precision], self.mem_bytes_per_s
        assert spec is not None
        # a training step's GEMMs and attention run at the device's training fractions of the
        # kernel benchmarks (`KernelSpec.gemm_training_fraction`, `attn_training_fraction`)
        rate = self.flops_per_s * spec.gemm_training_fraction
        if self.float8 != "none" and kind == "layer":
            fwd_k, bwd_k = self.float8_kernels(k, rate)
        else:
            fwd_k = [self.gemm_s(g) for g in k.fwd_gemms]
            bwd_k = [self.gemm_s(g) for g in k.bwd_gemms]
        fwd_k += [gk.grouped_gemm_time(g, spec, rate, bw, esize) for g in k.grouped]
        bwd_k += [gk.grouped_gemm_time(g, spec, rate, bw, esize) for g in k.bwd_grouped]
        if k.attention is not None and self.attention == "math":
            # in fp32 (`attention_impl`): its GEMMs at the fp32 rate (TF32's under tf32), fp32 scores
            fp = "tf32" if self.precision == "tf32" else "fp32"
            fp_rate = (
                self.device.peak_tflops[fp] * 1e12 * self.device.matmul_efficiency[fp] * spec.gemm_training_fraction
            )
            sb = ai.SCORE_BYTES
            fg, bg = ai.math_gemms(k.attention)
            fwd_k += [gk.gemm_time(g, spec, fp_rate, bw, sb) for g in fg]
            bwd_k += [gk.gemm_time(g, spec, fp_rate, bw, sb) for g in bg]
            # the score tensor's memory-bound kernels, each its own (softmax, the causal mask's add)
            e = ai.score_elems(k.attention) * sb / bw
            fwd_k.append(ai.SCORE_FWD_PASSES * e)
            if k.attention.causal:
                fwd_k.append(ai.CAUSAL_MASK_PASSES * e)
            bwd_k.append(ai.SCORE_BWD_PASSES * e)
        elif k.attention is not None and self.attention == "eager":
            # in the training precision (`attention_impl`): its GEMMs at the layer's GEMM rate, the
            # score tensor's elementwise kernels each its own at the bytes it reads and writes
            fg, bg = ai.math_gemms(k.attention)
            fwd_k += [gk.gemm_time(g, spec, rate, bw, esize) for g in fg]
            bwd_k += [gk.gemm_time(g, spec, rate, bw, esize) for g in bg]
            per_byte = ai.score_elems(k.attention) / bw
            fwd_k += [b * per_byte for b in ai.eager_fwd_kernels(k.attention.causal, self.precision)]
            bwd_k += [b * per_byte for b in ai.eager_bwd_kernels(self.precision)]
        elif k.attention is not None:
            fwd_scale, bwd_scale = self._attention_scale(spec)
            fwd_k.append(self._ring_attention_time(spec, k.attention, bwd=False, scale=fwd_scale))
            bwd_k.append(self._ring_attention_time(spec, k.attention, bwd=True, scale=bwd_scale))
        mem_bytes = mem * bw
        ef, eb = self.extra_kernels
        if layer and self.compile:
            ef, eb = ef - fusion.FWD_KERNELS_SAVED, eb - fusion.BWD_KERNELS_SAVED
        slowest = gk.slowest_of(self.sync_ranks, spec.rank_time_cv)
        fwd = gk.pass_time(fwd_k, mem_bytes, k.fwd_other_kernels + ef, spec, bw) * slowest
        bwd = gk.pass_time(bwd_k, BWD_MEM_FACTOR * mem_bytes, k.bwd_other_kernels + eb, spec, bw) * slowest
        floor = spec.kernel_floor_us * 1e-6
        return BlockCost(fwd, bwd, min(fwd, max(mem, k.fwd_other_kernels * floor)))

    def moe_parts(self, b: Block, batch: int) -> dict[str, float]:
        """Seconds of an MoE layer's parts (forward + backward) for `batch` samples, each alone
        (without the eager floor or the pass's other kernels): the router (its GEMM, softmax and
        top-k), the permutation and un-permutation of the tokens, the routed experts' grouped
        GEMMs and the shared expert's GEMMs; empty for another block or without kernel figures."""
        k = self._kernels(b, batch) if b.moe is not None else None
        spec = self.device.kernels
        if k is None or k.moe is None or spec is None:
            return {}
        esize, bw = DTYPE_BYTES[self.precision], self.mem_bytes_per_s
        rate = self.flops_per_s * spec.gemm_training_fraction

        def gemms(gs: tuple[gk.Gemm, ...]) -> float:
            with_bwd = gk.BlockKernels(gs, None, 0, 0).bwd_gemms
            return sum(self.gemm_s(g) for g in (*gs, *with_bwd))

        mem = 1 + BWD_MEM_FACTOR  # the memory-bound kernels' backward touches their tensors again
        grouped = (*k.grouped, *k.bwd_grouped)
        return {
            "router_s": gemms((k.moe.router,)) + mem * k.moe.router_elems * esize / bw,
            "permute_s": mem * k.moe.permute_elems * esize / bw,
            "grouped_gemm_s": sum(gk.grouped_gemm_time(g, spec, rate, bw, esize) for g in grouped),
            "shared_expert_s": gemms(k.moe.shared),
        }

    def gemm_s(self, g: gk.Gemm) -> float:
        """Seconds of one GEMM of a training step in the compute precision: the kernel model's at the
        device's training fraction of its GEMM rate where the device has kernel figures, else the
        roofline's (its FLOPs at the matmul rate, or its operands' and result's bytes at HBM's)."""
        spec, esize, bw = self.device.kernels, DTYPE_BYTES[self.precision], self.mem_bytes_per_s
        if spec is None:
            return max(g.flops / self.flops_per_s, (g.m * g.k + g.k * g.n + g.m * g.n) * esize / bw)
        return gk.gemm_time(g, spec, self.flops_per_s * spec.gemm_training_fraction, bw, esize)

    def float8_kernels(self, k: gk.BlockKernels, rate: float) -> tuple[list[float], list[float]]:
        """A layer's GEMMs and Float8 scaling kernels in seconds (forward, backward), its converted
        linears' GEMMs at the FP8 rate (`simulator.float8`), the others at `rate`."""
        spec, esize, bw = self.device.kernels, DTYPE_BYTES[self.precision], self.mem_bytes_per_s
        assert spec is not None and self.arch is not None and self.device.float8 is not None
        rate8 = f8.float8_rate(self.device) * spec.gemm_training_fraction
        out_rate = rate8 * (self.device.float8.rowwise_gemm_rate if self.float8 == "rowwise" else 1.0)
        conv = converted_gemms(self.arch)

        def time(g: gk.Gemm, fp8: bool, fp8_rate: float) -> float:
            if not fp8:
                return gk.gemm_time(g, spec, rate, bw, esize)
            return gk.gemm_time(g, spec, fp8_rate, bw, f8.FP8_BYTES, f8.HP_BYTES)

        fwd_k = [time(g, c, out_rate) for g, c in zip(k.fwd_gemms, conv, strict=True)]
        bwd_k = [time(g, c, rate8) for g, c in zip(k.bwd_gemms, f8.bwd_converted(k, conv), strict=True)]
        fwd_b, bwd_b = f8.scaling_bytes(self.arch, k, self.float8, self.float8_all_gather)
        return fwd_k + [b / bw for b in fwd_b], bwd_k + [b / bw for b in bwd_b]

    def gathered_bytes(self, b: Block, param_bytes: int) -> float:
        """Bytes FSDP2 all-gathers of block `b` (its converted weights in float8 with float8 all-gather)."""
        return f8.gathered_bytes(self.arch, b, self.tp, param_bytes, self.float8_all_gather)

    def _attention_scale(self, spec: KernelSpec) -> tuple[float, float]:
        """The fused attention kernels' (forward, backward) rate against the kernel figures' (which
        are FlashAttention-2's): those are the half-precision tensor path's; fp32 runs at its own
        peak's share, and so does tf32 (the fused kernels take fp32 inputs in fp32 whatever
        allow_tf32 says); efficient and cudnn at their share of flash's (`attention_impl`)."""
        attn_peak = self.device.peak_tflops["fp32" if self.precision == "tf32" else self.precision]
        scale = attn_peak / max(self.device.peak_tflops.values()) * spec.attn_training_fraction
        if self.attention == "efficient":
            return scale * ai.EFFICIENT_RATE, scale * ai.EFFICIENT_RATE
        if self.attention == "cudnn":
            fwd, bwd = ai.cudnn_rates(self.device.model)
            return scale * fwd, scale * bwd
        return scale, scale

    def _ring_attention_time(self, spec: KernelSpec, a: gk.Attention, bwd: bool, scale: float) -> float:
        """A pass of attention `a` (one rank's, its local tokens): one call, or with context
        parallelism ring attention's cp calls (`cp_workload`): round 0 causal over the local tokens,
        each later round as much work as half a non-causal call over them, timed so (a named
        approximation: the half-length call's own rate is not looked up)."""
        t = gk.attention_time(spec, a, bwd=bwd, scale=scale)
        if self.cp > 1:
            t += (self.cp - 1) * gk.attention_time(spec, replace(a, causal=False), bwd=bwd, scale=scale) / 2
        return t

    def attention_s(self, b: Block, batch: int) -> tuple[float, float]:
        """Seconds of (forward, backward) of transformer layer `b`'s attention kernels at `batch`
        (what context parallelism's rounds overlap their collectives with): from the GPU's
        kernel figures where the device has them, else from its FLOPs on the roofline."""
        if not self._layer(b):
            return 0.0, 0.0
        kernels = self._kernels(b, batch)
        if kernels is not None and kernels.attention is not None and self.device.kernels is not None:
            spec = self.device.kernels
            fwd_scale, bwd_scale = self._attention_scale(spec)
            a = kernels.attention
            return (
                self._ring_attention_time(spec, a, bwd=False, scale=fwd_scale),
                self._ring_attention_time(spec, a, bwd=True, scale=bwd_scale),
            )
        assert self.arch is not None
        fwd = attention_flops(self.arch) / self.tp * self.cp * batch / self.flops_per_s
        return fwd, gk.BWD_ATTN_WORK * fwd

    def optimizer(self, local_params: float, tensors: int = 0) -> float:
        """The optimizer's step over the parameters this rank owns (memory-bound: its words read
        and written, `optimizers`), held in `tensors` parameter tensors (what the per-parameter
        loop launches its ops for). A profile's measured (Adam) time per parameter is scaled by
        the optimizer's traffic over Adam's (named)."""
        opt = optimizers.spec(self.optimizer_kind)
        if self.profile and self.profile.optimizer_per_param_s is not None:
            return self.profile.optimizer_per_param_s * local_params * opt.step_words * 4 / ADAM_BYTES_PER_PARAM
        t = local_params * opt.step_words * 4 / self.mem_bytes_per_s
        if self.optimizer_impl == "per-parameter":
            t += tensors * opt.ops_per_tensor * KERNEL_LAUNCH_S
        return t

    def sharded_optimizer_overhead(self) -> float:
        """What an optimizer step on FSDP2's sharded (DTensor) parameters costs on top: the
        profile's measured figure (dispatch per parameter tensor, whatever the shard size);
        0 without one (the roofline has no per-op cost: an assumption)."""
        if self.profile and self.profile.sharded_optimizer_overhead_s is not None:
            return self.profile.sharded_optimizer_overhead_s
        return 0.0

    def fsdp_cpu(self, params: float, layer_params: float) -> FsdpCpu:
        """FSDP2's own cost per unit parameter for a model of `params` parameters whose blocks
        (the units resharded after forward) hold `layer_params`, from the profile's measured
        whole-model overheads: a forward all-gathers every unit once, so it sets the cost per
        gathered parameter; a backward all-gathers the blocks again and reduce-scatters every
        unit, so what is left of it over the gathers sets the cost per reduced parameter
        (at least 0). Zero without a measured figure: an assumption (on a GPU these copies run
        on the device's streams, beside the blocks' kernels)."""
        fo = self.profile.fsdp_overhead_s if self.profile else None
        if fo is None and self.device.kind == "gpu" and self.device.kernels is not None:
            return self._fsdp_copies()
        if fo is None or params <= 0:
            return FsdpCpu()
        gather = fo[0] / params
        return FsdpCpu(gather, max(0.0, fo[1] - gather * layer_params) / params)

    def _fsdp_copies(self) -> FsdpCpu:
        """FSDP's copies on a GPU at the achieved HBM bandwidth, per parameter of a unit: after an
        all-gather the gathered buffer is copied out into the parameters (read + write); before
        a reduce-scatter the unsharded gradients are copied in (read in the training precision,
        written in the reduce dtype). The copies of the 1/N shard (copy-in of a gather, copy-out
        of a reduce-scatter) are left out: small at scale (a named simplification)."""
        pb = DTYPE_BYTES[self.precision]
        rb = DTYPE_BYTES[self.reduce_dtype or self.precision]
        return FsdpCpu(2 * pb / self.mem_bytes_per_s, (pb + rb) / self.mem_bytes_per_s)

    @property
    def peak_flops(self) -> float:
        return self.device.peak_tflops[self.precision] * 1e12
