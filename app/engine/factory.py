"""One way to assemble an Engine: target, draft head, the head's draft vocabulary.

The CLI, the app, the benchmark, training's evaluation and the scripts all call
``load_engine``, so a change in how an engine is put together happens in one place.
"""
from __future__ import annotations

from app.engine.config import GenerationLimits
from app.engine.engine import Engine
from app.engine import loading
from app.engine.drafters.registry import DEFAULT_HEAD_KIND, head_kind


def load_engine(base_model: str | None = None, draft_model: str | None = None, device: str = "auto",
                dtype: str = "auto", *, head: str = "required", full_draft_vocab: bool = False,
                limits: GenerationLimits = GenerationLimits(), target=None,
                medusa: str = "none", medusa_model: str | None = None,
                forward: str | None = None) -> tuple[Engine, str]:
    """Load the target (embedded default when ``base_model`` is None) and the EAGLE head.

    ``head``: "required" (a missing head raises FileNotFoundError naming what is missing),
    "optional" (a missing head leaves the engine without one: vanilla decoding still works),
    or "none" (do not load one). ``target``: an already loaded ``Target`` to reuse.
    Returns the engine and, for "optional", why no head was loaded ("" when one was).
    An EAGLE-2 head's reduced draft vocabulary is used when it ships one, unless
    ``full_draft_vocab``; an EAGLE-3 head always drafts over its own. ``dtype="auto"`` is ``loading.choose_dtype``'s choice.
    ``medusa`` ("none" | "optional" | "required"): also load Medusa heads (``medusa_model``,
    default the shipped ones) for the medusa method; "optional" goes on without them when
    there are none or they do not fit the target (the method is then refused with a clear line).
    ``forward``: "auto" | "eager" (``loading.Target.forward``; None: $EAGLE_LENS_FORWARD or auto).
    """
    if head not in ("required", "optional", "none"):
        raise ValueError(f"head must be required, optional or none, got {head!r}")
    target = target or loading.load_target(base_model, device=device, dtype=dtype, forward=forward)
    draft, missing = None, ""
    if head != "none":
        try:
            draft = loading.load_draft_head(draft_model, target)
        except FileNotFoundError as exc:
            if head == "required":
                raise
            missing = str(exc)
    vocab = None
    # an EAGLE-3 head drafts over its own vocabulary (its d2t map); draft_vocab.json is EAGLE-2's
    if draft is not None and head_kind(draft) == DEFAULT_HEAD_KIND and not full_draft_vocab:
        vocab = loading.load_draft_vocab(draft.folder, target.model.config.vocab_size)
    if medusa not in ("required", "optional", "none"):
        raise ValueError(f"medusa must be required, optional or none, got {medusa!r}")
    heads = None
    if medusa != "none":
        try:
            heads = loading.load_medusa_heads(medusa_model, target)
        except (FileNotFoundError, ValueError):   # none, or heads made for another target
            if medusa == "required":
                raise
    return Engine(target, draft, limits=limits, draft_vocab=vocab, medusa=heads), missing
