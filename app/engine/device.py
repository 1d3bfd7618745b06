"""Where the engine runs and where it keeps its caches: the two questions every part of the
engine asks (loading, precision, the kernels, autotune), answered here without importing any
of them."""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from app.engine.sources import check_device_name


def cache_dir() -> Path:
    """Root of our on-disk caches: $EAGLE_LENS_CACHE, else $XDG_CACHE_HOME/eagle-lens."""
    env = os.environ.get("EAGLE_LENS_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "eagle-lens"


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux); empty where they cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) below AVX512_CORE_AMX, by the CPU class they stand for
_ONEDNN_CAPS = {"SSE41": "avx2", "AVX": "avx2", "AVX2": "avx2", "AVX2_VNNI": "avx2",
                "AVX512_CORE": "avx512", "AVX512_CORE_VNNI": "avx512",
                "AVX512_CORE_BF16": "avx512bf16", "AVX512_CORE_FP16": "avx512bf16"}


def cpu_class_cap() -> str | None:
    """The CPU class this process is told to act as, below what the CPU has (None: no cap):

    * "none": no vector kernels (``ATEN_CPU_CAPABILITY=default``);
    * "avx2": an AVX2-only CPU (``ATEN_CPU_CAPABILITY=avx2``, or oneDNN capped at AVX2 or below);
    * "avx512": AVX-512 without native bfloat16, a Skylake / Cascade Lake Xeon
      (``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` or ``AVX512_CORE_VNNI``);
    * "avx512bf16": AVX-512 with native bfloat16 dot products but no AMX tiles, a Cooper
      Lake Xeon or an AMD Zen 4 (``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``: on a Sapphire
      Rapids Xeon it switches AMX off, for oneDNN and our kernels alike).

    These are the switches that make torch and oneDNN emulate the smaller CPU, so the
    kernels' ISA (``kernels.isa``) and "is bfloat16 native" (``precision``) follow them too."""
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    if aten == "default":
        return "none"
    if aten == "avx2":
        return "avx2"
    return _ONEDNN_CAPS.get(os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper())


def choose_device(device: str | None = None) -> torch.device:
    """"auto" (a CUDA GPU when there is one, else the CPU), "cpu" or "cuda[:N]"; ValueError
    naming ``device`` otherwise."""
    check_device_name(device)
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for but no CUDA GPU is available")
    return dev


def copy_bandwidth(mib: int = 256, repeats: int = 15) -> float:
    """GB/s of a ``mib`` MiB copy in host memory (bytes read + written, STREAM's convention),
    the best of ``repeats`` on the current torch threads: what one decoding step's weight
    stream can reach. On a shared VM it moves with the host's memory phase (35-88 GB/s on one
    2-vCPU EPYC), and a tree's ratio to plain decoding moves with it, so timings carry it."""
    a = torch.ones(mib * 2 ** 18)          # float32: mib MiB
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.numel() * 4 / best / 1e9
