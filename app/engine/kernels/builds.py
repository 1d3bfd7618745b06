"""Compiling ``rowwise.c`` for this CPU, once, and keeping the build.

``isa()`` names the vector ISA this CPU (and the emulation switches) allows: AVX-512 with AMX
tiles for the bfloat16 linears where the CPU and the OS allow them, AVX-512 with or without
native bfloat16, else AVX2 + FMA, or None (no kernels here). ``ATEN_CPU_CAPABILITY=avx2``
(the switch that makes torch treat an AVX-512 CPU as AVX2-only) makes these kernels do the
same, so one environment emulates an AVX2 machine for the whole forward; likewise
``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` an AVX-512 CPU without native bfloat16
(``device.cpu_class_cap``).

``build`` compiles the source for an ISA into ``cache_dir()/kernels`` (about a second with
gcc) unless that exact build is there: its file name carries a hash of every source file
(``rowwise.c`` and the parts in ``rowwise/`` that it includes) and of the compiler flags, so
an edited source is a new build, and older builds are removed. Loading the build and giving
it its C signatures is ``kernels.load`` (``__init__.py``) and ``signatures.py``.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from app.engine import device
from app.engine.device import cache_dir, cpu_class_cap

SOURCE = Path(__file__).with_name("rowwise.c")
FLAGS = {"amx": ["-mamx-tile", "-mamx-bf16", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-mavx2", "-mfma"],
         "avx512bf16": ["-mavx512f", "-mavx512bw", "-mavx512bf16", "-mavx2", "-mfma"],
         "avx512": ["-mavx512f", "-mavx512bw", "-mavx2", "-mfma"], "avx2": ["-mavx2", "-mfma"]}


def isa() -> str | None:
    """The vector ISA to build for: amx (AVX-512 with native bfloat16 and AMX tiles),
    avx512bf16 (native bfloat16 dot products), avx512, avx2, or None (no kernels on this CPU)."""
    flags = device.cpu_flags()
    if not {"avx2", "fma"} <= flags:
        return None
    cap = cpu_class_cap()
    if cap == "none":
        return None
    if {"avx512f", "avx512bw"} <= flags and cap != "avx2":     # BW: 16-bit shuffles (every AVX-512 Xeon)
        if "avx512_bf16" not in flags or cap == "avx512":
            return "avx512"
        return "amx" if {"amx_tile", "amx_bf16"} <= flags and cap is None else "avx512bf16"
    return "avx2"


def compiler() -> str | None:
    """$CC, else gcc, else cc: the first that resolves to a program, or None."""
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"])
    return shutil.which("gcc") or shutil.which("cc")


def command(kind: str, cc: str, out: Path) -> list[str]:
    return [cc, "-O3", "-shared", "-fPIC", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", *FLAGS[kind],
            str(SOURCE), "-o", str(out), "-lm"]


_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(source: Path | None = None) -> list[Path]:
    """``rowwise.c`` and the parts it includes (``#include "..."``, each found next to the file
    that includes it, and theirs in turn), in include order: every file a build compiles. A
    part missing beside an edited copy of the source is left out (no build of it could run)."""
    out: list[Path] = []

    def visit(path: Path):
        if path in out or not path.is_file():
            return
        out.append(path)
        for name in _INCLUDE.findall(path.read_bytes()):
            visit(path.parent / name.decode())

    visit(SOURCE if source is None else source)
    return out


def _source_bytes() -> bytes:
    """Every source file's name (relative to rowwise.c's folder) and bytes, in include order."""
    root = SOURCE.parent
    return b"".join(str(p.relative_to(root) if p.is_relative_to(root) else p.name).encode() + b"\0" + p.read_bytes()
                    for p in sources())


def source_key() -> str:
    """12 hex digits naming this version of ``rowwise.c`` and its parts: a change to any of
    them is a new key (the autotune caches' forward name, the build's file name)."""
    return hashlib.sha1(_source_bytes()).hexdigest()[:12]


def library_path(kind: str) -> Path:
    """Where the build for ``kind`` of this exact source and these flags is kept."""
    key = hashlib.sha1(_source_bytes() + " ".join(command(kind, "cc", Path("x"))).encode()).hexdigest()[:12]
    return cache_dir() / "kernels" / f"rowwise-{kind}-{key}.so"


def build(kind: str, cc: str | None, log=None) -> Path:
    """Compile ``rowwise.c`` for ``kind`` unless a cached build exists; returns the library."""
    path = library_path(kind)
    if path.is_file():
        return path
    if cc is None:
        raise RuntimeError("no C compiler (gcc) on this machine, and no cached build of the kernels")
    path.parent.mkdir(parents=True, exist_ok=True)
    if log:
        log(f"compiling the batch-invariant {kind} kernels once ({SOURCE.name}, ~2 s) into {path.parent}")
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    cmd = command(kind, cc, tmp)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except OSError as exc:
        raise RuntimeError(f"{cc} could not run: {exc}") from exc
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"{' '.join(cmd[:2])} failed: {done.stderr.strip()[-400:]}")
    os.replace(tmp, path)        # atomic: a half-written library is never loaded
    for stale in path.parent.glob(f"rowwise-{kind}-*.so"):   # builds of an older source
        if stale != path:
            stale.unlink(missing_ok=True)                     # a process that loaded it keeps its mapping
    return path
