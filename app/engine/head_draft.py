"""The EAGLE head's side of the draft verb: read the pending pairs, then grow the tree level by level.

Notation (EAGLE, 2401.15077): x are the committed tokens, f[j] the target's feature at j (the
last hidden state; EAGLE-3: its low/mid/high layers, 3H wide), f̂ the head's prediction of a
feature. The head reads pairs (f[j], x[j+1]) and predicts f̂[j+1], whose LM-head distribution
q proposes x[j+2].

``read_pending`` feeds the head the pairs the last step committed (their *true* features,
from the verify forward); its last output is f̂ at the root, whose q proposes the root's
children. ``HeadDrafting.propose`` is the per-level callback of ``tree.grow_tree``: one head
forward over the frontier's (predicted parent feature, token) pairs, each attending to the
committed pairs and to its own ancestors' in-step entries, then q's top-k children of each
(EAGLE-2's expansion), or one child sampled from q for a sampled chain. ``Engine.draft``
(engine.py) strings these together and crops the in-step entries afterwards. The head's
forward, embeddings and LM head come from the engine's ``DraftModel`` (draft_model.py), which
picks them once: the fast kernels or the head itself, the full vocabulary or the draft
vocabulary. This module reads only that, never the engine.
"""
from __future__ import annotations

import torch

from app.engine import kernels, kv, verify
from app.engine.config import SamplingConfig, TreeConfig
from app.engine.draft_model import DraftModel
from app.engine.run_state import _Run
from app.engine.tree import ROOT, DraftTree, mask_rows, proposals_needed


def read_pending(draft: DraftModel, run: _Run, leave: int = 0) -> tuple[torch.Tensor | None, int]:
    """The head reads the pending pairs but the last ``leave`` (causal among themselves, all of
    its cache before them). Returns its last output, the predicted feature after the last pair
    read (1, 1, H: at the root when ``leave`` is 0), and the head's committed length after
    reading.

    The prefill reads the prompt's pairs with ``leave=1`` (``Engine._prefill``): reading a
    prompt through the head is prompt work, like the target's prefill, and takes tens of ms
    for a long one; the first step then reads what is left, as every step does."""
    cache, device = run.draft_cache, draft.device
    base = kv.cache_length(cache)
    n_read = len(run.pending_tokens) - leave
    if n_read <= 0:
        return None, base
    emb = draft.embed(run.pending_tokens[:n_read])                                                  # (1, P, H)
    pos = torch.arange(base, base + n_read, device=device)[None]                                   # (1, P)
    # causal over the cache: the fast kernels' head reads that from no mask at all (no mask
    # to build, convert and test key by key, every step)
    mask = None if getattr(draft.forward, "causal_without_mask", False) else \
        torch.ones(n_read, base + n_read, dtype=torch.bool, device=device).tril(base)[None, None]
    features = run.pending_features if not leave else run.pending_features[:, :n_read]             # (1, P, H)
    out = draft.forward(emb, features, pos, mask, cache)                                           # (1, P, H)
    if leave:
        # a copy: the view would keep the whole prompt's features alive
        run.pending_features, run.pending_tokens = run.pending_features[:, n_read:].clone(), run.pending_tokens[n_read:]
    else:
        run.pending_features, run.pending_tokens = None, []
    return out[:, -1:], base + n_read


