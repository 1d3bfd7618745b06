"""The EAGLE-1/2 draft head: a one-layer transformer that drafts at the *feature* level.

EAGLE's observation (2401.15077): the target's last hidden state ("feature") is far easier to
extrapolate than its tokens. The head reads, at each position j, the target's feature f[j]
and the embedding of the token that followed it, x[j+1], and predicts f[j+1]; the target's
own LM head turns that predicted feature into the draft distribution q over x[j+2]:

    f[j]       (B, T, H)  ┐
    emb(x[j+1])(B, T, H)  ┴─ cat ─► fc (2H→H) ─► Llama decoder layer ─► f̂[j+1] ─► target lm_head ─► q

The decoder layer is transformers' own ``LlamaDecoderLayer`` with its input RMSNorm removed
(the published EAGLE heads have none: ``fc`` feeds attention directly). Embedding and LM
head are the target's, passed in at call time, so they are never saved with the head unless
a published checkpoint carries its own ``embed_tokens``.

Checkpoint layout (that of the official EAGLE heads, so they load unchanged):
    config.json         a LlamaConfig with num_hidden_layers = 1 and a ``bias`` flag for fc
    model.safetensors   or pytorch_model.bin, with exactly the keys of ``expected_keys``

``app.engine.heads.load_head`` reads a checkpoint of either kind: this one, or an EAGLE-3 head
(``eagle3.py``), told apart by its keys (``midlayer.*``, ``d2t``/``t2d``) or its architecture
name (``checkpoint.is_eagle3``). ``head_config_for`` and ``DraftHead.embed`` are EAGLE-3's too.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from app.engine.heads.checkpoint import check_keys, config_for_disk, config_from_disk, is_eagle3, read_config, \
    read_state_dict, write_checkpoint

# Buffers that some published heads saved although they are derived from the config; they
# are recomputed here, so a checkpoint may carry them. Anything else unexpected is an error.
_DERIVED_KEYS = ("layers.0.self_attn.rotary_emb.inv_freq",)

# Fields of the target's config that the head must share to read its features and positions.
_SHARED_FIELDS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "head_dim", "rms_norm_eps", "max_position_embeddings", "vocab_size", "hidden_act",
    "rope_parameters", "bos_token_id", "eos_token_id", "pad_token_id",
)


def head_config_for(target_config, bias: bool = True) -> LlamaConfig:
    """A draft-head config shaped like one decoder layer of the target."""
    fields = {k: getattr(target_config, k) for k in _SHARED_FIELDS if hasattr(target_config, k)}
    config = LlamaConfig(**fields, num_hidden_layers=1, attention_bias=False, mlp_bias=False)
    config.bias = bias
    config.architectures = ["LlamaForCausalLM"]
    return config


class DraftHead(nn.Module):
    def __init__(self, config: LlamaConfig, with_embeddings: bool = False):
        super().__init__()
        if getattr(config, "num_hidden_layers", 1) != 1:
            raise ValueError(f"an EAGLE-1/2 head has num_hidden_layers 1, config says {config.num_hidden_layers}")
        config._attn_implementation = "sdpa"
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=bool(getattr(config, "bias", True)))
        layer = LlamaDecoderLayer(config, layer_idx=0)
        layer.input_layernorm = nn.Identity()  # EAGLE heads have no input norm (see module doc)
        self.layers = nn.ModuleList([layer])
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if with_embeddings else None

    def expected_keys(self) -> set[str]:
        return set(self.state_dict().keys())

    def embed(self, token_ids: torch.Tensor, target_embedding: nn.Module) -> torch.Tensor:
        """Token embeddings: the head's own if the checkpoint has them, else the target's."""
        table = self.embed_tokens if self.embed_tokens is not None else target_embedding
        return table(token_ids)

    def forward(
        self,
        token_embeds: torch.Tensor,     # (B, T, H) embeddings of x[j+1]
        features: torch.Tensor,         # (B, T, H) target (or predicted) features f[j]
        position_ids: torch.Tensor,     # (B, T)
        attention_mask: torch.Tensor | None,  # (B, 1, T, S) bool, True = may attend; None = causal
        cache=None,                     # a transformers Cache with one layer, or None (training)
    ) -> torch.Tensor:                  # (B, T, H) predicted features f̂[j+1]
        x = self.fc(torch.cat((token_embeds, features), dim=-1))
        position_embeddings = self.rotary_emb(x, position_ids=position_ids)
        return self.layers[0](
            x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=cache is not None,
            position_embeddings=position_embeddings,
        )

    # --- checkpoint I/O in the official layout ---------------------------------------------

    def save(self, folder: str | Path, dtype: torch.dtype | None = None) -> None:
        """Write the checkpoint in the official layout; ``dtype`` casts the weights (bfloat16
        halves a shipped head's bytes; the loader casts them back to float32)."""
        config = config_for_disk(self.config)
        config["num_hidden_layers"] = 1
        config["bias"] = bool(getattr(self.config, "bias", True))
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}   # from any device
        write_checkpoint(Path(folder), config, state, dtype)

    @classmethod
    def load(cls, folder: str | Path, dtype: torch.dtype = torch.float32,
             device: str | torch.device = "cpu") -> "DraftHead":
        """Strict load of an EAGLE-1/2 head: every expected key must be present and no other
        key may be. (``heads.load_head`` loads either kind.)"""
        folder = Path(folder)
        raw = read_config(folder)
        state = read_state_dict(folder)
        if is_eagle3(raw, state):
            raise ValueError(f"draft head {folder} is an EAGLE-3 head (midlayer, d2t/t2d): load it with "
                             "app.engine.heads.load_head or app.engine.loading.load_draft_head")
        return cls.from_checkpoint(folder, raw, state).to(device=device, dtype=dtype).eval()

    @classmethod
    def from_checkpoint(cls, folder: Path, raw: dict, state: dict[str, torch.Tensor]) -> "DraftHead":
        config = config_from_disk(folder, raw)
        config.bias = bool(raw.get("bias", True))
        head = cls(config, with_embeddings="embed_tokens.weight" in state)
        for key in _DERIVED_KEYS:
            state.pop(key, None)
        check_keys(folder, head, state)
        head.load_state_dict(state, strict=True)
        return head
