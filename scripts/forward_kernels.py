"""T(n) of the target's forward (decoder stack + LM head over n query rows on a cached
prefix) for each way the engine can run it, interleaved, beside the memory-bandwidth bound.

    python scripts/forward_kernels.py --dtype float32 --out benchmarks/fast-forward/native-float32.md
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python scripts/forward_kernels.py --dtype float32 --out benchmarks/fast-forward/avx2-float32.md
    ONEDNN_MAX_CPU_ISA=AVX512_CORE python scripts/forward_kernels.py ...   # AVX-512 without native bf16

Forwards compared (all on the embedded SmolLM2-135M-Instruct, one torch thread unless
--threads): ``transformers`` (its eager forward), ``fused`` (the engine's eager forward,
app/engine/fused.py), ``onednn`` (fused, with every linear a oneDNN-packed weight),
``rowwise`` (the fast forward, app/engine/rowwise.py: the decoder stack in one C call),
``rowwise-per-kernel`` (the same kernels, one ctypes call each with torch ops between: the
fast forward before the one-call decoder, and its fallback for other cache kinds). Sizes are
timed round-robin so that a burst of load hits every forward alike; tables give the median
and the minimum of --repeats wall-clock times and the median process CPU time (on a loaded
machine the minimum and the CPU time are the least disturbed). The bound is
the bytes every forward must read (all weights but the embedding table, plus the tied LM
head once) divided by the bandwidth a 256 MiB copy reaches (read + write bytes, STREAM's
convention). Inductor (``torch.compile`` max-autotune with frozen weights) is measured by
../shared/perf-style scripts separately: it compiles ~100 s per shape here.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine import device, forward, fused, kernels, kv          # noqa: E402
from app.engine.loading import load_target          # noqa: E402


def copy_bandwidth(threads: int) -> float:
    """GB/s of a 256 MiB copy (bytes read + written), the best of 15 (the machine is shared)."""
    torch.set_num_threads(threads)
    return device.copy_bandwidth()


def baseline_kernels(rev: str):
    """The kernels library built from ``rowwise.c`` at git revision ``rev``, or from the
    ``.c`` file at that path (a variant under test)."""
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[1]
    folder = Path(tempfile.mkdtemp(prefix="rowwise-baseline-"))
    if rev.endswith(".c"):         # a variant: built where it lies, beside the parts it includes
        return kernels.load_other(Path(rev), folder / "rowwise.so")
    # the revision's kernels folder (rowwise.c and the parts it includes), as they were
    tar = subprocess.run(["git", "archive", rev, "app/engine/kernels"], cwd=root, check=True,
                         capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=tar, check=True)
    return kernels.load_other(folder / "app/engine/kernels/rowwise.c", folder / "rowwise.so")


class WithKernels:
    """A rowwise forward that runs on another build of the kernels (swapped in per call)."""

    def __init__(self, dec, lib):
        self.dec, self.lib = dec, lib

    def _swap(self, fn, *args):
        kernels.load()
        own, kernels._lib = kernels._lib, self.lib
        try:
            return fn(*args)
        finally:
            kernels._lib = own

    def __call__(self, *args):
        return self._swap(self.dec, *args)

    def prefill(self, *args):
        return self._swap(self.dec.prefill, *args)

    def logits(self, *args):
        return self._swap(self.dec.logits, *args)


class OneDNNDecoder(fused.FusedLlamaDecoder):
    """The eager fused forward with oneDNN-packed linears (weights reordered once)."""

    name = "onednn"

    def __init__(self, model):
        super().__init__(model)
        for w in self.layers:
            for key in ("qkv", "o", "gate_up", "down"):
                w[key] = w[key].detach().to_mkldnn()
        self.lm = model.get_output_embeddings().weight.detach().to_mkldnn()

    @staticmethod
    def _linear(x, w):
        shape = x.shape
        y = torch._C._nn.mkldnn_linear(x.reshape(-1, shape[-1]).contiguous().to_mkldnn(), w, None).to_dense()
        return y.reshape(*shape[:-1], -1)

    def __call__(self, ids, positions, mask, cache, layers=()):
        original = F.linear
        F.linear = lambda x, w, b=None: self._linear(x, w)   # only inside this forward
        try:
            return super().__call__(ids, positions, mask, cache, layers)
        finally:
            F.linear = original

    def logits(self, hidden):
        return self._linear(hidden, self.lm)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sizes", default="1,2,4,8,16,32")
    p.add_argument("--prefix", type=int, default=256)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--forwards", default="transformers,fused,onednn,rowwise")
    p.add_argument("--out", default=None, help="also write the markdown table here")
    p.add_argument("--baseline", default=None, metavar="REV[,REV..]",
                   help="also time 'rowwise@REV': the one-call forward, on the same packed weights, with "
                        "app/engine/kernels/rowwise.c as of git revision REV (or a variant: a path ending "
                        "in .c), interleaved with today's in "
                        "this process (a kernel change's effect, free of the drift between runs on a shared "
                        "machine and of where each copy of the weights lies in memory)")
    args = p.parse_args()
    for rev in (args.baseline or "").split(","):
        if rev:
            args.forwards += f",rowwise@{rev}"
    sizes = [int(n) for n in args.sizes.split(",")]
    torch.set_num_threads(args.threads)
    models = {}
    for name in args.forwards.split(","):
        if "@" in name:          # the same decoder and packed weights, another build of the kernels
            model, dec = models[name.split("@")[0]]
            models[name] = (model, WithKernels(dec, baseline_kernels(name.split("@", 1)[1])))
            continue
        fast = name.startswith("rowwise")
        target = load_target(None, device="cpu", dtype=args.dtype, forward="auto" if fast else "eager")
        model = target.model
        if name == "transformers":
            dec = fused.DecoderForward(model)
        elif name == "fused":
            dec = fused.FusedLlamaDecoder(model)
        elif name == "onednn":
            dec = OneDNNDecoder(model)
        else:
            dec = forward.decoder_forward(target)
            assert dec.name.startswith("rowwise"), dec.fallback_reason
            dec.one_call = name == "rowwise"
        models[name] = (model, dec)
    g = torch.Generator().manual_seed(0)
    vocab = next(iter(models.values()))[0].config.vocab_size
    prefix = torch.randint(0, vocab, (1, args.prefix), generator=g)
    caches = {}
    with torch.inference_mode():
        for name, (model, dec) in models.items():
            caches[name] = kv.preallocated_cache(model, args.prefix + max(sizes))
            dec.prefill(prefix, caches[name])
        inputs = {}
        for n in sizes:
            ids = torch.randint(0, vocab, (1, n), generator=g)
            pos = torch.arange(args.prefix, args.prefix + n)[None]
            mask = torch.ones(n, args.prefix + n, dtype=torch.bool).tril(args.prefix)[None, None] if n > 1 else None
            inputs[n] = (ids, pos, mask)
        times = {(name, n): [] for name in models for n in sizes}
        cpu = {(name, n): [] for name in models for n in sizes}     # process CPU time: what load does not stretch
        load0 = os.getloadavg()[0]
        for r in range(args.repeats + 1):
            for n in sizes:
                for name, (model, dec) in models.items():
                    ids, pos, mask = inputs[n]
                    t0, c0 = time.perf_counter(), time.process_time()
                    hidden = dec(ids, pos, mask, caches[name])
                    dec.logits(hidden[0])
                    if r:
                        times[(name, n)].append((time.perf_counter() - t0) * 1e3)
                        cpu[(name, n)].append((time.process_time() - c0) * 1e3)
                    kv.crop(caches[name], args.prefix)
        load1 = os.getloadavg()[0]
    model = next(iter(models.values()))[0]
    body = getattr(model, model.base_model_prefix)
    weights = sum(p.numel() * p.element_size() for n_, p in body.named_parameters() if "embed" not in n_)
    lm = model.get_output_embeddings().weight
    read = weights + lm.numel() * lm.element_size()
    bw = copy_bandwidth(args.threads)
    bound = read / bw / 1e6
    flags = kernels.cpu_flags()
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    lines = [f"# T(n) of the target forward, {args.dtype}, {args.threads} thread(s)", "",
             f"`{' '.join(['python'] + sys.argv)}`", "",
             f"- CPU: {platform.processor() or platform.machine()}, flags {' '.join(isa)}; "
             f"ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '(unset)')}, "
             f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}; fast kernels built for "
             f"{kernels.load().kind if kernels.load() else 'none'}",
             f"- load average {load0:.2f} at start, {load1:.2f} at end; {args.prefix} cached positions; "
             f"{args.repeats} repeats, sizes and forwards interleaved; the bound's bandwidth is the best of 15 copies",
             f"- bytes a forward must read: {read / 1e6:.0f} MB; copy bandwidth {bw:.1f} GB/s; bound {bound:.1f} ms "
             f"(target: T(1) within 1.3x of it, {1.3 * bound:.1f} ms)", "",
             ]
    tables = (("wall-clock time, median", times, statistics.median), ("wall-clock time, minimum", times, min),
              ("process CPU time (all threads), median", cpu, statistics.median))
    for stat, data, how in tables:
        lines += [f"{stat} of {args.repeats}:", "",
                  "| forward | " + " | ".join(f"T({n}) ms" for n in sizes) + " | " + " | ".join(
                      f"T({n})/T(1)" for n in sizes[1:]) + " |",
                  "|" + "---|" * (1 + 2 * len(sizes) - 1)]
        for name in models:
            cell = [how(data[(name, n)]) for n in sizes]
            lines.append(f"| {name} | " + " | ".join(f"{m:.1f}" for m in cell) + " | "
                         + " | ".join(f"{m / cell[0]:.2f}" for m in cell[1:]) + " |")
        lines.append("")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