class HeadDrafting:
    """One step's drafting state, and ``propose``, the callback ``tree.grow_tree`` calls once
    per level to get each frontier node's candidate children.

    Positions in the head's cache: the head has read the pairs (f[j], x[j+1]) for
    j < ``prefix``; the root is x[prefix], so a node at depth d is x[prefix + d], and the pair
    that feeds it to the head, (f̂[prefix + d - 1], x[prefix + d]), sits at position
    ``prefix + d - 1`` (``_pair_position``).
    """

    def __init__(self, draft: DraftModel, run: _Run, cfg: TreeConfig, sampling: SamplingConfig,
                 root_feature: torch.Tensor, prefix: int):
        self.draft, self.run, self.sampling = draft, run, sampling
        self.cache = run.draft_cache
        self.root_feature = root_feature        # (1, 1, H) predicted feature at the root
        self.prefix = prefix                    # the head's committed length
        self.node_feature: dict[int, torch.Tensor] = {}   # node -> its predicted feature (H,)
        self.node_slot: dict[int, int] = {}               # node -> its entry in the head's cache
        self.k = proposals_needed(cfg)
        self.sampled_chain = cfg.samples_drafts(sampling)
        self.chain_q: list[torch.Tensor] = []   # sampled chain: q (V,) each node was drawn from

    def _pair_position(self, node_depth: int) -> int:
        return self.prefix + node_depth - 1

    def _features(self, tree: DraftTree, frontier: list[int], depth: int) -> torch.Tensor:
        """(F, H) predicted features of the frontier nodes (at depth - 1): one head forward
        over their (parent feature, token) pairs; each attends to the committed pairs and to
        its own ancestors' in-step entries."""
        if frontier == [ROOT]:
            return self.root_feature[0]                                                 # (1, H)
        device, cache = self.draft.device, self.cache
        parent_feats = torch.stack([self.root_feature[0, 0] if tree.parents[n] == ROOT
                                    else self.node_feature[tree.parents[n]] for n in frontier])[None]  # (1, F, H)
        length = kv.cache_length(cache)
        # each row sees the committed pairs, its ancestors' in-step entries and its own
        visible = [[self.node_slot[a] for a in tree.ancestors(n)] + [length + row] for row, n in enumerate(frontier)]
        if getattr(self.draft.forward, "takes_row_masks", False):
            mask = mask_rows(visible, self.prefix, length + len(frontier))                # (F, S) uint8
        else:
            mask = torch.zeros(len(frontier), length + len(frontier), dtype=torch.bool, device=device)
            mask[:, :self.prefix] = True
            for row, slots in enumerate(visible):
                mask[row, slots] = True
            mask = mask[None, None]                                                    # (1, 1, F, S)
        pos = torch.full((1, len(frontier)), self._pair_position(depth - 1), device=device)
        out = self.draft.forward(self.draft.embed([tree.tokens[n] for n in frontier]), parent_feats, pos, mask, cache)
        feats = out[0]                                                                 # (F, H)
        for row, n in enumerate(frontier):
            self.node_feature[n] = feats[row]
            self.node_slot[n] = length + row
        return feats

    def propose(self, tree: DraftTree, frontier: list[int], depth: int):
        """For each frontier node: (q of its candidate children, their token ids)."""
        draft = self.draft
        draft_logits = draft.logits(self._features(tree, frontier, depth))              # (F, V or Vd)
        if self.sampled_chain:
            q = verify.logits_to_probs(draft_logits, self.sampling)[0]                  # (V or Vd,)
            j = verify.sample(q, self.run.generator)   # drawn over the draft vocabulary: no 49k-way draw
            tok = j if draft.vocab is None else int(draft.vocab[j])
            q_j = float(q[j])
            if draft.vocab is not None:   # q over the full vocabulary, 0 outside the draft set
                q = torch.zeros(draft.vocab_size, device=q.device).index_copy_(0, draft.vocab, q)
            self.chain_q.append(q)
            return [[q_j]], [[tok]]
        # q of the k best children: exp(logit - logsumexp), no full softmax written; in one
        # C pass a row on the fast kernels (~10 against ~45 us for 8,192 logits)
        fast = kernels.top_probs(draft_logits, self.k)
        if fast is not None:
            q_top, top_ids, _ = fast
        else:
            top = torch.topk(draft_logits, min(self.k, draft_logits.shape[-1]), dim=-1)
            q_top = torch.exp(top.values.float() - torch.logsumexp(draft_logits.float(), dim=-1, keepdim=True))
            top_ids = top.indices
        ids = top_ids.tolist()
        if draft.vocab_ids is not None:        # draft-vocabulary indices -> token ids
            ids = [[draft.vocab_ids[j] for j in row] for row in ids]
        return q_top.tolist(), ids
