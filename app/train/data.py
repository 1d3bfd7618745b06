"""Self-distilled responses and their target features, stored in resumable shards.

Stage *data*: the target answers each training prompt through its own chat template, 64
prompts per batch with left padding, and the same forwards give the features EAGLE needs:
the last hidden state after the final norm, ``f = model.model(ids).last_hidden_state``, of
every token it is fed (prompt at prefill, then each response token as it is fed back). One
pass instead of generate-then-extract; the hand-written decode loop also lets sampling use
our own seeded ``torch.Generator``. Shards alternate between greedy decoding and sampling at
temperature 0.7 and 1.0, so the head sees both the target's argmax paths (greedy serving)
and its broader distribution (sampled serving).

The target runs in bfloat16 where the CPU has native bfloat16 (faster than float32;
benchmarks/engine-notes.md), and its rounding is far below the noise the training adds to
the input features. Features are stored as float16 (half the bytes) with the token ids.

Every shard is written to a temporary name and renamed when complete, so an interrupted
run leaves only whole shards behind and the next run continues with the missing ones.

Layout under ``work_dir`` (outside git, by default ``cache_dir()/train/<model>``)::

    prompts.jsonl                 the prompt set (stage prompts)
    features/shard_00012.safetensors      (metadata: "mode", e.g. "sampled@0.7")
        tokens    (N,)  int32    all conversations of the shard, concatenated
        features  (N,H) float16  f[j] for every token
        offsets   (S+1,) int64   conversation s is tokens[offsets[s]:offsets[s+1]]
        prompt_lens (S,) int64   its first prompt_lens[s] tokens are the prompt
        layer_features (N,3H) float16  only with ``layers`` (metadata "layers", e.g. "2,15,27"):
                                 the inputs of those target layers at every token, what an
                                 EAGLE-3 head reads (``python -m app train --arch eagle3``)
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from app.engine.fused import layer_inputs
from app.engine.kv import preallocated_cache
from app.train.prompts import Prompt

# The decoding mode of shard i is MODES[i % len(MODES)]: half greedy, half sampled.
MODES = [("greedy", 0.0), ("sampled", 0.7), ("greedy", 0.0), ("sampled", 1.0)]

# Drop finished answers from the batch once this share of its rows has ended (each drop copies
# the KV cache once).
COMPACT_FRACTION = 0.125


def shard_name(index: int) -> str:
    return f"shard_{index:05d}"


def shard_index(name: str) -> int:
    """``shard_name``'s inverse, for any file of the shard: "shard_00012.safetensors" -> 12."""
    return int(Path(name).name.split(".")[0].rsplit("_", 1)[1])


def chat_ids(tokenizer, text: str) -> list[int]:
    """The prompt exactly as the engine encodes it (one user turn, generation prompt added)."""
    if getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    else:
        ids = tokenizer(text)["input_ids"]
    return [int(t) for t in ids]


