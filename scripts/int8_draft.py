"""One draft level's linears with int8 against bfloat16 weights, M rows, interleaved.

A draft level runs the EAGLE head's layer (fc 2H->H, [q; k; v], o, [gate; up], down) and the
draft LM head (8,192 x H) over the frontier's M rows. Both formats are packed from the same
random SmolLM2-shaped weights, in ``--copies`` copies each so that a call reads its weights
from memory as in a step (the target's 269 MB stream evicts them between levels), and the
formats alternate call by call. Prints the median time of the six linears per format and M.

    python scripts/int8_draft.py --threads 2
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python scripts/int8_draft.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app.engine import kernels  # noqa: E402

H, I, QKV, VD = 576, 1536, 960, 8192      # SmolLM2-135M's head: hidden, MLP inner, [q; k; v] rows, draft vocabulary
SHAPES = {"fc": (H, 2 * H), "qkv": (QKV, H), "o": (H, H), "gate_up": (2 * I, H), "down": (H, I), "draft_lm": (VD, H)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--rows", default="1,2,4,8")
    args = p.parse_args()
    if kernels.load() is None:
        print(f"fast kernels unavailable: {kernels.why_not()}")
        return 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    weights = [{n: torch.randn(*s).bfloat16() for n, s in SHAPES.items()} for _ in range(args.copies)]
    packs = {fmt: [{n: kernels.Packed(w, int8=fmt == "int8") for n, w in copy.items()} for copy in weights]
             for fmt in ("bf16", "int8")}
    rows = [int(m) for m in args.rows.split(",")]
    x = {n: torch.randn(max(rows), s[1]) for n, s in SHAPES.items()}
    times = {(fmt, m): [] for fmt in packs for m in rows}
    load = os.getloadavg()[0]
    for r in range(args.rounds):
        for m in rows:
            for fmt in (("bf16", "int8") if r % 2 else ("int8", "bf16")):
                packed = packs[fmt][r % args.copies]
                start = time.perf_counter()
                for n in SHAPES:
                    kernels.linear(x[n][:m], packed[n])
                times[fmt, m].append((time.perf_counter() - start) * 1e3)
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in kernels.cpu_flags()]
    print(f"# flags {' '.join(isa)}; kernels {kernels.load().kind}; {args.threads} threads; "
          f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}")
    print("\n| rows | bfloat16 ms | int8 ms | int8 / bfloat16 |\n|---|---|---|---|")
    for m in rows:
        a, b = statistics.median(times["bf16", m]), statistics.median(times["int8", m])
        print(f"| {m} | {a:.3f} | {b:.3f} | {b / a:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
