"""The target's decoder stack for decode and verify steps, with fused projections.

Every EAGLE step runs the target over a handful of query tokens (the root plus the draft
tree) on top of a long KV cache. On this 2-core CPU transformers' eager Llama forward spends
about a fifth of such a step outside the matrix products that must read the weights: seven
separate projections per layer (q, k, v, o, gate, up, down), a module call for each, and the
mask and cache machinery around them. ``FusedLlamaDecoder`` runs the same arithmetic with
two fused products per layer — [q; k; v] in one matmul, [gate; up] in another — and calls
``scaled_dot_product_attention`` directly with the engine's tree mask.

Why by hand: no library call gives this. ``torch.compile`` could fuse more, but it needs a
C++ toolchain, minutes of compilation on 2 cores and a static cache shape, which the
engine's crop-and-gather cache does not have; compiling each layer's two halves around the
cache (measured: 26 s to compile) was 1-2 ms *slower* per forward, from its guards and call
wrappers, and not bit-identical. The rotary embedding, ``rotate_half`` and the embeddings are
transformers' own, RoPE is applied to the query and key heads in one call, and in float32 the
RMSNorms are ``F.rms_norm`` (one ATen call, the same rounding); the fused weights are the
model's own tensors: the original q/k/v and gate/up parameters become row views of the
fused ones, so no memory is added and transformers' forward (prefill, ``generate``) keeps
working on the same numbers.

Exactness: each output element of a fused product is the same dot product as in the separate
product, so on CPU the hidden states equal transformers' bit for bit (tested); greedy output
stays identical to ``generate``. Measured on SmolLM2-135M fp32, 2 threads, 300 cached
positions: 42.6 -> 34.4 ms for 1 query token, 50.1 -> 40.2 for 3, 70.5 -> 61.6 for 8;
the one-call norms and RoPE then took another 0.8-1.3 ms off (22.8 -> 22.0 ms at n = 1, 26.7 ->
25.4 at 3, 43.4 -> 42.1 at 8, on a quieter day of this VM).

Only plain Llama and Mistral decoders qualify (``supports``): SiLU MLP, no projection
biases, no sliding window, SDPA attention. Anything else runs transformers' forward unchanged
(``DecoderForward``), with the same call signature.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import rotate_half   # Mistral's is the same


def layer_inputs(hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...]) -> torch.Tensor:
    """(B, n, k·H): the inputs of decoder layers ``layers`` (in that order), concatenated, from
    transformers' ``output_hidden_states`` tuple, whose entry i is the input of layer i."""
    return torch.cat([hidden_states[i] for i in layers], dim=-1)


class DecoderForward:
    """transformers' own decoder stack: ``(ids, positions, mask, cache) -> hidden (1, n, H)``.

    With ``layers`` (an EAGLE-3 head's low/mid/high target layers) it returns
    ``(hidden, taps)``, taps (1, n, k·H) the inputs of those layers in the same forward."""

    name = "transformers"

    def __init__(self, model: nn.Module):
        self.body = getattr(model, model.base_model_prefix)
        self.lm_head_module = model.get_output_embeddings()

    def prefill(self, ids, cache, layers: tuple[int, ...] = ()):
        """The prompt's forward (causal) into ``cache``: hidden (1, m, H), with ``layers``
        also their inputs (1, m, k·H)."""
        out = self.body(input_ids=ids, cache=cache, use_cache=True, output_hidden_states=bool(layers))
        if not layers:
            return out.last_hidden_state
        return out.last_hidden_state, layer_inputs(out.hidden_states, layers)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V): the target's LM head."""
        return self.lm_head_module(hidden)

    def __call__(self, ids, positions, mask, cache, layers: tuple[int, ...] = ()):
        out = self.body(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                        use_cache=True, output_hidden_states=bool(layers))
        if not layers:
            return out.last_hidden_state
        return out.last_hidden_state, layer_inputs(out.hidden_states, layers)


ALLOWED_LAYERS = {"LlamaDecoderLayer", "MistralDecoderLayer"}


