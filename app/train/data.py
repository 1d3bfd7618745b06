"""Self-distilled responses and their target features, stored in resumable shards.

Stage *data*: the target answers each training prompt through its own chat template, 64
prompts per batch with left padding, and the same forwards give the features EAGLE needs:
the last hidden state after the final norm, ``f = model.model(ids).last_hidden_state``, of
every token it is fed (prompt at prefill, then each response token as it is fed back). One
pass instead of generate-then-extract; the hand-written decode loop also lets sampling use
our own seeded ``torch.Generator``. Shards alternate between greedy decoding and sampling at
temperature 0.7 and 1.0, so the head sees both the target's argmax paths (greedy serving)
and its broader distribution (sampled serving).

The target runs in bfloat16 here: on this CPU (AMX) a bf16 decode step is ~1.8x faster than
float32, and the rounding (~0.4 %) is far below the noise the training adds to the input
features. Features are stored as float16 (half the bytes) with the token ids.

Every shard is written to a temporary name and renamed when complete, so an interrupted
run leaves only whole shards behind and the next run continues with the missing ones.

Layout under ``work_dir`` (outside git, by default ``cache_dir()/train/<model>``)::

    prompts.jsonl                 the prompt set (stage prompts)
    features/shard_00012.safetensors      (metadata: "mode", e.g. "sampled@0.7")
        tokens    (N,)  int32    all conversations of the shard, concatenated
        features  (N,H) float16  f[j] for every token
        offsets   (S+1,) int64   conversation s is tokens[offsets[s]:offsets[s+1]]
        prompt_lens (S,) int64   its first prompt_lens[s] tokens are the prompt
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from app.train.prompts import Prompt

# The decoding mode of shard i is MODES[i % len(MODES)]: half greedy, half sampled.
MODES = [("greedy", 0.0), ("sampled", 0.7), ("greedy", 0.0), ("sampled", 1.0)]


def shard_name(index: int) -> str:
    return f"shard_{index:05d}"


def chat_ids(tokenizer, text: str) -> list[int]:
    """The prompt exactly as the engine encodes it (one user turn, generation prompt added)."""
    if getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    else:
        ids = tokenizer(text)["input_ids"]
    return [int(t) for t in ids]


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both (B, P): sequences right-aligned so that every row ends at column P-1."""
    width = max(len(e) for e in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, e in enumerate(seqs):
        ids[i, width - len(e):] = torch.tensor(e)
        mask[i, width - len(e):] = 1
    return ids, mask


@torch.no_grad()
def generate_with_features(model, tokenizer, prompts: list[Prompt], shard: int, max_new_tokens: int,
                           seed: int, eos_ids: set[int], pad_id: int) -> "FeatureShard":
    """Answer one shard of prompts in one left-padded batch and keep the target's features.

    A hand-written decode loop rather than ``model.generate``: every forward already computes
    the last hidden state f of the tokens it is fed, so recording it here gives the features
    for free (no second pass over the conversations), and sampling can use our own seeded
    ``torch.Generator``. Positions follow the mask (``cumsum - 1``), as in ``generate``.

    Returns a FeatureShard whose conversation s is prompt + response (response up to and
    including its first EOS, or ``max_new_tokens - 1`` tokens: the last sampled token is never
    fed back, so it has no feature and is dropped).
    """
    from transformers import DynamicCache

    mode, temperature = MODES[shard % len(MODES)]
    g = torch.Generator().manual_seed(seed * 100_003 + shard)
    body = getattr(model, model.base_model_prefix)               # decoder stack + final norm
    lm_head = model.get_output_embeddings()
    encoded = [chat_ids(tokenizer, p.text) for p in prompts]
    ids, mask = left_pad(encoded, pad_id)                        # (B, P)
    B, P = ids.shape
    cache = DynamicCache(config=model.config)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)              # (B, P)
    feats = [body(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                  use_cache=True).last_hidden_state]             # [(B, P, H)]
    fed = [ids]                                                  # tokens whose features we hold
    done = torch.zeros(B, dtype=torch.bool)
    lengths = torch.full((B,), max_new_tokens - 1, dtype=torch.long)  # response tokens kept
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long)
    for step in range(max_new_tokens - 1):
        logits = lm_head(feats[-1][:, -1]).float()               # (B, V) next-token logits
        if mode == "greedy":
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g)[:, 0]
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)           # (B,)
        just_ended = ~done & torch.isin(nxt, eos)
        lengths[just_ended] = step + 1                           # keep the EOS itself
        mask = torch.cat([mask, (~done).long()[:, None]], 1)     # finished rows feed masked pads
        positions = positions[:, -1:] + 1
        feats.append(body(input_ids=nxt[:, None], attention_mask=mask, position_ids=positions,
                          cache=cache, use_cache=True).last_hidden_state)  # (B, 1, H)
        fed.append(nxt[:, None])
        done |= just_ended
        if bool(done.all()):
            break
    all_ids = torch.cat(fed, 1)                                  # (B, P + steps)
    all_feats = torch.cat(feats, 1)                              # (B, P + steps, H)
    tokens, features, lens = [], [], []
    for i, e in enumerate(encoded):
        a = P - len(e)                                           # first real prompt column
        b = P + int(lengths[i])
        tokens.append(all_ids[i, a:b])
        features.append(all_feats[i, a:b].to(torch.float16))
        lens.append(b - a)
    offsets = torch.zeros(B + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(torch.tensor(lens), 0)
    return FeatureShard(tokens=torch.cat(tokens).to(torch.int32), features=torch.cat(features),
                        offsets=offsets, prompt_lens=torch.tensor([len(e) for e in encoded]),
                        mode=f"{mode}@{temperature}")


# --- the feature store ---------------------------------------------------------------------

@dataclass
class FeatureShard:
    """One shard of conversations with their target features (see the module doc)."""

    tokens: torch.Tensor        # (N,) int32
    features: torch.Tensor      # (N, H) float16
    offsets: torch.Tensor       # (S+1,) int64
    prompt_lens: torch.Tensor   # (S,) int64
    mode: str = ""              # how the responses were decoded, e.g. "sampled@0.7"

    def __len__(self) -> int:
        return int(self.offsets.numel() - 1)

    def conversation(self, s: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(tokens (T,) int64, features (T, H) float32, prompt length) of conversation s."""
        a, b = int(self.offsets[s]), int(self.offsets[s + 1])
        return self.tokens[a:b].long(), self.features[a:b].float(), int(self.prompt_lens[s])

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        save_file({"tokens": self.tokens.contiguous(), "features": self.features.contiguous(),
                   "offsets": self.offsets.contiguous(), "prompt_lens": self.prompt_lens.contiguous()},
                  str(tmp), metadata={"mode": self.mode})
        tmp.rename(path)

    @classmethod
    def load(cls, path: Path) -> "FeatureShard":
        with safe_open(str(path), framework="pt") as f:
            d = {k: f.get_tensor(k) for k in f.keys()}
            mode = (f.metadata() or {}).get("mode", "")
        return cls(tokens=d["tokens"], features=d["features"], offsets=d["offsets"],
                   prompt_lens=d["prompt_lens"], mode=mode)


def log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)
