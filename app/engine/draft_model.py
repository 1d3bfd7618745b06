"""What the EAGLE head drafts with, chosen once per engine: its forward, its input embeddings
and the LM head that turns its predicted features into q.

Each of the three has two forms, and ``DraftModel`` picks one when the engine is made, so the
draft verb (``head_draft.py``) never asks again:

    forward     the head's own ``forward``, or the same layer on the fast kernels
                (``rowwise.RowwiseDraftHead``, EAGLE-3's ``RowwiseEagle3Head``, with int8 or
                the head's own weights) when the target runs on them
    embeddings  the head's ``embed``, or one C call on the fast kernels
    LM head     the target's over the full vocabulary V, or its rows for a draft vocabulary
                (Vd token ids: on a CPU every draft level reads the whole (V, H) matrix, so a
                smaller set makes drafting several times cheaper; verification is untouched),
                or EAGLE-3's own norm and LM head over its own vocabulary (on the fast
                kernels with its layer)

Kept apart from ``engine.py`` so that the drafting code reads what it needs without
importing the engine: the engine owns one of these (``Engine.draft_model``) and hands it on.
"""
from __future__ import annotations

import torch

from app.engine import kernels
from app.engine.rowwise import RowwiseDraftHead, RowwiseEagle3Head, RowwiseLlamaDecoder

DRAFT_WEIGHTS = ("int8", "head")


class DraftModel:
    """The head's forward, embeddings and LM head, in the forms this engine drafts with.

    ``vocab``: the (Vd,) token ids the head may propose, or None for the full vocabulary
    (``vocab_ids``: the same as a list, since a draft's ids map in Python). ``weights``: what
    the fast kernels' draft reads, "int8" or "head" (the head's own dtype); "head" off them."""

    def __init__(self, target, decoder, head=None, draft_vocab: torch.Tensor | None = None,
                 draft_weights: str = "int8"):
        if draft_weights not in DRAFT_WEIGHTS:
            raise ValueError(f"draft_weights must be 'int8' or 'head', got {draft_weights!r}")
        model = target.model
        self.head, self.decoder, self.device = head, decoder, target.device
        self.lm_head = model.get_output_embeddings()
        self.embedding = model.get_input_embeddings()
        # An EAGLE-3 head has its own LM head over its own draft vocabulary (draft id i is
        # token draft_vocab[i]).
        self.own_lm = hasattr(head, "logits")
        if self.own_lm:
            if draft_vocab is not None:
                raise ValueError("an EAGLE-3 head drafts over its own vocabulary (d2t); it takes no draft_vocab")
            draft_vocab = head.draft_token_ids()
        self.vocab = self.vocab_ids = None
        if draft_vocab is not None:
            self.vocab = draft_vocab.to(device=target.device, dtype=torch.long)
            self.vocab_ids = self.vocab.tolist()
        if draft_vocab is not None and not self.own_lm:
            weight = self.lm_head.weight                                          # (V, H)
            self.lm_weight = weight.index_select(0, self.vocab).contiguous()     # (Vd, H)
            bias = getattr(self.lm_head, "bias", None)
            self.lm_bias = bias.index_select(0, self.vocab) if bias is not None else None
        # With the fast target forward, the head drafts on the same kernels: its forward and
        # its LM head (the target's over the draft vocabulary, or EAGLE-3's own) over the
        # frontier's rows.
        self.forward, self.lm_packed, self.weights = head, None, "head"
        fast = isinstance(decoder, RowwiseLlamaDecoder) and head is not None
        int8 = draft_weights == "int8"
        if fast and RowwiseDraftHead.supports(head):
            self.weights = draft_weights
            self.forward = RowwiseDraftHead(head, int8, embedding=self.embedding)
            if draft_vocab is not None:
                self.lm_packed = kernels.Packed(self.lm_weight, int8)
        elif fast and RowwiseEagle3Head.supports(head):
            self.weights = draft_weights
            self.forward = RowwiseEagle3Head(head, int8, embedding=self.embedding)

    @property
    def vocab_size(self) -> int:
        """V, the target's full vocabulary (a sampled chain's q is spread over it)."""
        return self.lm_head.weight.shape[0]

    def logits(self, feats: torch.Tensor) -> torch.Tensor:
        """(F, H) predicted features -> (F, V) logits, or (F, Vd) over the draft vocabulary
        (EAGLE-3: the head's own norm and LM head)."""
        if self.own_lm:
            return self.forward.logits(feats)          # the head's own, or its fast kernels' form
        if self.forward is not self.head:          # the fast kernels (float32 features)
            if self.vocab is None:
                return self.decoder.logits(feats)
            logits = kernels.linear(feats, self.lm_packed)
            return logits + self.lm_bias.float() if self.lm_bias is not None else logits
        if self.vocab is None:
            return self.lm_head(feats)
        logits = feats @ self.lm_weight.T
        return logits + self.lm_bias if self.lm_bias is not None else logits

    def embed(self, tokens: list[int]) -> torch.Tensor:
        """(1, T, H) the head's input embeddings of ``tokens``: in one C call on the fast kernels
        (float32, what their head reads), else through the head's own ``embed``."""
        fast = getattr(self.forward, "embed_ids", None)
        out = fast(tokens) if fast is not None else None
        if out is not None:
            return out
        return self.head.embed(torch.tensor([tokens], device=self.device), self.embedding)
