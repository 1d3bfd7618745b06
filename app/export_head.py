"""`python -m app export-head`: write an EAGLE head in vLLM's speculators layout, or back in the
original EAGLE layout.

    python -m app export-head --format speculators                  # the shipped EAGLE-2 head
    python -m app export-head --format speculators --head FOLDER --verifier meta-llama/Llama-3.1-8B-Instruct
    python -m app export-head --format eagle --head FOLDER-speculators

The head is read as the engine reads it (``app.engine.heads.load_head``: either layout, either kind,
strictly) and written with ``app.engine.heads.speculators.save``, which says how names and
config fields map. A bad folder, format or output prints one line and exits 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

FORMATS = ("speculators", "eagle")
EMBEDDED_SHAPE = (576, 49152)   # SmolLM2-135M-Instruct's hidden_size and vocab_size


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="speculators (vLLM's speculators layout) | eagle (the original EAGLE layout)")
    p.add_argument("--head", default=None,
                   help="head folder in either layout, EAGLE-1/2 or EAGLE-3, or a shipped head's name "
                        "(eagle2, eagle3); default: the shipped EAGLE-2 head")
    p.add_argument("--out", default=None, help="output folder (default: ./<head folder name>-<format>)")
    p.add_argument("--verifier", default=None,
                   help="the target the head drafts for, as the speculators config names it (hub id or folder; "
                        "default: the one the source config names; for a head shaped for the embedded model, "
                        "HuggingFaceTB/SmolLM2-135M-Instruct; otherwise required)")
    p.add_argument("--force", action="store_true", help="write into a non-empty output folder")


def _head_folder(name: str | None) -> Path:
    # lazy: loading.py imports torch and transformers; `export-head --help` needs neither
    from app.engine.loading import DEFAULT_HEAD_DIR, SHIPPED_HEADS

    if name in (None, "", "default"):
        return DEFAULT_HEAD_DIR
    return SHIPPED_HEADS.get(name, Path(name).expanduser())


def export(head: str | None, fmt: str, out: str | None = None, verifier: str | None = None,
           force: bool = False) -> Path:
    """Read ``head`` and write it as ``fmt``; returns the output folder. Raises ValueError,
    KeyError or FileNotFoundError with a one-line message."""
    # lazy: the heads import torch, which `export-head --help` never needs
    from app.engine.heads import load_head, speculators as sf
    from app.engine.heads.checkpoint import read_config, read_state_dict

    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    src = _head_folder(head)
    if not src.is_dir():
        raise FileNotFoundError(f"--head {src}: no such folder")
    raw = read_config(src)
    ids = sf.layer_ids_of(raw)
    if verifier is None and sf.is_speculators(raw):
        verifier = ((raw.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    # the weights do not depend on the target's depth: any depth that fits the layer ids will do
    loaded = load_head(src, max(ids) + 1 if ids else 64)
    if fmt == "speculators" and verifier is None:
        if (loaded.config.hidden_size, loaded.config.vocab_size) != EMBEDDED_SHAPE:
            raise ValueError(f"--verifier: name the target the head {src} drafts for (hub id or folder); "
                             "only a head shaped for the embedded SmolLM2-135M-Instruct defaults to it")
        verifier = sf.DEFAULT_VERIFIER
    dst = Path(out).expanduser() if out else Path.cwd() / f"{src.resolve().name}-{fmt}"
    if dst.resolve() == src.resolve():
        raise ValueError(f"--out {dst} is the head's own folder")
    if dst.exists() and (not dst.is_dir() or (any(dst.iterdir()) and not force)):
        raise ValueError(f"--out {dst} exists and is not an empty folder (--force writes into it)")
    # written in the source's own weight dtype (a bfloat16 head stays half the bytes, and
    # exported back it is its original file), whatever dtype the head was loaded in
    dtype = next((v.dtype for v in read_state_dict(src).values() if v.is_floating_point()), None)
    return sf.save(loaded, dst, fmt, verifier=verifier, layer_ids=ids, source=src, dtype=dtype)


def main(args) -> int:
    try:
        dst = export(args.head, args.format, args.out, args.verifier, args.force)
    except (ValueError, KeyError, FileNotFoundError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"error: {message}", file=sys.stderr)
        return 2
    print(f"wrote {dst} ({args.format} layout)")
    return 0