def supports(model: nn.Module) -> str | None:
    """None if ``FusedLlamaDecoder`` reproduces ``model``'s decoder exactly, else the reason not."""
    cfg = model.config
    body = getattr(model, model.base_model_prefix, None)
    layers = getattr(body, "layers", None)
    if layers is None or not hasattr(body, "rotary_emb") or not hasattr(body, "norm"):
        return "not a Llama-style decoder (layers, rotary_emb, norm)"
    # an allow-list, not a shape check: look-alikes scale embeddings or residuals inside
    # their model's forward (Gemma, Granite) or add norms (Gemma 2/3), which this would skip
    kinds = {type(layer).__name__ for layer in layers}
    if kinds - ALLOWED_LAYERS:
        return f"decoder layers {sorted(kinds)}, not one of {sorted(ALLOWED_LAYERS)}"
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(cfg, 'hidden_act', None)!r}, not silu"
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return "projection biases"
    if getattr(cfg, "sliding_window", None) or getattr(cfg, "pretraining_tp", 1) != 1:
        return "sliding window or tensor-parallel slices"
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return f"attention {getattr(cfg, '_attn_implementation', None)!r}, not sdpa"
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = ("q_proj", "k_proj", "v_proj", "o_proj")
        if attn is None or mlp is None or not all(isinstance(getattr(attn, n, None), nn.Linear) for n in names):
            return "attention without q/k/v/o projections"
        if not all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
            return "MLP without gate/up/down projections"
        if any(getattr(attn, extra, None) is not None for extra in ("q_norm", "k_norm")):
            return "q/k norms"
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if not all(hasattr(m, "variance_epsilon") and hasattr(m, "weight") for m in norms):
            return "norms other than RMSNorm"
    return None


def _fuse(linears: list[nn.Linear]) -> torch.Tensor:
    """Concatenate the weights (rows) and make each module's weight a view of its rows."""
    fused = torch.cat([m.weight.detach() for m in linears]).contiguous()     # (sum out, in)
    start = 0
    for m in linears:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(fused[start:start + rows], requires_grad=m.weight.requires_grad)
        start += rows
    return fused


class FusedLlamaDecoder(DecoderForward):
    """A Llama decoder stack with [q; k; v] and [gate; up] fused. Same signature as
    ``DecoderForward`` (``layers``: also return those layers' inputs); ``mask`` is the engine's (1, 1, n, cached + n) bool tree mask or None
    (one query attends to the whole cache)."""

    # part of the autotune cost-cache key: bump it when the forward gets faster or slower, so
    # cached cost curves are measured again (v2: one-call float32 RMSNorms and q/k RoPE)
    name = "fused-v2"

    @torch.no_grad()
    def __init__(self, model: nn.Module):
        super().__init__(model)
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.layers = []
        for layer in self.body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(dict(
                layer=layer,
                qkv=_fuse([attn.q_proj, attn.k_proj, attn.v_proj]),   # (Hq·d + 2·Hkv·d, H)
                o=attn.o_proj.weight,                                 # (H, Hq·d)
                gate_up=_fuse([mlp.gate_proj, mlp.up_proj]),          # (2·I, H)
                down=mlp.down_proj.weight,                            # (H, I)
                scaling=getattr(attn, "scaling", self.head_dim ** -0.5)))

    def _norm(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``module(x)`` for a Llama RMSNorm. In float32, ``F.rms_norm`` is one ATen call for
        transformers' six (upcast, square, mean, rsqrt, two products) and rounds the same way
        (tested bit for bit); in half precision transformers rounds the normalised input before
        the weight product, which ``F.rms_norm`` does not, so the module runs."""
        if x.dtype == torch.float32 and module.weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), module.weight, module.variance_epsilon)
        return module(x)

    def __call__(self, ids, positions, mask, cache, layers: tuple[int, ...] = ()):
        n = ids.shape[1]
        x = self.body.embed_tokens(ids)                                         # (1, n, H)
        cos, sin = self.body.rotary_emb(x, positions)                           # (1, n, d) each
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)                           # (1, 1, n, d): all heads
        qk_heads = self.heads + self.kv_heads
        taps: dict[int, torch.Tensor] = {}                                      # layer -> its input (1, n, H)
        for i, w in enumerate(self.layers):
            if i in layers:
                taps[i] = x
            layer = w["layer"]
            qkv = F.linear(self._norm(layer.input_layernorm, x), w["qkv"])     # (1, n, (Hq + 2·Hkv)·d)
            qk, v = qkv.split([qk_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
            qk = qk.view(1, n, qk_heads, self.head_dim).transpose(1, 2)        # (1, Hq + Hkv, n, d)
            # RoPE on the query and key heads in one go: the same elementwise products as
            # transformers' apply_rotary_pos_emb on q and k separately, half the calls
            qk = qk * cos + rotate_half(qk) * sin
            q, k = qk.split([self.heads, self.kv_heads], dim=1)                 # (1, Hq, n, d), (1, Hkv, n, d)
            v = v.view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)     # (1, Hkv, n, d)
            keys, values = cache.update(k, v, i)                                # (1, Hkv, cached + n, d)
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=w["scaling"],
                                               enable_gqa=self.kv_heads != self.heads)   # (1, Hq, n, d)
            x = x + F.linear(o.transpose(1, 2).reshape(1, n, -1), w["o"])
            gate, up = F.linear(self._norm(layer.post_attention_layernorm, x), w["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w["down"])
        hidden = self._norm(self.body.norm, x)                                  # (1, n, H)
        if not layers:
            return hidden
        return hidden, torch.cat([taps[i] for i in layers], dim=-1)             # (1, n, k·H)
