"""Where the engine runs and where it keeps its caches: the two questions every part of the
engine asks (loading, precision, the kernels, autotune), answered here without importing any
of them."""
from __future__ import annotations

import os
from pathlib import Path

import torch


def cache_dir() -> Path:
    """Root of our on-disk caches: $EAGLE_LENS_CACHE, else $XDG_CACHE_HOME/eagle-lens."""
    env = os.environ.get("EAGLE_LENS_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "eagle-lens"


def choose_device(device: str | None = None) -> torch.device:
    """"auto" (a CUDA GPU when there is one, else the CPU), "cpu" or "cuda[:N]"; ValueError
    naming ``device`` otherwise."""
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for but no CUDA GPU is available")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {device!r}")
    return dev
