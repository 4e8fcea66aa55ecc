"""A device's FP8 tensor cores (the ``float8`` mapping of a device in a topology file): what
Float8 training's GEMMs run at. A device without the mapping has no FP8 tensor cores (A100,
V100, T4), and Float8 training is refused on it."""

from __future__ import annotations

from dataclasses import dataclass

from shardsim.core.yamlio import Fields

FLOAT8_KEYS = ("peak_tflops", "matmul_efficiency", "rowwise_gemm_rate")


@dataclass(frozen=True)
class Float8Spec:
    """FP8 (e4m3) dense tensor-core peak, the fraction of it a large scaled GEMM sustains
    (torch._scaled_mm with tensorwise scales, cuBLAS), and a rowwise-scaled GEMM's rate over
    the tensorwise one's (the CUTLASS kernel _scaled_mm runs for rowwise scales)."""

    peak_tflops: float
    matmul_efficiency: float
    rowwise_gemm_rate: float


def parse_float8(f: Fields | None, sources: dict[str, str]) -> Float8Spec | None:
    """The ``float8`` mapping of a device (None where it has none), its figures' sources into `sources`."""
    if f is None:
        return None
    f.closed(FLOAT8_KEYS)
    spec = Float8Spec(
        peak_tflops=f.number("peak_tflops"),
        matmul_efficiency=f.number("matmul_efficiency", maximum=1.0),
        rowwise_gemm_rate=f.number("rowwise_gemm_rate", maximum=1.0),
    )
    sources |= {f"{f.prefix}{k}": src for k in FLOAT8_KEYS if (src := f.source(k))}
    return spec
