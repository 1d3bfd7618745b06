"""Which arithmetic to decode in: the faster of float32 and bfloat16, chosen by measuring.

On a CPU with native bfloat16 (AVX512-BF16 or AMX) a forward of a small model in bf16 can
cost half of float32's; on one without it (AVX2 only) bf16 is emulated and slower. The CPU
model of a shared machine or a Space varies, so ``dtype="auto"`` measures instead of
guessing: T(1) and T(8) (one token, a small tree) in both dtypes, interleaved so a busy
neighbour slows both alike, the median of each; bf16 only when it is clearly faster. The
choice is kept on disk per (model, CPU, threads, torch), so it is measured once.

Float32 stays the *exact* mode: greedy output there is token for token that of plain
greedy decoding. In bf16 a forward over one token and over a tree round differently, so
after a near-tie the two can part (the app says where, and why).
"""
from __future__ import annotations

import copy
import hashlib
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from app.engine import device, kv
from app.engine.device import cache_dir, choose_device, cpu_class_cap

# bf16 must beat float32 by this factor (median over interleaved repeats) to be chosen:
# a near tie is not worth giving up exact greedy output.
MIN_GAIN = 1.15


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX-BF16 in the CPU flags (Linux); False where they cannot be read, and
    where the environment emulates a CPU without them (``device.cpu_class_cap``: e.g.
    ``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX512_CORE``)."""
    if cpu_class_cap() not in (None, "avx512bf16"):
        return False
    return bool({"avx512_bf16", "amx_bf16"} & device.cpu_flags())


def bf16_is_native(device: str | torch.device | None = "cpu") -> bool:
    """Whether bfloat16 arithmetic is native on ``device``: a GPU, or a CPU with AMX /
    AVX512-BF16 (elsewhere torch emulates it, measured 4.5x slower than float32 on an AVX2-only
    CPU). Training uses bf16 only where this holds."""
    return choose_device(device).type == "cuda" or cpu_has_native_bf16()


def faster_dtype(ms: dict[str, list[float]], min_gain: float = MIN_GAIN) -> str:
    """"bfloat16" if its median time is below float32's by ``min_gain``, else "float32".
    ``ms``: dtype name -> forward times (ms), each list taken interleaved with the other."""
    fp32, bf16 = ms.get("float32") or [], ms.get("bfloat16") or []
    if not fp32 or not bf16:
        return "float32"
    return "bfloat16" if statistics.median(fp32) >= min_gain * statistics.median(bf16) else "float32"


@torch.inference_mode()
def time_forwards(models: dict[str, torch.nn.Module], sizes=(1, 8), prefix_len: int = 128,
                  repeats: int = 7) -> dict[str, list[float]]:
    """Per dtype name, the summed time of one forward over each of ``sizes`` query tokens on a
    cached prefix, ``repeats`` times, the dtypes alternating within every repeat."""
    out: dict[str, list[float]] = {name: [] for name in models}
    g = torch.Generator().manual_seed(0)
    any_model = next(iter(models.values()))
    vocab = any_model.config.vocab_size
    prefix = torch.randint(0, vocab, (1, prefix_len), generator=g)
    caches = {}
    for name, model in models.items():
        cache = kv.preallocated_cache(model, prefix_len + max(sizes))
        model(input_ids=prefix, past_key_values=cache, use_cache=True)
        caches[name] = cache
    queries = {n: torch.randint(0, vocab, (1, n), generator=g) for n in sizes}
    for r in range(repeats + 1):               # the first round warms up
        for name, model in models.items():
            t0 = time.perf_counter()
            for n in sizes:
                model(input_ids=queries[n], past_key_values=caches[name], use_cache=True)
                kv.crop(caches[name], prefix_len)
            if r:
                out[name].append((time.perf_counter() - t0) * 1e3)
    return out


def _choice_path(model_name: str) -> Path:
    key = json.dumps({"model": model_name, "cpu": platform.processor() or platform.machine(),
                      "threads": torch.get_num_threads(), "torch": torch.__version__}, sort_keys=True)
    return cache_dir() / "autotune" / f"dtype-{hashlib.sha1(key.encode()).hexdigest()[:12]}.json"


def auto_cpu_dtype(model_name: str, model: torch.nn.Module, log=None, forward: str = "auto") -> torch.dtype:
    """The dtype to decode ``model`` (loaded in float32) in on this CPU, measured once and kept.

    With the fast forward (``forward="auto"`` where ``fused.supports`` finds nothing against it
    and the kernels build) no measurement is needed: a step there is bound by reading the
    weights, and bfloat16 weights are half the bytes, so bfloat16 on every CPU the kernels
    run on. Where bfloat16 is not native they widen each weight to float32 in registers and
    multiply in float32, exactly as they do for every row count (AVX2 emulation, the shipped
    head, six suites x 2 prompts, 128 tokens: vanilla 63.0 against 44.5 tokens/s in float32,
    the default 65.2 against 51.8, benchmarks/fast-forward/avx2-bf16-weights.md). On the eager
    forward emulated bfloat16 is several times slower, so float32 there."""
    if forward == "auto":
        # lazy: fused imports transformers' Llama modelling (+9 s measured on top of this module),
        # and loading.py imports this module: `export-head` reads heads through loading, no target
        from app.engine import kernels
        from app.engine.fused import supports

        if supports(model) is None and kernels.load() is not None:
            return torch.bfloat16
    if not cpu_has_native_bf16():
        return torch.float32
    path = _choice_path(model_name)
    try:
        return getattr(torch, json.loads(path.read_text())["dtype"])
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    if log:
        log("dtype auto: timing float32 against bfloat16 once (native bfloat16 on this CPU)")
    ms = time_forwards({"float32": model, "bfloat16": copy.deepcopy(model).to(torch.bfloat16)})
    choice = faster_dtype(ms)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"dtype": choice, "ms": ms}) + "\n")
    return getattr(torch, choice)


@torch.inference_mode()
def top2_after(target, prompt_ids: list[int], answer: list[int]) -> tuple[tuple[int, float], tuple[int, float]]:
    """The target's two likeliest next tokens after ``prompt_ids + answer``, with their
    probabilities, from one plain forward in the target's dtype. Where two greedy runs in
    bf16 part, a small gap between these two says why: a near-tie that rounding tipped."""
    ids = torch.tensor([list(prompt_ids) + list(answer)], device=target.device)
    logits = target.model(input_ids=ids).logits[0, -1].float()                        # (V,)
    top = torch.topk(torch.softmax(logits, -1), 2)
    (a, b), (pa, pb) = top.indices.tolist(), top.values.tolist()
    return (a, pa), (b, pb)
