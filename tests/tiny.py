"""Tiny random models for algorithm tests: a Llama target built from a config, a word-level
tokenizer built in memory, and an EAGLE head (random, or briefly trained on the target's own
greedy outputs so that trees actually get accepted)."""
from __future__ import annotations

import time

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from app.engine.engine import Engine
from app.engine.heads.eagle import DraftHead, head_config_for
from app.engine.heads.medusa import MedusaHeads
from app.engine.loading import Target
from app.train.medusa import medusa_loss

VOCAB = 256
EOS = 2
E2E_VOCAB = 16        # the end-to-end sampling tests' target (conftest.peaked): every joint of two tokens can be enumerated


def tiny_tokenizer(vocab: int = VOCAB) -> PreTrainedTokenizerFast:
    words = {"<unk>": 0, "<s>": 1, "</s>": 2}
    words.update({f"w{i}": i for i in range(3, vocab)})
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def tiny_target(seed: int = 0, vocab: int = VOCAB, hidden: int = 64, layers: int = 2,
                eos: int | None = EOS, peaky: float = 4.0, attn_scale: float = 0.3) -> Target:
    """A random Llama. ``peaky`` scales the LM head so the distributions are far from
    uniform (a random model otherwise has near-ties everywhere, which tests nothing);
    ``attn_scale`` damps attention so the next token depends mostly on the current one,
    which a one-layer head can learn in seconds (attention still matters: the tree-mask
    tests compare logits exactly)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, bos_token_id=1, eos_token_id=eos,
                      pad_token_id=0, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(peaky)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(attn_scale)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 0
    model.requires_grad_(False)
    return Target(model=model, tokenizer=tiny_tokenizer(vocab), name=f"tiny-{seed}",
                  device=torch.device("cpu"), dtype=torch.float32)


def random_head(target: Target, seed: int = 0) -> DraftHead:
    torch.manual_seed(seed + 1000)
    return DraftHead(head_config_for(target.model.config)).eval()


def trained_head(target: Target, seed: int = 0, steps: int = 300, seqs: int = 32, length: int = 48,
                 sampled: bool = False) -> DraftHead:
    """A head fitted for a few seconds to the target's greedy continuations (EAGLE's loss:
    feature regression + cross-entropy through the frozen LM head); ``sampled``: to sampled
    continuations instead, so that it has seen the contexts a sampled run reaches."""
    g = torch.Generator().manual_seed(seed)
    model = target.model
    prompts = torch.randint(3, model.config.vocab_size, (seqs, 4), generator=g)
    with torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(prompts, max_new_tokens=length, do_sample=sampled, min_new_tokens=length,
                             **(dict(top_k=0, top_p=1.0, temperature=1.0) if sampled else {}))
        feats = model.model(out).last_hidden_state           # (S, T, H)
    head = random_head(target, seed).train()
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    tokens = out[:, 1:]                                      # x[j+1]
    inp_feats = feats[:, :-1]                                # f[j]
    targets_f = feats[:, 1:]                                 # f[j+1]
    pos = torch.arange(tokens.shape[1])[None].expand(tokens.shape[0], -1)
    for _ in range(steps):
        pred = head(model.get_input_embeddings()(tokens), inp_feats, pos, None)
        logits = model.lm_head(pred[:, :-1])
        loss = torch.nn.functional.smooth_l1_loss(pred, targets_f) + \
            torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), out[:, 2:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


def medusa_batch(target, seqs=32, length=48, seed=0):
    """The target's own greedy continuations of random prompts, with their features: the
    self-distilled data Medusa heads train on (batch keys as app.train's collate makes them)."""
    g = torch.Generator().manual_seed(seed)
    model = target.model
    prompts = torch.randint(3, model.config.vocab_size, (seqs, 4), generator=g)
    with torch.no_grad():
        tokens = model.generate(prompts, max_new_tokens=length, do_sample=False, min_new_tokens=length)
        feats = model.model(tokens).last_hidden_state                                     # (S, T, H)
    return {"tokens": tokens, "features": feats, "lengths": torch.full((seqs,), tokens.shape[1]),
            "prompt_lens": torch.full((seqs,), 4)}


def trained_medusa(target, heads=3, steps=150, seed=0):
    medusa = MedusaHeads.from_target(target.model, heads)
    batch = medusa_batch(target, seed=seed)
    opt = torch.optim.AdamW(medusa.parameters(), lr=3e-3)
    for _ in range(steps):
        loss, _ = medusa_loss(medusa, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return medusa.eval()


def eagle3_target(seed: int = 0) -> Target:
    """A tiny target deep enough for EAGLE-3's low/mid/high layers (2, L/2, L-3 = 2, 4, 5 of 8)."""
    return tiny_target(seed, layers=8)


def random_eagle3_head(target: Target, seed: int = 0, draft_vocab: torch.Tensor | None = None):
    """A random EAGLE-3 head over ``draft_vocab`` (default: tokens 3..199, so that drafts
    outside the set can be checked for)."""
    from app.engine.heads.eagle3 import Eagle3Head, default_target_layers, eagle3_config_for

    ids = torch.arange(3, 200) if draft_vocab is None else draft_vocab
    torch.manual_seed(seed + 2000)
    cfg = target.model.config
    head = Eagle3Head(eagle3_config_for(cfg, ids.numel()), default_target_layers(cfg.num_hidden_layers))
    head.set_draft_vocab(ids)
    return head.eval()


def trained_eagle3_head(target: Target, seed: int = 0, steps: int = 100, seqs: int = 16, length: int = 40):
    """A random EAGLE-3 head fitted for a few seconds to the target's greedy continuations
    with the training-time-test loss of app/train/eagle3.py (3 unrolled steps)."""
    from app.train.eagle3 import Eagle3LossConfig, eagle3_loss
    from app.train.loss import SubsetLMHead

    head = random_eagle3_head(target, seed).train()
    g = torch.Generator().manual_seed(seed)
    model = target.model
    prompts = torch.randint(3, model.config.vocab_size, (seqs, 4), generator=g)
    with torch.no_grad():
        out = model.generate(prompts, max_new_tokens=length, do_sample=False, min_new_tokens=length)
        hs = model.model(out, output_hidden_states=True)
    batch = {"tokens": out, "features": hs.last_hidden_state,
             "layer_features": torch.cat([hs.hidden_states[i] for i in head.target_layers], -1),
             "lengths": torch.full((seqs,), out.shape[1]), "prompt_lens": torch.full((seqs,), 4)}
    lm_head = SubsetLMHead(model.lm_head, head.draft_token_ids())
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    for _ in range(steps):
        loss, _ = eagle3_loss(head, lm_head, model.get_input_embeddings(), batch, Eagle3LossConfig(ttt_steps=3))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


class PacedEngine(Engine):
    """The tiny engine, paced: every step waits ``pace_s`` first (0.2 s: slower than the
    embedded model on a CPU). The tiny model decodes ~100x faster than a real one, so without
    a pace a run can end before a page's first update, a click on Stop or a closed tab reaches
    it, and whether a test saw streaming, a stop or a leaving visitor would depend on the
    machine's speed and load."""

    def __init__(self, target, head, pace_s: float = 0.2):
        super().__init__(target, head)
        self.pace_s = pace_s
        self.runs = []          # per run: [steps yielded, closed early?]

    def generate(self, *args, **kwargs):
        inner = super().generate(*args, **kwargs)
        record = [0, False]
        self.runs.append(record)

        def paced():
            try:
                for event in inner:
                    time.sleep(self.pace_s)
                    record[0] += 1
                    yield event
            finally:
                record[1] = inner.gi_frame is not None   # still suspended = stopped mid-run
                inner.close()

        return paced()


class Crowded:
    """What a busy neighbour does to an engine's runs on spinning threads: after its first
    ``after`` verifies, each verify on more than one thread waits ``wait_s`` more (every
    barrier waits for a descheduled thread); on one thread it runs as before. Every verify
    first waits ``pace_s``: a step as long as a real model's, so that a loaded machine's
    hiccup of a few ms is not itself a 2.5x slower step of the tiny model (~1 ms). The wait
    is ten paces: a real neighbour (a parallel test worker) slows the tiny model's 2-thread
    steps by tens of ms, and must not lift the run's median to within 2.5x of a crowded step."""

    def __init__(self, engine, after: int = 6, wait_s: float = 0.5, pace_s: float = 0.05):
        self.engine, self.after, self.wait_s, self.pace_s, self.verifies = engine, after, wait_s, pace_s, 0
        verify = engine.verify

        def crowded_verify(run, tree):
            self.verifies += 1
            time.sleep(self.pace_s + (self.wait_s if self.verifies > self.after and torch.get_num_threads() > 1
                                      else 0.0))
            return verify(run, tree)

        engine.verify = crowded_verify
