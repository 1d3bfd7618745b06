"""Which target forward a target decodes with, chosen once per target.

    rowwise.RowwiseLlamaDecoder   the fast batch-invariant kernels (a CPU with AVX2 + FMA, a C
                                  compiler or a cached build, a plain Llama/Mistral decoder,
                                  ``Target.forward`` "auto")
    fused.FusedLlamaDecoder       the eager forward with fused projections (same architectures)
    fused.DecoderForward          transformers' forward (anything else)

Kept apart from both modules so that neither imports the other.
"""
from __future__ import annotations

import sys

from app.engine import kernels
from app.engine.fused import DecoderForward, FusedLlamaDecoder, supports
from app.engine.rowwise import RowwiseLlamaDecoder


def decoder_forward(target) -> DecoderForward:
    """The verify/decode forward for ``target``, built once (fusing re-points the model's
    weights, packing copies them) and kept on it. ``fallback_reason`` says why a faster one
    was not used ("" when it was)."""
    existing = getattr(target, "_decoder_forward", None)
    if existing is None:
        reason = supports(target.model)
        if reason is None:
            fast_reason = fast_unavailable(target)
            if fast_reason is None:
                existing = RowwiseLlamaDecoder(target.model)
            else:
                existing = FusedLlamaDecoder(target.model)
                reason = fast_reason
                if getattr(target, "forward", "auto") == "auto" and target.device.type == "cpu":
                    _say(f"{fast_reason}; decoding on the eager forward")
        else:
            existing = DecoderForward(target.model)
        existing.fallback_reason = reason or ""
        target._decoder_forward = existing
    return existing


def fast_unavailable(target) -> str | None:
    """Why the fast forward will not run for ``target`` (None when it will): switched off,
    not a CPU, or the kernels cannot be built here."""
    wanted = getattr(target, "forward", "auto")
    if wanted == "eager":
        return "the fast forward is switched off (--forward eager)"
    if target.device.type != "cpu":
        return f"the fast forward is for CPUs; this target runs on {target.device.type}"
    if kernels.load(log=_say) is None:
        return f"the fast forward is unavailable: {kernels.why_not()}"
    return None


def describe(decoder) -> dict:
    """What a visitor should know of the forward a target decodes with: ``{"fast": bool,
    "text": ...}``, the text naming the kernels, or saying why the fast forward is not running
    (``fallback_reason``) when it is not."""
    if isinstance(decoder, RowwiseLlamaDecoder):
        kind = getattr(kernels.load(), "kind", "")
        return {"fast": True, "text": f"the fast forward (our batch-invariant C kernels{', ' + kind if kind else ''})"}
    return {"fast": False, "text": getattr(decoder, "fallback_reason", "") or "the eager forward"}


def _say(line: str) -> None:
    print(f"[eagle-lens] {line}", file=sys.stderr, flush=True)
