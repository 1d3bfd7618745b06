"""Time the batch-invariant linear kernel (``rowwise.c``) for several register-block shapes.

A block is GV weight vectors (G = GV x vector width output columns) by MB rows of x. Each
shape is built from today's source with ``-DGV=.. -DMB=..``, packs its own copy of the
weights (the packing follows G), and the shapes run interleaved in one process, so a
neighbour's load hits them alike. Reported: the linear part of a SmolLM2-135M forward,
30 x (qkv + o + gate_up + down) + the LM head, for n = 1, 2, 4, 8 rows, minimum of the rounds.
Each weight is cycled through copies (``--copies-mb``) so that it streams from the L3 cache
(40 MB, the default) or from memory (400 MB), as in a forward.

    python scripts/linear_blocks.py --dtype bfloat16 --shapes 2x12,3x8      # AVX-512
    ATEN_CPU_CAPABILITY=avx2 python scripts/linear_blocks.py --shapes 2x6,3x4   # as AVX2
"""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app.engine import kernels  # noqa: E402

SHAPES = {"qkv": (960, 576, 30), "o": (576, 576, 30), "gate_up": (3072, 576, 30), "down": (576, 1536, 30),
          "lm_head": (49152, 576, 1)}     # (N, K, times per forward)


def build(kind: str, gv: int, mb: int, folder: Path):
    out = folder / f"rowwise-{kind}-{gv}x{mb}.so"
    cmd = kernels.command(kind, kernels.compiler(), out)
    cmd[1:1] = [f"-DGV={gv}", f"-DMB={mb}"]
    subprocess.run(cmd, check=True)
    return kernels.declare(ctypes.CDLL(str(out)), kind)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--shapes", default="3x8,2x12", help="GVxMB,... (MB in 4, 6, 8, 12)")
    p.add_argument("--sizes", default="1,2,4,8")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--kind", default=None, help="build for this ISA instead (avx512 = AVX-512 without bf16)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--copies-mb", type=float, default=40,
                   help="MB of copies each weight cycles through: 40 fits this Xeon's 105 MB L3; "
                        "400 streams from memory, as a forward's 269 MB does")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype, sizes = getattr(torch, args.dtype), [int(n) for n in args.sizes.split(",")]
    kind = args.kind or kernels.isa()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        libs = {s: build(kind, *s, Path(tmp)) for s in dict.fromkeys(shapes)}
        torch.manual_seed(0)
        weights = {name: torch.randn(N, K).to(dtype) for name, (N, K, _) in SHAPES.items()}
        packed = {}
        for s, lib in libs.items():
            kernels._lib = lib                      # Packed reads G from the loaded build
            counts = {name: max(1, int(args.copies_mb * 1e6 // (w.numel() * w.element_size())))
                      for name, w in weights.items()}
            packed[s] = {name: [kernels.Packed(w) for _ in range(counts[name])] for name, w in weights.items()}
        best = {}
        for _ in range(args.rounds):
            for s, lib in libs.items():
                kernels._lib = lib
                for n in sizes:
                    for name, (N, K, _) in SHAPES.items():
                        x, copies = torch.randn(n, K), packed[s][name]
                        t = time.perf_counter()
                        for w in copies:
                            kernels.linear(x, w)
                        ms = (time.perf_counter() - t) / len(copies) * 1e3
                        best[s, n, name] = min(best.get((s, n, name), ms), ms)
    print(f"{kind}, {args.dtype}, {args.threads} thread(s), {args.copies_mb:g} MB of copies, load average "
          + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    print("| GV x MB | " + " | ".join(f"T({n}) ms" for n in sizes) + " | " +
          " | ".join(f"T({n})/T(1)" for n in sizes[1:]) + " |")
    print("|---" * (2 * len(sizes)) + "|")
    for s in libs:
        t = {n: sum(best[s, n, name] * times for name, (_, _, times) in SHAPES.items()) for n in sizes}
        print(f"| {s[0]} x {s[1]} | " + " | ".join(f"{t[n]:.2f}" for n in sizes) + " | " +
              " | ".join(f"{t[n] / t[sizes[0]]:.2f}" for n in sizes[1:]) + " |")


if __name__ == "__main__":
    main()
