"""Drafters other than the EAGLE head, as the EAGLE papers compare them, in the one engine.

Each drafter turns what a run knows into a ``DraftTree``; the engine verifies it with the
same tree-masked target forward and the same acceptance rules as EAGLE's trees
(``Engine.verify`` / ``Engine.accept``), so every method is lossless the same way:

    pld        prompt lookup: continuations of earlier occurrences of the context's last
               n-gram (no model at all)                                    -> pld.py
    lookahead  n-grams collected from Jacobi iterations on a window of guesses, which ride in
               the verify forward as one extra branch (no trained weights)  -> lookahead.py
    medusa     k extra heads on the target's last hidden state, one per future offset, and a
               static tree over their top-k (trained heads)                 -> medusa.py

Candidates of pld and lookahead are fixed token sequences, not draws from a distribution,
so under sampling ``verify.sequential_verify`` (the multi-candidate rule for deterministic
children) keeps the output distributed exactly as the target's. Their nodes' ``q`` is a
count, not a probability (``sequences.tree_from_sequences``).

A drafter object lives in the run (``_Run.drafter``), never on a model: ``start`` makes one
from the prefill, ``draft`` proposes a step's tree, ``observe`` reads the verify forward
after the step is committed (the ``Drafter`` protocol below).

Modules:

    registry.py   the catalogue: one ``DrafterInfo`` line per drafter (no torch: the settings,
                  the trace schema and the page read it)
    sequences.py  ``tree_from_sequences``: candidate continuations as one trie-shaped tree
    pld.py, lookahead.py, medusa.py   the drafters
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

from app.engine.drafters.registry import (DEFAULT_HEAD_KIND, DRAFTER, DRAFTER_LABELS, DRAFTERS, HEAD_KINDS,
                                          DrafterInfo, head_kind)

if TYPE_CHECKING:
    from app.engine.tree import DraftTree

__all__ = ["Drafter", "DrafterInfo", "DRAFTERS", "DRAFTER", "DRAFTER_LABELS", "HEAD_KINDS", "DEFAULT_HEAD_KIND",
           "NAMES", "head_kind", "start", "check_ready", "tree_from_sequences"]

NAMES = tuple(DRAFTER)


class Drafter(Protocol):
    """One run's drafter. ``start`` makes it from the prefill (``features``: (1, m, H) the
    target's last hidden states over the prompt); ``draft`` proposes a step's tree; ``observe``
    reads the verify forward (``verified``: its logits and hidden states) once the step's
    accepted ``path`` and ``bonus`` token are committed."""

    name: str

    @classmethod
    def start(cls, engine, cfg, prompt_ids: list[int], features) -> "Drafter": ...

    def draft(self, engine, run, cfg) -> "DraftTree": ...

    def observe(self, engine, run, verified, tree, path, bonus, cfg) -> None: ...


def _drafter_class(info: DrafterInfo):
    # Imported on first use: the drafters import torch, and this package is imported by the
    # settings (app.engine.spec), which must load without it.
    module, _, name = info.target.partition(":")
    return getattr(importlib.import_module(module), name)


def start(engine, cfg, prompt_ids: list[int], features) -> Drafter | None:
    """The run's drafter for ``cfg.method``, or None for the EAGLE head's methods and vanilla.
    ``features``: (1, m, H) the target's last hidden states over the prompt."""
    info = DRAFTER.get(cfg.method)
    return None if info is None else _drafter_class(info).start(engine, cfg, prompt_ids, features)


def check_ready(engine, cfg) -> None:
    """ValueError when ``cfg``'s drafter needs trained weights the engine has not loaded."""
    info = DRAFTER.get(cfg.method)
    if info is not None and info.weights and getattr(engine, info.weights, None) is None:
        raise ValueError(f"method {info.method} needs {info.label}, and none are loaded")


def __getattr__(name: str):
    # ``tree_from_sequences`` lives in sequences.py, which imports the tree module (torch, and
    # the settings that import this package); it is re-exported here lazily for that reason.
    if name == "tree_from_sequences":
        from app.engine.drafters.sequences import tree_from_sequences

        return tree_from_sequences
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
