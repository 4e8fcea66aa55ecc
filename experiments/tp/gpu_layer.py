"""One tensor-parallel rank's transformer layer on one GPU: forward and forward + backward time of
the layer as a rank of a tp-way group computes it (its shards of q/k/v, the output projection and
the MLP; its heads), for tp = 1, 2, 4, 8, against the simulator's block time for the same shapes.

What it checks: that the kernel model (`simulator.gpu_kernels`) follows the GEMMs and attention as
tensor parallelism shrinks them. The collectives are not here (one GPU). The module mirrors the
runtime's layer (`runtime.models.transformer.TransformerLayer`: RMSNorm, fused q/k/v, rotary,
SDPA with grouped-query attention, SwiGLU) at a rank's local shapes.

    python experiments/tp/gpu_layer.py --out DIR          # on a GPU: measures, writes DIR/measured.csv
    python experiments/tp/gpu_layer.py --compare FILE     # here: adds the simulator's times, prints the table
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

MODELS = {  # hidden, heads, kv heads, ffn (Llama 3.1 configs)
    "llama-3.1-70b": (8192, 64, 8, 28672),
    "llama-3.1-8b": (4096, 32, 8, 14336),
}
CASES = [(m, tp, b, s) for m in MODELS for tp in (1, 2, 4, 8) for b, s in ((1, 4096), (2, 4096), (1, 8192))]


def measure(out: Path, repeats: int, device: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class RankLayer(nn.Module):
        def __init__(self, h: int, heads: int, kv: int, f: int, tp: int):
            super().__init__()
            self.hd = h // heads
            self.hq, self.kv = heads // tp, max(1, kv // tp)
            self.ln1, self.ln2 = nn.RMSNorm(h), nn.RMSNorm(h)
            self.qkv = nn.Linear(h, (self.hq + 2 * self.kv) * self.hd, bias=False)
            self.proj = nn.Linear(self.hq * self.hd, h, bias=False)
            self.gate = nn.Linear(h, f // tp, bias=False)
            self.up = nn.Linear(h, f // tp, bias=False)
            self.down = nn.Linear(f // tp, h, bias=False)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            hd = self.hd
            q, k, v = self.qkv(self.ln1(x)).split([self.hq * hd, self.kv * hd, self.kv * hd], dim=-1)
            q = q.view(b, s, self.hq, hd).transpose(1, 2)
            k = k.view(b, s, self.kv, hd).transpose(1, 2)
            v = v.view(b, s, self.kv, hd).transpose(1, 2)

            def rot(t):
                t1, t2 = t.chunk(2, dim=-1)
                return t * cos + torch.cat((-t2, t1), dim=-1) * sin

            q, k = rot(q), rot(k)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.hq != self.kv)
            x = x + self.proj(y.transpose(1, 2).reshape(b, s, self.hq * hd))
            z = self.ln2(x)
            return x + self.down(F.silu(self.gate(z)) * self.up(z))

    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rows = []
    for m, tp, b, s in CASES:
        h, heads, kv, f = MODELS[m]
        if dev.type != "cuda":  # a smoke run: tiny shapes
            h, heads, kv, f, s = 256, 8, 2, 512, 64
        layer = RankLayer(h, heads, kv, f, tp).to(dev, dtype)
        hd = h // heads
        inv = 1.0 / 10000 ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd)
        ang = torch.outer(torch.arange(s, device=dev, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), dim=-1)
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        x = torch.randn(b, s, h, device=dev, dtype=dtype, requires_grad=True)

        times = _times(layer, x, cos, sin, repeats, dev)
        rows.append({"model": m, "tp": tp, "batch": b, "seq": s, "fwd_s": times["fwd"], "fwd_bwd_s": times["fwd_bwd"]})
        print(f"{m} tp={tp} b={b} s={s}: fwd {times['fwd'] * 1e3:.3f} ms, fwd+bwd {times['fwd_bwd'] * 1e3:.3f} ms",
              flush=True)  # fmt: skip
        del layer, x
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "measured.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*rows[0], "device", "torch"])
        w.writeheader()
        for r in rows:
            w.writerow({**r, "device": name, "torch": torch.__version__})


def _times(layer, x, cos, sin, repeats: int, dev) -> dict[str, float]:
    """Seconds of a forward (no grad) and of a forward + backward, each the mean of `repeats` after 3 warm-ups."""
    import time

    import torch

    def fwd():
        with torch.no_grad():
            layer(x, cos, sin)

    def fwd_bwd():
        layer(x, cos, sin).sum().backward()

    times = {}
    for name, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
        for _ in range(3):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                fn()
            end.record()
            torch.cuda.synchronize()
            times[name] = start.elapsed_time(end) / repeats / 1e3
        else:
            t = time.perf_counter()
            for _ in range(repeats):
                fn()
            times[name] = (time.perf_counter() - t) / repeats
    return times


def compare(path: Path, topology: str) -> list[dict]:
    """The measured rows with the simulator's forward and backward of the same layer on `topology`'s GPU."""
    from shardsim.simulator.compute import ComputeModel
    from shardsim.simulator.workload.resolve import load_workload
    from shardsim.specs.hardware.topology import make_cluster
    from shardsim.specs.model.blocks import from_arch

    dev = make_cluster(topology, 1).instance.device
    out = []
    with open(path) as fh:
        for r in csv.DictReader(fh):
            tp, b, s = int(r["tp"]), int(r["batch"]), int(r["seq"])
            w = load_workload(r["model"], _shape(s))
            layer = from_arch(w.name, w.arch, tp).layers[0]
            c = ComputeModel(dev, "bf16", arch=w.arch, tp=tp).block(layer, b)
            out.append({**r, "pred_fwd_s": c.fwd_s, "pred_fwd_bwd_s": c.fwd_s + c.bwd_s})
    return out


def _shape(seq: int):
    from shardsim.specs.model.arch import Shape

    return Shape(seq_len=seq)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="measure here (a GPU) and write OUT/measured.csv")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--compare", type=Path, help="a measured.csv: print it beside the simulator's times")
    p.add_argument("--topology", default="p5e.48xlarge", help="whose GPU the simulator costs (default: H200's p5e)")
    a = p.parse_args(argv)
    if a.out:
        measure(a.out, a.repeats, a.device)
    if a.compare:
        rows = compare(a.compare, a.topology)
        print(f"{'model':14s} {'tp':>2s} {'b':>2s} {'seq':>5s} {'fwd+bwd ms':>10s} {'pred ms':>8s} {'ratio':>6s}")
        for r in rows:
            meas, pred = float(r["fwd_bwd_s"]), r["pred_fwd_bwd_s"]
            print(f"{r['model']:14s} {r['tp']:>2s} {r['batch']:>2s} {r['seq']:>5s} {meas * 1e3:10.2f} "
                  f"{pred * 1e3:8.2f} {pred / meas:6.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
