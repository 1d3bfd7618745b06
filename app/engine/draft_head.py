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
(app/engine/eagle3_head.py), told apart by its keys (``midlayer.*``, ``d2t``/``t2d``) or its
architecture name.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

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

    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = config_for_disk(self.config)
        config["num_hidden_layers"] = 1
        config["bias"] = bool(getattr(self.config, "bias", True))
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}   # from any device
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})

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


# --- shared by both kinds of head ----------------------------------------------------------

def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"draft head folder {folder} has no config.json")
    return json.loads(path.read_text())


def config_for_disk(config: LlamaConfig) -> dict:
    """The head's config.json: transformers' own dict plus the top-level RoPE fields that
    readers older than transformers 5 look for. transformers 5 keeps the RoPE base only in
    ``rope_parameters``; an older reader (the EAGLE reference code among them) then finds no
    ``rope_theta`` and silently falls back to base 10,000, a different position encoding
    from the one the head was trained with (SmolLM2's base is 100,000)."""
    out = config.to_dict()
    out.pop("_attn_implementation_autoset", None)
    rope = dict(out.get("rope_parameters") or {})
    if "rope_theta" in rope:
        out["rope_theta"] = rope["rope_theta"]
        kind = rope.get("rope_type", "default")
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        out["rope_scaling"] = None if kind == "default" else {**scaling, "type": kind}
    return out


def config_from_disk(folder: Path, raw: dict) -> LlamaConfig:
    """A LlamaConfig from config.json. A top-level ``rope_theta`` (older readers' field) must
    agree with ``rope_parameters`` when both are given: transformers 5 would silently keep
    the latter."""
    config = LlamaConfig.from_dict(raw)
    top, nested = raw.get("rope_theta"), (raw.get("rope_parameters") or {}).get("rope_theta")
    if top is not None and nested is not None and float(top) != float(nested):
        raise ValueError(f"draft head {folder}: config.json has rope_theta {top} but rope_parameters "
                         f"says {nested}")
    return config


def check_keys(folder: Path, head: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Every key the head has is in ``state`` with its shape, and no other key is."""
    own = head.state_dict()
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys {missing}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected}")
        kind = "EAGLE-3" if getattr(head, "kind", "eagle2") == "eagle3" else "EAGLE"
        raise KeyError(f"draft head checkpoint in {folder} does not match the {kind} layout: " + "; ".join(parts))
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[key].shape):
            raise ValueError(f"draft head key {key} has shape {tuple(tensor.shape)}, "
                             f"config expects {tuple(own[key].shape)}")


def is_eagle3(config: dict, state: dict) -> bool:
    """An EAGLE-3 checkpoint (2503.01840's layout): its architecture name, the draft-to-target
    vocabulary maps or the two-input decoder layer ``midlayer``."""
    named = any("eagle3" in str(a).lower() for a in config.get("architectures") or [])
    return named or "d2t" in state or "t2d" in state or any(k.startswith("midlayer.") for k in state)


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Read model.safetensors, or pytorch_model.bin with weights_only=True (no code is unpickled)."""
    st = folder / "model.safetensors"
    pt = folder / "pytorch_model.bin"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    if pt.is_file():
        return torch.load(str(pt), map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"draft head folder {folder} has neither model.safetensors nor pytorch_model.bin")
