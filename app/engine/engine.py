"""The decoding loop: draft -> verify -> accept -> commit -> record, one StepEvent per target forward.

State of a generation (``_Run``, run_state.py), with x the committed tokens (prompt + output, m of them):

    target cache   holds x[0 .. m-2]: every committed token but the last (the *root*),
                   which is fed at the start of the next verify forward
    draft cache    holds the head's pairs (f[j], x[j+1]) for j < draft_len
    pending        the pairs whose target features are known but which the head has not
                   read yet: after a step, the root and the accepted path with their *true*
                   features (f from the verify forward), paired with the next token

The prefill (step 0) reads the whole prompt in one target forward and takes the first answer
token from its last row, as plain decoding does; the head then reads the prompt's pairs (all
but the last, which the first step reads). From step 1 on, every step is five verbs
(Medusa's loop, EAGLE-2 inside it), each a method below:

    draft    the head reads the pending pairs; its last output predicts the feature at the
             root, whose LM-head distribution proposes the root's children; each further
             level feeds (predicted parent feature, child token) — tree.grow_tree decides
             which nodes to expand (head_draft.py: ``read_pending``, ``HeadDrafting``).
             Then the head's in-step entries are cropped away. With ``TreeConfig.lookup`` a
             prompt-lookup branch (what followed the context's last n-gram before) is
             hung beside the head's nodes (``_with_lookup_branch``).
    verify   ONE target forward over [root, node 0, ..., node N-1] with a tree attention mask
             (each node sees the prefix, the root and its own ancestors) and position ids
             prefix_len + depth.
    accept   verify.greedy_verify / sequential_verify / chain_verify -> path + bonus token.
    commit   keep only the root and the accepted path in the target cache; queue their
             features as the head's next pending pairs.
    record   the StepEvent: the tree with every node's fate, the rule that ran, timings.

EAGLE-3 (``heads.eagle3.Eagle3Head``) changes what the head reads, not the verbs: its f[j]
is the target's low/mid/high layers at j (3H wide, returned by the same prefill and verify
forwards), what it feeds back at deeper levels is its own hidden state, and it drafts over
its own vocabulary with its own LM head.

Vanilla decoding runs the same target forward with a single token and no tree. The other
drafters the EAGLE papers compare with (prompt lookup, lookahead, Medusa; app/engine/drafters)
replace the head in ``draft`` and read the verify forward after ``commit``; the rest is shared.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import torch

from app.engine import drafters, forward, kv, verify
from app.engine.config import (GenerationLimits, SamplingConfig, TreeConfig, check_max_new_tokens,
                               check_prompt)
from app.engine.events import DraftTreeRecord, RunSummary, StepEvent, summarize
from app.engine.draft_model import DraftModel
from app.engine.drafters.pld import with_lookup_branch
from app.engine.head_draft import HeadDrafting, read_pending
from app.engine.loading import Target
from app.engine.record import node_probs, node_statuses
from app.engine.rowwise import RowwiseLlamaDecoder
from app.engine.run_state import PhaseClock, TextStream, _Run, _Verified
from app.engine.tree import DraftTree, grow_tree, tree_attention_mask, tree_mask_rows


# Verify rows up to which the target's LM head runs over every row in one call (see verify).
# Measured on a 2-core CPU (fp32 SmolLM2, V = 49,152, H = 576, 2 threads, best of 7):
# one call over 1 / 2 / 3 / 4 rows 5.4 / 5.5 / 6.6 / 10.9 ms, two 1-row calls 10.9 ms. So for
# the 1-2 node trees that are fastest there, one batch beats "parents first, leaf on demand".
LM_HEAD_ALL_ROWS_UP_TO = 3


class Engine:
    """Speculative decoding with an EAGLE head over a stock transformers causal LM."""

    def __init__(self, target: Target, head=None, limits: GenerationLimits = GenerationLimits(),
                 draft_vocab: torch.Tensor | None = None, medusa=None, draft_weights: str = "int8"):
        """``draft_vocab``: optional (Vd,) token ids the head may propose (EAGLE-3's reduced
        draft vocabulary). On a CPU the draft's LM head is memory-bound — every draft level
        reads the whole (V, H) matrix, as many bytes as the target's attention layers — so
        restricting it to the tokens the target actually writes makes drafting several times
        cheaper. Verification is untouched, so output stays lossless; only acceptance can
        drop when the target's token lies outside the set. ``medusa``: optional
        ``heads.medusa.MedusaHeads`` for the medusa method. ``draft_weights``: on the fast
        kernels an EAGLE-1/2 head's layer and draft LM head read "int8" weights (half the
        bytes of bfloat16 at every draft level; acceptance within 1%,
        benchmarks/fast-forward/int8-draft.md) or "head", the head's own dtype."""
        self.target = target
        self.head = head
        self.medusa = medusa
        self.limits = limits
        model = target.model
        self.body = getattr(model, model.base_model_prefix)    # the decoder stack, ends with the final norm
        # decode/verify forwards: the same stack with fused projections where the
        # architecture allows (app/engine/fused.py), or the fast batch-invariant one (app/engine/rowwise.py)
        self.decoder = forward.decoder_forward(target)
        self.lm_head = model.get_output_embeddings()
        self.embedding = model.get_input_embeddings()
        self.eos_ids = target.eos_ids
        self._token_texts: dict[int, str] = {}   # token id -> its text alone (the step records' node labels)
        # An EAGLE-3 head reads three target layers, captured by the same forwards
        self.target_layers = tuple(getattr(head, "target_layers", ()))
        # what the head drafts with: its forward, embeddings and LM head (draft_model.py)
        self.draft_model = DraftModel(target, self.decoder, head, draft_vocab, draft_weights)
        # Rows a verify forward holds at about the cost of one (the fast kernels' register
        # block), or None where rows are not counted (the eager forward): see _with_lookup_branch.
        self.free_rows = self.decoder.lm_head_all_rows_up_to if isinstance(self.decoder, RowwiseLlamaDecoder) else None

    @property
    def draft_vocab(self) -> torch.Tensor | None:
        """The (Vd,) token ids the head may propose, or None for the full vocabulary."""
        return self.draft_model.vocab

    @property
    def drafter(self) -> str | None:
        """What proposes this engine's draft nodes (the step records' ``drafter``)."""
        return drafters.head_kind(self.head) if self.head is not None else None

    def drafter_for(self, cfg: TreeConfig) -> str | None:
        """The step records' ``drafter`` for a step drafted with ``cfg``."""
        if not cfg.uses_draft:
            return None
        return cfg.method if cfg.method in drafters.NAMES else self.drafter

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

    def check_request(self, prompt_ids: Sequence[int], tree: TreeConfig, max_new_tokens: int) -> None:
        check_max_new_tokens(max_new_tokens, self.limits.max_new_tokens)
        if not prompt_ids:
            raise ValueError("prompt must encode to at least one token")
        if tree.uses_head and self.head is None:
            raise ValueError(f"method {tree.method} needs a draft head, and none is loaded")
        drafters.check_ready(self, tree)
        room = self.target.max_positions - len(prompt_ids) - tree.max_path   # a step may write a whole path past the answer
        if max_new_tokens > room:
            raise ValueError(
                f"max_new_tokens must be at most {room} for this prompt: prompt ({len(prompt_ids)} tokens) "
                f"+ max_new_tokens ({max_new_tokens}) exceeds the model's context of "
                f"{self.target.max_positions} tokens")

    # --- the loop ---------------------------------------------------------------------------

    def generate(self, prompt: str | None = None, *, prompt_ids: Sequence[int] | None = None,
                 tree: TreeConfig = TreeConfig(), sampling: SamplingConfig = SamplingConfig(),
                 max_new_tokens: int = 128, raw: bool = False, adapt=None) -> Iterator[StepEvent | RunSummary]:
        """Yield one StepEvent per target forward (step 0: the prefill), then a RunSummary.

        The prompt is either ``prompt``, a text this call encodes (``encode_prompt``, with
        ``raw``), or ``prompt_ids``, the text already encoded: a caller that checks a request
        and then runs it, perhaps several times (the page's race, its method comparison and
        explorer), encodes once and passes the ids on.

        ``adapt``: an ``app.engine.adapt.TreeAdapter`` that picks each step's tree from the
        step times and acceptance measured so far (``tree`` is then only its starting point);
        None decodes every step with ``tree``. Output is the same either way: greedy output
        never depends on the tree, and sampled output is exact for any tree chosen before
        its step drafts.

        A bad request raises ValueError here, at the call, before any model work. Closing
        the returned iterator stops generation after the current step.
        """
        if prompt_ids is None:
            prompt_ids = self.encode_prompt(prompt, raw=raw)
        elif prompt is not None:
            raise ValueError("give the prompt as text (prompt) or as token ids (prompt_ids), not both")
        largest = adapt.largest(tree) if adapt is not None else tree
        self.check_request(prompt_ids, largest, max_new_tokens)
        return self._generate(list(prompt_ids), tree, sampling, max_new_tokens, adapt, largest)

    def _generate(self, prompt_ids, tree, sampling, max_new_tokens, adapt=None, largest=None):
        run, first = self._prefill(prompt_ids, tree, sampling, max_new_tokens, largest or tree)
        steps: list[StepEvent] = [first]
        generated: list[int] = list(first.new_tokens)
        yield first
        if adapt is not None:
            adapt.start(tree)
        while len(generated) < max_new_tokens and generated[-1] not in self.eos_ids:
            step_tree = adapt.next_tree() if adapt is not None else tree
            event = self._step(run, step_tree, sampling, len(steps), max_new_tokens - len(generated), generated)
            if adapt is not None:
                adapt.observe(event)
            steps.append(event)
            generated.extend(event.new_tokens)
            yield event
        yield summarize(tree.method, steps, self.decode(generated))

    @torch.inference_mode()
    def _prefill(self, prompt_ids: list[int], tree: TreeConfig, sampling: SamplingConfig,
                 max_new_tokens: int, largest: TreeConfig) -> tuple[_Run, StepEvent]:
        """Read the whole prompt in one target forward and take the first answer token from
        its last row (greedy: the argmax; sampling: a draw from p), as plain decoding does.
        The prompt's features become the head's pending pairs, and the head reads all but the
        last of them here (the step record's ``draft_ms``)."""
        clock = PhaseClock(self.target.device)
        device = self.target.device
        generator = torch.Generator(device=device).manual_seed(sampling.seed)
        # KV buffers sized for the prompt, the answer and one tree (they grow if ever short):
        # a step writes its keys/values in place instead of re-concatenating the cache
        capacity = len(prompt_ids) + max_new_tokens + largest.max_nodes + 1
        target_cache = kv.preallocated_cache(self.target.model, capacity)
        ids = torch.tensor([prompt_ids], device=device)                                      # (1, m)
        if self.target_layers:             # EAGLE-3 reads the low/mid/high layers: (1, m, 3H)
            hidden, features = self.decoder.prefill(ids, target_cache, self.target_layers)
        else:
            hidden = features = self.decoder.prefill(ids, target_cache)                     # (1, m, H)
        logits = self.decoder.logits(hidden[0, -1])                                          # (V,)
        features = features.to(self.target.dtype)   # the fast forward's float32 -> the heads' dtype
        if sampling.greedy:
            first = verify.argmax(logits)
        else:
            first = verify.sample(verify.logits_to_probs(logits, sampling), generator)
        clock.lap("verify")
        uses_draft = largest.uses_head     # the EAGLE head's cache and pending pairs
        run = _Run(tokens=list(prompt_ids) + [first], target_cache=target_cache,
                   draft_cache=kv.preallocated_cache(None, capacity) if uses_draft else None,
                   pending_features=features if uses_draft else None,
                   pending_tokens=list(prompt_ids[1:]) + [first] if uses_draft else [], generator=generator)
        run.stream = TextStream(self.decode)
        text = run.stream.push([first], final=first in self.eos_ids or max_new_tokens <= 1)
        run.drafter = drafters.start(self, tree, prompt_ids, features)
        if uses_draft and first not in self.eos_ids and max_new_tokens > 1:
            # the head reads the prompt's pairs now, as the target just did: prompt work (tens of
            # ms for a long prompt), not a decoding step's. The last pair stays pending, so the
            # first step reads it and drafts from the root as every step does
            clock.lap("record")
            read_pending(self.draft_model, run, leave=1)
            clock.lap("draft")
        event = StepEvent(step=0, method=tree.method, tree=None, accepted=[], bonus=first, new_tokens=[first],
                          text=text, rule=verify.rule_for(None, sampling), drafter=None, tree_config=None,
                          prefill=True, draft_ms=clock.ms.get("draft", 0.0), verify_ms=clock.ms["verify"],
                          step_ms=clock.total_ms)
        return run, event

    @torch.inference_mode()
    def _step(self, run: _Run, tree_cfg: TreeConfig, sampling: SamplingConfig, index: int,
              budget: int, generated: list[int]) -> StepEvent:
        """One decoding step, as its five verbs."""
        clock = PhaseClock(self.target.device)
        tree, draft_q = self.draft(run, tree_cfg, sampling)
        clock.lap("draft")
        verified = self.verify(run, tree)
        rule = verify.rule_for(tree_cfg, sampling)
        path, bonus = self.accept(verified, tree, rule, sampling, draft_q, run.generator)
        clock.lap("verify")
        accepted, new_tokens, text = self.commit(run, verified, tree, path, bonus, budget, generated)
        if run.drafter is not None:
            run.drafter.observe(self, run, verified, tree, path, bonus, tree_cfg)
        tree_record = self.record_tree(verified, tree, path, sampling) if tree_cfg.uses_draft else None
        clock.lap("record")
        return StepEvent(step=index, method=tree_cfg.method, tree=tree_record, accepted=accepted,
                         bonus=bonus, new_tokens=new_tokens, text=text, rule=rule,
                         drafter=self.drafter_for(tree_cfg),
                         tree_config=tree_cfg.shape() if tree_cfg.uses_draft else None,
                         draft_ms=clock.ms["draft"], verify_ms=clock.ms["verify"], step_ms=clock.total_ms)

    # --- draft ------------------------------------------------------------------------------

    def draft(self, run: _Run, cfg: TreeConfig, sampling: SamplingConfig) -> tuple[DraftTree, torch.Tensor | None]:
        """Grow this step's draft tree with the head (or the run's other drafter). Returns the tree and, for a sampled
        chain, the draft distributions q (N, V) its tokens were drawn from."""
        if not cfg.uses_draft:
            return DraftTree(), None
        if run.drafter is not None:            # pld / lookahead / medusa: fixed candidates, no q to sample from
            return run.drafter.draft(self, run, cfg), None
        root_feature, prefix = read_pending(self.draft_model, run)
        if root_feature is None:
            return DraftTree(), None  # a one-token prompt: no feature to draft from yet
        drafting = HeadDrafting(self.draft_model, run, cfg, sampling, root_feature, prefix)
        tree = grow_tree(cfg, drafting.propose)
        kv.crop(run.draft_cache, prefix)          # drop the in-step entries: only committed pairs stay
        if drafting.sampled_chain:
            q = torch.stack(drafting.chain_q[: len(tree)]) if len(tree) else None
            return tree, q
        if cfg.lookup:
            tree = self._with_lookup_branch(run, tree, cfg)
        return tree, None

    def _with_lookup_branch(self, run: _Run, tree: DraftTree, cfg: TreeConfig) -> DraftTree:
        """Prompt lookup beside the head (``TreeConfig.lookup``): one more branch, copied from
        where the context's last tokens occurred before (``drafters.pld.with_lookup_branch``),
        as many nodes as this forward's free rows allow."""
        return with_lookup_branch(tree, run, cfg, self.free_rows)

    # --- verify -----------------------------------------------------------------------------

    def verify(self, run: _Run, tree: DraftTree) -> _Verified:
        """ONE target forward over [root, nodes] with the tree attention mask; the LM head over
        the rows verification can visit."""
        device = self.target.device
        prefix = len(run.tokens) - 1
        root = run.tokens[-1]
        ids = torch.tensor([[root] + tree.tokens], device=device)                            # (1, N+1)
        positions = torch.tensor([[prefix] + [prefix + d for d in tree.depths]], device=device)
        if len(tree) and getattr(self.decoder, "takes_row_masks", False):
            mask = tree_mask_rows(tree.parents, prefix)                                       # (N+1, prefix+N+1)
        elif len(tree):
            local = tree_attention_mask(tree.parents, device=device)                          # (N+1, N+1)
            mask = torch.cat([torch.ones(len(tree) + 1, prefix, dtype=torch.bool, device=device),
                              local], dim=1)[None, None]                                       # (1, 1, N+1, prefix+N+1)
        else:
            mask = None  # a single query attends to the whole cache: the default causal mask
        if self.target_layers:   # EAGLE-3: the low/mid/high layers of the same forward, (1, N+1, 3H)
            hidden, draft_features = self.decoder(ids, positions, mask, run.target_cache, self.target_layers)
        else:
            hidden = draft_features = self.decoder(ids, positions, mask, run.target_cache)    # (1, N+1, H)

        # lm_rows: where the LM head runs, in one batch. Normally only rows verification can
        # visit: the root and every node with children, plus the accepted leaf (for its bonus)
        # on demand. Leaves are about half of a tree, and each row costs a (V, H) matmul. A
        # small tree is the exception: for a few rows the matmul is bound by reading the
        # (V, H) weight, so a second call for the leaf would read all V·H weights again (fp32
        # SmolLM2: 113 MB, ~5 ms) where one batch over every row costs about one call.
        if len(tree) + 1 <= getattr(self.decoder, "lm_head_all_rows_up_to", LM_HEAD_ALL_ROWS_UP_TO):
            lm_rows = list(range(len(tree) + 1))
            rows = hidden[0]                                  # every row: a view (a gather cost 25 us)
        else:
            lm_rows = sorted({0} | {par + 1 for par in tree.parents})
            rows = hidden[0, lm_rows]
        batch = self.decoder.logits(rows)                                                     # (R, V)
        logits = verify.LazyRows(lambda r: self.decoder.logits(hidden[0, r]), batch, lm_rows)
        return _Verified(prefix=prefix, root=root, hidden=hidden, draft_features=draft_features, lm_rows=lm_rows,
                         batch=batch, logits=logits)

    # --- accept -----------------------------------------------------------------------------

    @staticmethod
    def accept(verified: _Verified, tree: DraftTree, rule: str, sampling: SamplingConfig,
               draft_q: torch.Tensor | None, generator: torch.Generator) -> tuple[list[int], int]:
        """The accepted path (node indices from the root down) and the bonus token."""
        children = tree.children()
        if rule == verify.GREEDY:
            return verify.greedy_verify(verified.logits, tree.tokens, children)
        p = verify.LazyRows(lambda r: verify.logits_to_probs(verified.logits[r], sampling))
        if rule == verify.SAMPLED_CHAIN:       # a chain drafted by sampling from q
            return verify.chain_verify(p, draft_q, tree.tokens, generator)
        return verify.sequential_verify(p, tree.tokens, children, generator)

    # --- commit -----------------------------------------------------------------------------

    def commit(self, run: _Run, verified: _Verified, tree: DraftTree, path: list[int], bonus: int,
               budget: int, generated: list[int]) -> tuple[list[int], list[int], str]:
        """Keep the root and the accepted path in the target cache, queue their true features
        for the head, and extend the sequence. Returns (accepted, new tokens, their text), the
        new tokens cut at an EOS and at the ``budget`` of tokens left."""
        accepted = [tree.tokens[i] for i in path]
        keep = [0] + [i + 1 for i in path]                 # verify rows: the root, then the path
        kv.keep_positions(run.target_cache, verified.prefix, keep)
        if run.draft_cache is not None:
            # (1, k+1, H or 3H) the true features of the kept rows, in the heads' dtype (the fast
            # forward returns float32; converted here, where a head reads them, not for every row)
            features = verified.draft_features[:, keep].to(self.target.dtype)
            if run.pending_tokens:     # a step that drafted nothing (an adaptive run's vanilla step) left
                features = torch.cat([run.pending_features, features], dim=1)   # its pairs unread: keep them
            run.pending_features = features
            run.pending_tokens = run.pending_tokens + accepted + [bonus]
        new_tokens = (accepted + [bonus])[:budget]
        for j, t in enumerate(new_tokens):
            if t in self.eos_ids:
                new_tokens = new_tokens[: j + 1]
                break
        run.tokens.extend(accepted + [bonus])
        final = len(new_tokens) >= budget or new_tokens[-1] in self.eos_ids     # the answer's last step
        text = run.stream.push(new_tokens, final=final)
        return accepted[: len(new_tokens)], new_tokens, text

    # --- record -----------------------------------------------------------------------------

    def token_texts(self, tokens: list[int]) -> list[str]:
        """Each token's text decoded alone, remembered per token: the tokenizer's call cost
        ~0.17 ms a step, a quarter of the record's time on a CPU."""
        new = [t for t in dict.fromkeys(tokens) if t not in self._token_texts]
        if new:
            self._token_texts.update(zip(new, self.target.tokenizer.batch_decode([[t] for t in new])))
        return [self._token_texts[t] for t in tokens]

    def record_tree(self, verified: _Verified, tree: DraftTree, path: list[int],
                    sampling: SamplingConfig) -> DraftTreeRecord:
        """The step's tree for consumers: statuses, texts, and p of every node (record.py)."""
        status = node_statuses(tree, path)
        p_nodes = node_probs(verified, tree, sampling)
        texts = self.token_texts(tree.tokens)
        return DraftTreeRecord(root_token=verified.root, tokens=list(tree.tokens), texts=texts,
                               parents=list(tree.parents), depths=list(tree.depths), q=list(tree.q),
                               confidence=list(tree.confidence), p=p_nodes, status=status,
                               source=list(tree.sources) if any(tree.sources) else None)