def left_pad(seqs: list[list[int]], pad_id: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both (B, P) on ``device``: sequences right-aligned so that every row ends at
    column P-1."""
    width = max(len(e) for e in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long, device="cpu")
    mask = torch.zeros((len(seqs), width), dtype=torch.long, device="cpu")
    for i, e in enumerate(seqs):
        ids[i, width - len(e):] = torch.tensor(e, device="cpu")
        mask[i, width - len(e):] = 1
    return ids.to(device), mask.to(device)


# --- the decode loop ------------------------------------------------------------------------

@torch.no_grad()
def generate_with_features(model, tokenizer, prompts: list[Prompt], shard: int, max_new_tokens: int,
                           seed: int, eos_ids: set[int], pad_id: int, layers: tuple[int, ...] = ()) -> "FeatureShard":
    """Answer one shard of prompts in one left-padded batch and keep the target's features.

    A hand-written decode loop rather than ``model.generate``: every forward already computes
    the last hidden state f of the tokens it is fed, so recording it here gives the features
    for free (no second pass over the conversations), and sampling can use our own seeded
    ``torch.Generator``. Positions follow the mask (``cumsum - 1``), as in ``generate``.

    Two things keep the batch cheap: the KV cache is a preallocated buffer written in place
    (``kv.PreallocatedLayer``), and answers that have ended leave the batch. Together they took
    one shard (64 prompts, 11.6k response tokens, bf16, 2 threads) from 110 to 154 tokens/s.
    Until enough answers have ended to pay for the one copy of the cache that dropping them
    costs, finished rows are fed masked pads, as ``generate`` does.

    Returns a FeatureShard whose conversation s is prompt + response (response up to and
    including its first EOS, or ``max_new_tokens - 1`` tokens: the last sampled token is never
    fed back, so it has no feature and is dropped). With ``layers`` (EAGLE-3's low/mid/high
    target layers) the same forwards also record those layers' inputs.
    """
    mode, temperature = MODES[shard % len(MODES)]
    lm_head = model.get_output_embeddings()
    device = lm_head.weight.device                               # everything below lives where the model is
    g = torch.Generator(device=device).manual_seed(seed * 100_003 + shard)
    body = getattr(model, model.base_model_prefix)               # decoder stack + final norm
    encoded = [chat_ids(tokenizer, p.text) for p in prompts]
    ids, mask = left_pad(encoded, pad_id, device)                # (B, P)
    B, P = ids.shape
    width = P + max_new_tokens - 1                               # every column a row can reach
    cache = preallocated_cache(model, width)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)              # (B, P)
    out = body(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
               use_cache=True, output_hidden_states=bool(layers))
    prefill = out.last_hidden_state                              # (B, P, H)
    all_feats = prefill.new_zeros(B, width, prefill.shape[-1])   # (B, width, H) f of every fed token
    all_feats[:, :P] = prefill
    all_layers = None
    if layers:                                                   # (B, width, 3H) EAGLE-3's layer inputs
        all_layers = prefill.new_zeros(B, width, len(layers) * prefill.shape[-1])
        all_layers[:, :P] = layer_inputs(out.hidden_states, layers)
    all_ids = torch.full((B, width), pad_id, dtype=torch.long, device=device)   # (B, width) every fed token
    all_ids[:, :P] = ids
    last = prefill[:, -1]                                        # (b, H), b = rows still in the batch
    rows = torch.arange(B, device=device)                        # (b,) original row of each batch row
    done = torch.zeros(B, dtype=torch.bool, device=device)       # (b,) answer ended (EOS fed)
    lengths = torch.full((B,), max_new_tokens - 1, dtype=torch.long, device=device)  # response tokens kept
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
    for step in range(max_new_tokens - 1):
        logits = lm_head(last).float()                           # (b, V) next-token logits
        if mode == "greedy":
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g)[:, 0]
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)           # (b,)
        just_ended = ~done & torch.isin(nxt, eos)
        lengths[rows[just_ended]] = step + 1                     # keep the EOS itself
        mask = torch.cat([mask, (~done).long()[:, None]], 1)     # finished rows feed masked pads
        positions = positions[:, -1:] + 1
        out = body(input_ids=nxt[:, None], attention_mask=mask, position_ids=positions,
                   cache=cache, use_cache=True, output_hidden_states=bool(layers))
        h = out.last_hidden_state                                # (b, 1, H)
        all_feats[rows, P + step] = h[:, 0]
        if layers:
            all_layers[rows, P + step] = layer_inputs(out.hidden_states, layers)[:, 0]
        all_ids[rows, P + step] = nxt
        last = h[:, 0]
        done |= just_ended
        n_done = int(done.sum())
        if n_done == done.numel():
            break
        if n_done >= max(1, int(COMPACT_FRACTION * done.numel())):
            keep = (~done).nonzero()[:, 0]                       # drop finished rows: one copy
            cache.batch_select_indices(keep)
            mask, positions, last = mask[keep], positions[keep], last[keep]
            rows, done = rows[keep], done[keep]
    tokens, features, lens, layer_feats = [], [], [], []
    kept = lengths.tolist()                                      # one transfer from the device
    for i, e in enumerate(encoded):
        a = P - len(e)                                           # first real prompt column
        b = P + kept[i]
        tokens.append(all_ids[i, a:b].cpu())
        features.append(all_feats[i, a:b].to("cpu", torch.float16))
        if layers:
            layer_feats.append(all_layers[i, a:b].to("cpu", torch.float16))
        lens.append(b - a)
    offsets = torch.zeros(B + 1, dtype=torch.long, device="cpu")
    offsets[1:] = torch.cumsum(torch.tensor(lens, device="cpu"), 0)
    return FeatureShard(tokens=torch.cat(tokens).to(torch.int32), features=torch.cat(features),
                        offsets=offsets, prompt_lens=torch.tensor([len(e) for e in encoded], device="cpu"),
                        mode=f"{mode}@{temperature}",
                        layer_features=torch.cat(layer_feats) if layers else None, layers=tuple(layers))


# --- the feature store ---------------------------------------------------------------------

@dataclass
class FeatureShard:
    """One shard of conversations with their target features (see the module doc)."""

    tokens: torch.Tensor        # (N,) int32
    features: torch.Tensor      # (N, H) float16
    offsets: torch.Tensor       # (S+1,) int64
    prompt_lens: torch.Tensor   # (S,) int64
    mode: str = ""              # how the responses were decoded, e.g. "sampled@0.7"
    layer_features: torch.Tensor | None = None   # (N, k·H) float16: inputs of target ``layers``
    layers: tuple[int, ...] = ()                  # which target layers (EAGLE-3), () if none

    def __len__(self) -> int:
        return int(self.offsets.numel() - 1)

    def conversation(self, s: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(tokens (T,) int64, features (T, H) float32, prompt length) of conversation s."""
        a, b = int(self.offsets[s]), int(self.offsets[s + 1])
        return self.tokens[a:b].long(), self.features[a:b].float(), int(self.prompt_lens[s])

    def layer_rows(self, s: int) -> torch.Tensor:
        """(T, k·H) float32: the stored target-layer inputs of conversation s."""
        if self.layer_features is None:
            raise ValueError("this shard has no target-layer features: make EAGLE-3 data with "
                             "`python -m app train --stage data --arch eagle3` (in a new --work-dir)")
        a, b = int(self.offsets[s]), int(self.offsets[s + 1])
        return self.layer_features[a:b].float()

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tensors = {"tokens": self.tokens.contiguous(), "features": self.features.contiguous(),
                   "offsets": self.offsets.contiguous(), "prompt_lens": self.prompt_lens.contiguous()}
        metadata = {"mode": self.mode}
        if self.layer_features is not None:
            tensors["layer_features"] = self.layer_features.contiguous()
            metadata["layers"] = ",".join(str(i) for i in self.layers)
        save_file(tensors, str(tmp), metadata=metadata)
        tmp.rename(path)

    @classmethod
    def load(cls, path: Path, layer_features: bool = True) -> "FeatureShard":
        """The shard at ``path``; ``layer_features=False`` leaves EAGLE-3's stored layer inputs
        on disk (3/4 of such a shard, which an EAGLE-2 or Medusa head never reads)."""
        with safe_open(str(path), framework="pt") as f:
            d = {k: f.get_tensor(k) for k in f.keys() if layer_features or k != "layer_features"}
            meta = f.metadata() or {}
        layers = tuple(int(i) for i in meta["layers"].split(",")) if meta.get("layers") else ()
        return cls(tokens=d["tokens"], features=d["features"], offsets=d["offsets"],
                   prompt_lens=d["prompt_lens"], mode=meta.get("mode", ""),
                   layer_features=d.get("layer_features"), layers=layers)


def log(msg: str) -> None:
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)
