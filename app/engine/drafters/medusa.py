"""Medusa (Cai et al., 2401.10774) as a drafter: k extra heads on the target's last hidden state.

Head k (1-based) reads the target's feature h[t] at the last position whose token is known
and predicts the token k + 1 positions later (the target's own LM head predicts the next
one). In the engine's terms: h[t] is the feature of the token before the root (the root is
the token the target just produced from h[t]), so head k proposes the root's descendants at
depth k. The heads are independent: every node at depth k is one of head k's top
candidates whatever its parent is, and the tree is a *static* shape of child ranks
(``TreeConfig.static_shape``, the same paths EAGLE-1's static method uses), cut to the heads
loaded and to ``depth``, then to the ``total_tokens`` most confident nodes.

The heads themselves (``MedusaHeads``: the weights, their published layout, an optional draft
vocabulary) are ``app/engine/heads/medusa.py``; the engine holds them as ``engine.medusa``
(``loading.load_medusa_heads``).

Verification is the engine's: greedy or exact sampled (``sequential_verify``: Medusa's
candidates are fixed top-k tokens). The Medusa paper's "typical acceptance" is not lossless
and is not used.
"""
from __future__ import annotations

import dataclasses

import torch

from app.engine.tree import DraftTree, grow_tree, proposals_needed


class MedusaDrafter:
    """The medusa drafter's per-run state: the target feature the heads read next."""

    name = "medusa"

    def __init__(self, feature: torch.Tensor):
        self.feature = feature                            # (H,) feature of the token before the root

    @classmethod
    def start(cls, engine, cfg, prompt_ids: list[int], features) -> "MedusaDrafter":
        return cls(features[0, -1])

    def draft(self, engine, run, cfg) -> DraftTree:
        heads = engine.medusa
        depth = min(cfg.depth, heads.num_heads)
        shape = tuple(p for p in cfg.static_shape if len(p) <= depth)
        static = dataclasses.replace(cfg, method="static", depth=depth, static_shape=shape)
        k = proposals_needed(static)
        logits = heads(self.feature.to(heads[0][-1].weight.dtype), depth)                   # (depth, V or Vd)
        top = torch.topk(logits, min(k, logits.shape[-1]), dim=-1)
        q = torch.exp(top.values.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True))  # (depth, k)
        ids = top.indices if heads.vocab_ids is None else heads.vocab_ids[top.indices]
        q, ids = q.tolist(), ids.tolist()

        def propose(tree, frontier, level):
            # independent heads: every frontier node gets head `level`'s candidates
            return [q[level - 1]] * len(frontier), [ids[level - 1]] * len(frontier)

        return grow_tree(static, propose)

    def observe(self, engine, run, verified, tree, path, bonus, cfg) -> None:
        last = path[-1] + 1 if path else 0                # the row that produced the bonus (the new root)
        self.feature = verified.hidden[0, last].to(engine.target.dtype)   # as the prefill's features
