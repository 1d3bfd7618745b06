"""The decoding loop: draft -> verify -> accept -> commit, one StepEvent per target forward.

State of a generation (``_Run``), with x the committed tokens (prompt + output, m of them):

    target cache   holds x[0 .. m-2]: every committed token but the last (the *root*),
                   which is fed at the start of the next verify forward
    draft cache    holds the head's pairs (f[j], x[j+1]) for j < draft_len
    pending        the pairs whose target features are known but which the head has not
                   read yet: after a step, the root and the accepted path with their *true*
                   features (f from the verify forward), paired with the next token

One step (Medusa-style four verbs, EAGLE-2 inside them):

    draft    the head reads the pending pairs; its last output predicts the feature at the
             root, whose LM-head distribution proposes the root's children; each further
             level feeds (predicted parent feature, child token) — tree.grow_tree decides
             which nodes to expand. Then the head's in-step entries are cropped away.
    verify   ONE target forward over [root, node 0, ..., node N-1] with a tree attention mask
             (each node sees the prefix, the root and its own ancestors) and position ids
             prefix_len + depth.
    accept   verify.greedy_verify / sequential_verify / chain_verify -> path + bonus token.
    commit   keep only the root and the accepted path in the target cache; queue their
             features as the head's next pending pairs.

Vanilla decoding runs the same target forward with a single token and no tree.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import torch

from app.engine import fused, kv, verify
from app.engine.config import (GenerationLimits, SamplingConfig, TreeConfig, check_max_new_tokens,
                               check_prompt)
from app.engine.events import DraftTreeRecord, RunSummary, StepEvent, summarize
from app.engine.loading import Target
from app.engine.tree import ROOT, DraftTree, grow_tree, proposals_needed, tree_attention_mask


# Verify rows up to which the target's LM head runs over every row in one call (see _step).
# Measured on this 2-core CPU (fp32 SmolLM2, V = 49,152, H = 576, 2 threads, best of 7):
# one call over 1 / 2 / 3 / 4 rows 5.4 / 5.5 / 6.6 / 10.9 ms, two 1-row calls 10.9 ms. So for
# the 1-2 node trees that are fastest here, one batch beats "parents first, leaf on demand".
LM_HEAD_ALL_ROWS_UP_TO = 3


@dataclass
class _Run:
    """Everything one generation owns (never stored on the model, so runs cannot leak)."""

    tokens: list[int]                  # committed sequence x: prompt + generated
    target_cache: object               # transformers DynamicCache over x[:-1] (kv.PreallocatedLayer buffers)
    draft_cache: object | None         # the head's cache (same kind), or None for vanilla
    pending_features: torch.Tensor | None  # (1, P, H) features f[j] of pairs not yet read by the head
    pending_tokens: list[int]          # the P tokens x[j+1] of those pairs
    generator: torch.Generator
    text: str = ""                     # decoded generated text so far (so each step decodes once)


class Engine:
    """Speculative decoding with an EAGLE head over a stock transformers causal LM."""

    def __init__(self, target: Target, head=None, limits: GenerationLimits = GenerationLimits(),
                 draft_vocab: torch.Tensor | None = None):
        """``draft_vocab``: optional (Vd,) token ids the head may propose (EAGLE-3's reduced
        draft vocabulary). On a CPU the draft's LM head is memory-bound — every draft level
        reads the whole (V, H) matrix, as many bytes as the target's attention layers — so
        restricting it to the tokens the target actually writes makes drafting several times
        cheaper. Verification is untouched, so output stays lossless; only acceptance can
        drop when the target's token lies outside the set."""
        self.target = target
        self.head = head
        self.limits = limits
        model = target.model
        self.body = getattr(model, model.base_model_prefix)    # the decoder stack, ends with the final norm
        # decode/verify forwards: the same stack with fused projections where the
        # architecture allows (app/engine/fused.py); the prompt's prefill stays on self.body
        self.decoder = fused.decoder_forward(target)
        self.lm_head = model.get_output_embeddings()
        self.embedding = model.get_input_embeddings()
        self.eos_ids = target.eos_ids
        self.draft_vocab = None
        if draft_vocab is not None:
            self.draft_vocab = draft_vocab.to(device=target.device, dtype=torch.long)
            weight = self.lm_head.weight                                   # (V, H)
            self.draft_lm_weight = weight.index_select(0, self.draft_vocab).contiguous()  # (Vd, H)
            bias = getattr(self.lm_head, "bias", None)
            self.draft_lm_bias = bias.index_select(0, self.draft_vocab) if bias is not None else None

    # --- inputs ---------------------------------------------------------------------------

    def encode_prompt(self, prompt: str, raw: bool = False) -> list[int]:
        """One user message through the chat template, or the text as is with ``raw``."""
        check_prompt(prompt, self.limits.max_prompt_chars)
        tok = self.target.tokenizer
        if not raw and getattr(tok, "chat_template", None):
            enc = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
            ids = enc["input_ids"] if hasattr(enc, "keys") else enc
        else:
            ids = tok(prompt, add_special_tokens=raw is False)["input_ids"]
        return [int(t) for t in ids]

    def decode(self, ids: list[int]) -> str:
        return self.target.tokenizer.decode(ids, skip_special_tokens=True)

    def check_request(self, prompt_ids: list[int], tree: TreeConfig, max_new_tokens: int) -> None:
        check_max_new_tokens(max_new_tokens, self.limits.max_new_tokens)
        if not prompt_ids:
            raise ValueError("prompt must encode to at least one token")
        if tree.uses_draft and self.head is None:
            raise ValueError(f"method {tree.method} needs a draft head, and none is loaded")
        need = len(prompt_ids) + max_new_tokens + (tree.depth if tree.uses_draft else 0)
        if need > self.target.max_positions:
            raise ValueError(
                f"max_new_tokens must be at most {self.target.max_positions - len(prompt_ids) - (tree.depth if tree.uses_draft else 0)} "
                f"for this prompt: prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) "
                f"exceeds the model's context of {self.target.max_positions} tokens")

    # --- the loop ---------------------------------------------------------------------------

    def generate(self, prompt: str | None = None, *, prompt_ids: list[int] | None = None,
                 tree: TreeConfig = TreeConfig(), sampling: SamplingConfig = SamplingConfig(),
                 max_new_tokens: int = 128, raw: bool = False) -> Iterator[StepEvent | RunSummary]:
        """Yield one StepEvent per target forward, then a RunSummary.

        A bad request raises ValueError here, at the call, before any model work. Closing
        the returned iterator stops generation after the current step.
        """
        if prompt_ids is None:
            prompt_ids = self.encode_prompt(prompt, raw=raw)
        self.check_request(prompt_ids, tree, max_new_tokens)
        return self._generate(list(prompt_ids), tree, sampling, max_new_tokens)

    def _generate(self, prompt_ids, tree, sampling, max_new_tokens):
        run = self._prefill(prompt_ids, tree, sampling, max_new_tokens)
        steps: list[StepEvent] = []
        seconds = 0.0
        generated: list[int] = []
        while len(generated) < max_new_tokens:
            event = self._step(run, tree, sampling, len(steps), max_new_tokens - len(generated), generated)
            seconds += event.step_ms / 1000.0
            steps.append(event)
            generated.extend(event.new_tokens)
            yield event
            if event.new_tokens and event.new_tokens[-1] in self.eos_ids:
                break
        yield summarize(tree.method, steps, seconds, self.decode(generated))

    @torch.inference_mode()
    def _prefill(self, prompt_ids: list[int], tree: TreeConfig, sampling: SamplingConfig,
                 max_new_tokens: int = 128) -> _Run:
        device = self.target.device
        generator = torch.Generator(device=device).manual_seed(sampling.seed)
        # KV buffers sized for the prompt, the answer and one tree (they grow if ever short):
        # a step writes its keys/values in place instead of re-concatenating the cache
        capacity = len(prompt_ids) + max_new_tokens + (tree.total_tokens + 1 if tree.uses_draft else 1)
        target_cache = kv.preallocated_cache(self.target.model, capacity)
        features = None
        if len(prompt_ids) > 1:
            ids = torch.tensor([prompt_ids[:-1]], device=device)
            features = self.body(input_ids=ids, cache=target_cache, use_cache=True).last_hidden_state
        draft_cache = kv.preallocated_cache(None, capacity) if tree.uses_draft else None
        return _Run(tokens=list(prompt_ids), target_cache=target_cache,
                    draft_cache=draft_cache, pending_features=features if tree.uses_draft else None,
                    pending_tokens=list(prompt_ids[1:]) if tree.uses_draft else [], generator=generator)

    @torch.inference_mode()
    def _step(self, run: _Run, tree_cfg: TreeConfig, sampling: SamplingConfig, index: int,
              budget: int, generated: list[int]) -> StepEvent:
        sync = torch.cuda.synchronize if self.target.device.type == "cuda" else (lambda: None)
        t0 = time.perf_counter()
        if tree_cfg.uses_draft:
            tree, draft_q = self._draft(run, tree_cfg, sampling)
        else:
            tree, draft_q = DraftTree(), None
        sync()
        t1 = time.perf_counter()

        # verify: one forward over the root and all nodes
        prefix = len(run.tokens) - 1
        root = run.tokens[-1]
        ids = torch.tensor([[root] + tree.tokens], device=self.target.device)
        positions = torch.tensor([[prefix] + [prefix + d for d in tree.depths]], device=self.target.device)
        if len(tree):
            local = tree_attention_mask(tree.parents, device=self.target.device)     # (N+1, N+1)
            mask = torch.cat([torch.ones(len(tree) + 1, prefix, dtype=torch.bool, device=self.target.device),
                              local], dim=1)[None, None]                               # (1, 1, N+1, prefix+N+1)
        else:
            mask = None  # a single query attends to the whole cache: the default causal mask
        hidden = self.decoder(ids, positions, mask, run.target_cache)                 # (1, N+1, H)

        # lm_rows: where the LM head runs, in one batch. Normally only rows verification can
        # visit: the root and every node with children, plus the accepted leaf (for its bonus)
        # on demand. Leaves are about half of a tree, and each row costs a (V, H) matmul. A
        # small tree is the exception: for a few rows the matmul is bound by reading the
        # (V, H) weight, so a second call for the leaf would read all V·H weights again (fp32
        # SmolLM2: 113 MB, ~5 ms) where one batch over every row costs about one call.
        if len(tree) + 1 <= LM_HEAD_ALL_ROWS_UP_TO:
            lm_rows = list(range(len(tree) + 1))
        else:
            lm_rows = sorted({0} | {par + 1 for par in tree.parents})
        batch = self.lm_head(hidden[0, lm_rows])                                       # (R, V)
        logits = verify.LazyRows(lambda r: self.lm_head(hidden[0, r]), dict(zip(lm_rows, batch)))
        p = verify.LazyRows(lambda r: verify.logits_to_probs(logits[r], sampling))
        children = tree.children()
        if sampling.greedy:
            path, bonus = verify.greedy_verify(logits, tree.tokens, children)
        elif tree_cfg.samples_drafts(sampling):      # a chain drafted by sampling from q
            path, bonus = verify.chain_verify(p, draft_q, tree.tokens, run.generator)
        else:
            path, bonus = verify.sequential_verify(p, tree.tokens, children, run.generator)
        sync()
        t2 = time.perf_counter()

        # commit: keep the root and the accepted path, everywhere
        accepted = [tree.tokens[i] for i in path]
        keep = [0] + [i + 1 for i in path]
        kv.keep_positions(run.target_cache, prefix, keep)
        if run.draft_cache is not None:
            run.pending_features = hidden[:, keep]           # (1, k+1, H) true features
            run.pending_tokens = accepted + [bonus]
        new_tokens = (accepted + [bonus])[:budget]
        for j, t in enumerate(new_tokens):
            if t in self.eos_ids:
                new_tokens = new_tokens[: j + 1]
                break
        run.tokens.extend(accepted + [bonus])

        full = self.decode(generated + new_tokens)   # decoding the whole answer keeps multi-token characters intact
        text, run.text = full[len(run.text):], full
        record = self._tree_record(root, tree, path, lm_rows, batch, sampling) if tree_cfg.uses_draft else None
        sync()
        t3 = time.perf_counter()
        return StepEvent(step=index, method=tree_cfg.method, tree=record, accepted=accepted[: len(new_tokens)],
                         bonus=bonus, new_tokens=new_tokens, text=text,
                         draft_ms=(t1 - t0) * 1e3, verify_ms=(t2 - t1) * 1e3, step_ms=(t3 - t0) * 1e3)

    # --- drafting ---------------------------------------------------------------------------

    def _draft(self, run: _Run, cfg: TreeConfig, sampling: SamplingConfig):
        """Grow this step's draft tree with the head. Returns the tree and, for a sampled
        chain, the draft distributions q (N, V) its tokens were drawn from."""
        head, cache = self.head, run.draft_cache
        device = self.target.device
        base = kv.cache_length(cache)
        n_pending = len(run.pending_tokens)
        if n_pending == 0:
            return DraftTree(), None  # a one-token prompt: no feature to draft from yet

        # 1. read the pending pairs (causal among themselves, all of the cache before them)
        emb = head.embed(torch.tensor([run.pending_tokens], device=device), self.embedding)   # (1, P, H)
        pos = torch.arange(base, base + n_pending, device=device)[None]                         # (1, P)
        mask = torch.ones(n_pending, base + n_pending, dtype=torch.bool, device=device).tril(base)[None, None]
        out = head(emb, run.pending_features, pos, mask, cache)                                # (1, P, H)
        run.pending_features, run.pending_tokens = None, []
        prefix = base + n_pending        # the head's committed length; in-step entries come after it

        root_feature = out[:, -1:]       # (1, 1, H) predicted feature at the root
        node_feature: dict[int, torch.Tensor] = {}   # node -> its predicted feature (H,)
        node_slot: dict[int, int] = {}               # node -> its entry in the head's cache
        k = proposals_needed(cfg)
        sampled_chain = cfg.samples_drafts(sampling)
        chain_q: list[torch.Tensor] = []

        def propose(tree: DraftTree, frontier: list[int], depth: int):
            if frontier == [ROOT]:
                feats = root_feature[0]                                                       # (1, H)
            else:
                tokens = torch.tensor([[tree.tokens[n] for n in frontier]], device=device)       # (1, F)
                parent_feats = torch.stack([root_feature[0, 0] if tree.parents[n] == ROOT
                                            else node_feature[tree.parents[n]] for n in frontier])[None]  # (1, F, H)
                length = kv.cache_length(cache)
                mask = torch.zeros(len(frontier), length + len(frontier), dtype=torch.bool, device=device)
                mask[:, :prefix] = True
                for row, n in enumerate(frontier):
                    for a in tree.ancestors(n):
                        mask[row, node_slot[a]] = True
                    mask[row, length + row] = True
                pos = torch.full((1, len(frontier)), prefix + depth - 2, device=device)
                out = head(head.embed(tokens, self.embedding), parent_feats, pos, mask[None, None], cache)
                feats = out[0]                                                                 # (F, H)
                for row, n in enumerate(frontier):
                    node_feature[n] = feats[row]
                    node_slot[n] = length + row
            draft_logits = self._draft_logits(feats)                                        # (F, V or Vd)
            if sampled_chain:
                q = verify.logits_to_probs(draft_logits, sampling)[0]                           # (V or Vd,)
                j = verify.sample(q, run.generator)        # drawn over the draft vocabulary: no 49k-way draw
                tok = j if self.draft_vocab is None else int(self.draft_vocab[j])
                q_j = float(q[j])
                if self.draft_vocab is not None:   # q over the full vocabulary, 0 outside the draft set
                    q = torch.zeros(self.lm_head.weight.shape[0], device=device).index_copy_(0, self.draft_vocab, q)
                chain_q.append(q)
                return [[q_j]], [[tok]]
            # q of the k best children: exp(logit - logsumexp), no full softmax written
            top = torch.topk(draft_logits, min(k, draft_logits.shape[-1]), dim=-1)
            q_top = torch.exp(top.values.float() - torch.logsumexp(draft_logits.float(), dim=-1, keepdim=True))
            ids = top.indices if self.draft_vocab is None else self.draft_vocab[top.indices]
            return q_top.tolist(), ids.tolist()

        tree = grow_tree(cfg, propose)
        kv.crop(cache, prefix)
        q = torch.stack(chain_q[: len(tree)]) if sampled_chain and len(tree) else None
        return tree, q

    def _draft_logits(self, feats: torch.Tensor) -> torch.Tensor:
        """(F, H) predicted features -> (F, V) logits, or (F, Vd) over the draft vocabulary."""
        if self.draft_vocab is None:
            return self.lm_head(feats)
        logits = feats @ self.draft_lm_weight.T
        return logits + self.draft_lm_bias if self.draft_lm_bias is not None else logits

    def _tree_record(self, root: int, tree: DraftTree, path: list[int], lm_rows: list[int],
                     row_logits: torch.Tensor, sampling: SamplingConfig) -> DraftTreeRecord:
        """The step's tree for consumers: statuses, texts, and p of every node, the target's
        probability of the node's token given its parent (the shaped distribution when
        sampling; plain softmax when greedy, computed as exp(logit - logsumexp) so no
        (R, V) probability matrix is written)."""
        status = ["unreached"] * len(tree)
        reached_rows = {0} | {i + 1 for i in path}
        for i, parent in enumerate(tree.parents):
            if parent + 1 in reached_rows:
                status[i] = "rejected"
        for i in path:
            status[i] = "accepted"
        p_nodes: list[float] = []
        if len(tree):
            where = {row: j for j, row in enumerate(lm_rows)}
            rows = torch.tensor([where[par + 1] for par in tree.parents], device=row_logits.device)
            cols = torch.tensor(tree.tokens, device=row_logits.device)
            if sampling.greedy:
                lse = torch.logsumexp(row_logits.float(), dim=-1)                      # (R,)
                p_nodes = torch.exp(row_logits[rows, cols].float() - lse[rows]).tolist()
            else:
                p_nodes = verify.logits_to_probs(row_logits, sampling)[rows, cols].tolist()
        texts = self.target.tokenizer.batch_decode([[t] for t in tree.tokens]) if len(tree) else []
        return DraftTreeRecord(root_token=root, tokens=list(tree.tokens), texts=texts,
                               parents=list(tree.parents), depths=list(tree.depths), q=list(tree.q),
                               confidence=list(tree.confidence), p=p_nodes, status=status)
