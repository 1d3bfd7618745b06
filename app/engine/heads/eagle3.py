"""The EAGLE-3 draft head (2503.01840): fused low/mid/high target features, its own vocabulary.

EAGLE-1/2 (``eagle.DraftHead``) predict the target's last hidden state f̂[j+1] and reuse
the target's LM head. EAGLE-3 drops that feature-regression target: the head only has to make
a good *token* distribution, so it may keep whatever hidden state helps, and it reads more of
the target than the top layer:

    g[j] = fc([l[j]; m[j]; h[j]])          (B, T, 3H) -> (B, T, H)   low/mid/high target layers
    a[j] = midlayer(emb(x[j+1]), g[j])     one decoder layer whose attention reads 2H:
                                           [input_layernorm(emb) ; hidden_norm(g)],
                                           residual from g
    q    = softmax(lm_head(norm(a[j])))    over the draft vocabulary (Vd tokens) -> x[j+2]

From the second draft level on, the head is fed its *own* hidden state a in place of g (the
target's layers are unknown past the committed context); "training-time test" trains it for
exactly that (app/train/eagle3.py). l, m, h are the inputs of target layers 2, L/2 and L-3
(``default_target_layers``), captured in the same verify forward that checks the tree.

The draft vocabulary: ``lm_head`` has Vd rows; draft id i is target token ``i + d2t[i]``;
``t2d`` (V,) bool marks the target tokens that have a draft id.

Checkpoint layout (that of the published EAGLE-3 heads, so they load unchanged):
    config.json        a LlamaConfig (num_hidden_layers 1) with ``draft_vocab_size``
    model.safetensors  or pytorch_model.bin: fc.weight, midlayer.{hidden_norm, input_layernorm,
                       self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj},
                       norm.weight, lm_head.weight, d2t, t2d (embed_tokens comes from the target;
                       a checkpoint that carries its own is used as is)
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (LlamaAttention, LlamaMLP, LlamaRMSNorm,
                                                      LlamaRotaryEmbedding)

from app.engine.heads.checkpoint import check_keys, config_for_disk, config_from_disk, write_checkpoint
from app.engine.heads.eagle import DraftHead, head_config_for

ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_target_layers(num_layers: int) -> tuple[int, int, int]:
    """The reference's low/mid/high choice: the inputs of layers 2, L//2 and L-3 of L
    (for SmolLM2-135M's 30 layers: 2, 15, 27)."""
    layers = (2, num_layers // 2, num_layers - 3)
    if not layers[0] < layers[1] < layers[2]:
        raise ValueError(f"a target with {num_layers} layers has no distinct low/mid/high layers "
                         f"(2, L/2, L-3 = {layers}); give eagle_config.eagle_aux_hidden_state_layer_ids")
    return layers


def target_layers_from(config: dict, num_layers: int) -> tuple[int, ...]:
    """The layers a head reads: its config's ``eagle_config.eagle_aux_hidden_state_layer_ids``
    (as serving engines write it) if present, else ``default_target_layers``."""
    given = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    layers = tuple(int(i) for i in given) if given else default_target_layers(num_layers)
    if len(layers) != 3 or not all(0 <= i < num_layers for i in layers):
        raise ValueError(f"EAGLE-3 reads three target layers in [0, {num_layers}), config gives {list(layers)}")
    return layers


def eagle3_config_for(target_config, draft_vocab_size: int) -> LlamaConfig:
    """A one-layer head config shaped like a decoder layer of the target."""
    config = head_config_for(target_config, bias=False)
    del config.bias
    config.draft_vocab_size = int(draft_vocab_size)
    config.architectures = [ARCHITECTURE]
    return config


class Eagle3Layer(nn.Module):
    """transformers' Llama attention and MLP, with q/k/v reading [emb ; hidden] (2H wide)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.hidden_norm = LlamaRMSNorm(hidden, eps=eps)
        self.input_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.self_attn = LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(2 * hidden, old.out_features, bias=old.bias is not None))
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.mlp = LlamaMLP(config)

    def forward(self, token_embeds, hidden, attention_mask, position_embeddings, cache=None):
        residual = hidden                                                          # (B, T, H)
        x = torch.cat((self.input_layernorm(token_embeds), self.hidden_norm(hidden)), dim=-1)   # (B, T, 2H)
        attn, _ = self.self_attn(x, position_embeddings=position_embeddings, attention_mask=attention_mask,
                                 cache=cache)
        hidden = residual + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden))          # (B, T, H)


class Eagle3Head(nn.Module):
    kind = "eagle3"   # the step records' drafter

    def __init__(self, config: LlamaConfig, target_layers: tuple[int, ...], with_embeddings: bool = False):
        super().__init__()
        config._attn_implementation = "sdpa"
        self.config = config
        hidden = config.hidden_size
        self.target_layers = tuple(target_layers)          # which target layers' inputs g fuses
        self.fc = nn.Linear(len(self.target_layers) * hidden, hidden, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))   # (Vd,)
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))         # (V,)
        self.rotary_emb = LlamaRotaryEmbedding(config)     # its buffers are not saved
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if with_embeddings else None

    # --- the draft vocabulary --------------------------------------------------------------

    def set_draft_vocab(self, token_ids: torch.Tensor) -> None:
        """Fill d2t/t2d from the (Vd,) sorted target ids the head drafts over."""
        ids = token_ids.to(self.d2t.device, torch.long)
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_token_ids(self) -> torch.Tensor:
        """(Vd,) the target token of each draft id: i + d2t[i] (the engine's ``draft_vocab``)."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    # --- forward ----------------------------------------------------------------------------

    embed = DraftHead.embed   # token embeddings: the head's own if the checkpoint has them, else the target's

    def forward(
        self,
        token_embeds: torch.Tensor,     # (B, T, H) embeddings of x[j+1]
        hidden: torch.Tensor,           # (B, T, 3H) the target's fused layers, or (B, T, H) the head's own a
        position_ids: torch.Tensor,     # (B, T)
        attention_mask: torch.Tensor | None,  # (B, 1, T, S) bool, True = may attend; None = causal
        cache=None,                     # a transformers Cache with one layer, or None (training)
    ) -> torch.Tensor:                  # (B, T, H) a[j], fed back at the next level; logits() reads it
        if hidden.shape[-1] == self.fc.in_features:
            hidden = self.fc(hidden)                    # target features -> g
        elif hidden.shape[-1] != self.config.hidden_size:
            raise ValueError(f"EAGLE-3 head reads {self.fc.in_features} (target) or {self.config.hidden_size} "
                             f"(its own) features, got {hidden.shape[-1]}")
        position_embeddings = self.rotary_emb(hidden, position_ids=position_ids)
        return self.midlayer(token_embeds, hidden, attention_mask, position_embeddings, cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) head states -> (..., Vd) draft logits."""
        return self.lm_head(self.norm(hidden))

    # --- checkpoint I/O in the official layout -----------------------------------------------

    def save(self, folder: str | Path, dtype: torch.dtype | None = None) -> None:
        """Write the checkpoint; ``dtype`` casts the weights (bf16 halves a shipped head's bytes;
        d2t / t2d keep their integer and bool types)."""
        config = config_for_disk(self.config)
        config.pop("bias", None)
        config["architectures"] = [ARCHITECTURE]
        config["draft_vocab_size"] = int(self.config.draft_vocab_size)
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.target_layers)}
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        write_checkpoint(Path(folder), config, state, dtype)

    @classmethod
    def from_checkpoint(cls, folder: Path, raw: dict, state: dict[str, torch.Tensor],
                        target_num_layers: int) -> "Eagle3Head":
        """Strict: every key of ``state`` is one of the head's and every one of the head's is
        there, with its shape; d2t and t2d must describe the same Vd distinct target tokens."""
        if "draft_vocab_size" not in raw:
            raise ValueError(f"EAGLE-3 head {folder}: config.json has no draft_vocab_size")
        if raw.get("num_hidden_layers", 1) != 1:
            raise ValueError(f"EAGLE-3 head {folder}: num_hidden_layers must be 1, config says "
                             f"{raw['num_hidden_layers']}")
        config = config_from_disk(folder, raw)
        target_hidden = raw.get("target_hidden_size", config.hidden_size)
        if target_hidden != config.hidden_size:
            raise ValueError(f"EAGLE-3 head {folder} reads a target of hidden size {target_hidden} into "
                             f"{config.hidden_size}: EAGLE Lens runs heads as wide as their target")
        head = cls(config, target_layers_from(raw, target_num_layers),
                   with_embeddings="embed_tokens.weight" in state)
        check_keys(folder, head, state)
        head.load_state_dict(state, strict=True)
        ids = head.draft_token_ids()
        V = config.vocab_size
        if not bool(((ids >= 0) & (ids < V)).all()) or ids.unique().numel() != ids.numel() \
                or int(head.t2d.sum()) != ids.numel() or not bool(head.t2d[ids.clamp(0, V - 1)].all()):
            raise ValueError(f"EAGLE-3 head {folder}: d2t and t2d do not describe the same "
                             f"{ids.numel()} distinct target tokens")
        return head
