"""The fast target forward: a Llama decoder whose weight products read each weight once per
step, and whose rows have the same bits however many rows a step has.

A decode or verify step multiplies 1 to ~64 rows (the root and the draft tree) by every
weight of the model, so on a CPU its cost is the time to read the weights: for
SmolLM2-135M in float32, 538 MB, about 20 ms at one core's ~26 GB/s. transformers' eager
forward reaches ~60 ms at one row and grows steeply with the row count (MKL's small-M sgemm
reads the weights about once per row for 2-3 rows), which is why speculative decoding did
not pay on AVX2 CPUs. ``app/engine/kernels`` computes x @ W.T over pre-packed weights in
one pass for up to 12 rows (AVX-512; 6 on AVX2, a larger block then re-reads a weight group
from the L2 cache), and softmax attention row by row; benchmarks/fast-forward/ has the
measurements against the alternatives (inductor, oneDNN, MKL).

One call. With the engine's cache (``kv.PreallocatedLayer``: one buffer per layer) the whole
decoder stack is one C call (``kernels.decoder``), which writes the new keys and values into
the buffers itself: a one-row forward of SmolLM2-135M made ~270 kernel calls through ctypes
and ~200 torch ops between them, ~1.8 ms of Python against ~11 ms of kernels in bfloat16
(benchmarks/fast-forward/T-one-call.md). ``_forward_per_kernel`` is the same forward one
kernel at a time, the readable reference and the path for any other cache.

Exactness. Greedy EAGLE is lossless only if the target's logits for a position do not depend
on how many other rows the forward carried: the tree's root row must be the token plain
decoding would have computed alone. Every operation here is row-independent by
construction: the kernels (products, attention, RMSNorm, SwiGLU, RoPE) fix each element's
order of operations (``rowwise.c``), RoPE reads cos/sin from a per-position table, and the
residual adds are single IEEE operations per element (torch's or the one-call decoder's).
So a run's vanilla steps, its prefill rows and its verify rows agree bit for bit (tested
over tree sizes), in float32 and in the bfloat16 mode alike.

bfloat16 mode: the weights are stored in bfloat16 (half the bytes to read), activations,
the KV cache and all accumulation stay float32. Its output may differ from a float32 run
(the weights are rounded), never from its own vanilla.

Only what ``fused.supports`` accepts (plain Llama/Mistral decoders, SDPA) runs here, on a
CPU with AVX2 + FMA and a C compiler; anything else keeps the eager forward.
"""
from __future__ import annotations

import ctypes

import torch
from torch import nn
from transformers.models.llama.modeling_llama import rotate_half   # as fused.py: Mistral's is the same

from app.engine import kernels, kv
from app.engine.fused import FusedLlamaDecoder


class RowwiseLlamaDecoder(FusedLlamaDecoder):
    """``FusedLlamaDecoder``'s signature and arithmetic plan on the batch-invariant kernels.

    Returns float32 hidden states whatever the model's dtype (``logits`` reads them)."""

    # part of the autotune cost-cache key: cached cost curves of another forward are not reused
    name = "rowwise-v2"       # v2: the decoder stack in one C call (was ~270 calls through ctypes + torch ops)
    # run the stack as one C call when the cache is kv.PreallocatedLayer's (else, or False:
    # ``_forward_per_kernel``, one call per kernel; scripts/forward_kernels.py times both)
    one_call = True
    # a tree's mask may come as the (n, L) uint8 rows the kernels read (``tree.tree_mask_rows``)
    takes_row_masks = True

    @torch.no_grad()
    def __init__(self, model: nn.Module):
        super().__init__(model)
        # cost curves are per ISA (AVX2 emulation too) and per kernel source: a faster build
        # must not be judged by the curve its predecessor measured
        self.name = f"{type(self).name}-{kernels.load().kind}-{kernels.source_key()}"
        # verify runs the LM head over every row of trees up to this size in one call: a call
        # reads the (V, H) weight once for up to a register block of rows, so computing the
        # leaves too costs less than a second call for the accepted leaf's bonus token
        self.dtype = next(model.parameters()).dtype
        self.lm_head_all_rows_up_to = kernels.block_rows(bf16=self.dtype == torch.bfloat16)
        for w in self.layers:
            for key in ("qkv", "o", "gate_up", "down"):
                w[key] = kernels.Packed(w[key])
            layer = w["layer"]
            w["norm1"] = layer.input_layernorm.weight.detach().float()
            w["norm2"] = layer.post_attention_layernorm.weight.detach().float()
            w["eps1"] = layer.input_layernorm.variance_epsilon
            w["eps2"] = layer.post_attention_layernorm.variance_epsilon
        self.final_norm = self.body.norm.weight.detach().float()
        self.final_eps = self.body.norm.variance_epsilon
        self.lm_head = kernels.Packed(model.get_output_embeddings().weight)
        self.inner = self.layers[0]["down"].in_features                        # the MLP's I
        # the C decoder's view of every layer (kernels.Layer); the cache fields are set per call
        self._c_layers = (kernels.Layer * len(self.layers))()
        self._c_keys_t = (kernels.KeysT * len(self.layers))()   # and of its transposed keys
        for c, w in zip(self._c_layers, self.layers):
            c.norm1, c.norm2 = w["norm1"].data_ptr(), w["norm2"].data_ptr()
            c.eps1, c.eps2, c.scale = w["eps1"], w["eps2"], w["scaling"]
            c.qkv, c.o = w["qkv"].data.data_ptr(), w["o"].data.data_ptr()
            c.gate_up, c.down = w["gate_up"].data.data_ptr(), w["down"].data.data_ptr()
            c.wfmt = w["qkv"].format
            assert w["qkv"].format == w["o"].format == w["gate_up"].format == w["down"].format
        self._rope = RopeTable(self.body.rotary_emb, self.head_dim)
        self._layouts: list[int] = []   # kv.layouts of the cache whose buffers the C layers point at
        self._embedding = self.body.embed_tokens.weight.detach()

    def __call__(self, ids, positions, mask, cache, layers: tuple[int, ...] = ()):
        """The target's forward over n rows: ids, positions (1, n); mask (1, 1, n, L) bool, or
        (n, L) uint8 as ``tree.tree_mask_rows`` makes it (``takes_row_masks``), or None
        (causal); cache the target's. Returns (1, n, H) float32 (and the tapped layers')."""
        n = ids.shape[1]
        x = kernels.embed(self._embedding, ids[0].tolist())                    # (n, H), a new contiguous tensor
        if x is None:
            x = self._embedding.index_select(0, ids[0]).float()
        cos, sin = self._rope(positions)                                        # (n, d)
        if mask is not None and mask.dim() != 2:                                # (n, L) uint8, once for all layers
            mask = mask[0, 0].to(torch.uint8).contiguous()
        keep = mask
        slots = kv.reserve(cache, n, self.kv_heads, self.head_dim) if self.one_call else None
        if slots is None:
            return self._forward_per_kernel(x, cos, sin, keep, cache, layers)
        # one C call for the whole stack: it writes the new keys and values into the buffers
        # reserved above (positions [cached, cached + n) of every layer)
        cached = slots[0][0]
        if kv.layouts(cache) != self._layouts:   # a new cache, or one that grew: point the layers at its buffers
            assert len(slots) == len(self.layers) and len({start for start, _, _ in slots}) == 1
            transposed = [layer.keys_transposed() for layer in cache.layers]     # (1, Hkv, C/16, d, 16), valid
            for c, (_, keys, values), (kt, valid) in zip(self._c_layers, slots, transposed):
                assert keys.device.type == "cpu" and keys.shape[0] == 1 and keys.is_contiguous() \
                    and keys.dtype == torch.float32 and values.shape == keys.shape and values.is_contiguous()
                c.keys, c.values, c.kv_head = keys.data_ptr(), values.data_ptr(), keys.stride(1)
            for c, (kt, valid) in zip(self._c_keys_t, transposed):
                c.keys_t, c.kt_head, c.valid = kt.data_ptr(), kt.stride(1), ctypes.addressof(valid)
            self._layouts = kv.layouts(cache)    # after keys_transposed, which may have made the copies
        tap = taps = None
        if layers:
            slot = {layer: s for s, layer in enumerate(layers)}
            assert len(slot) == len(layers) and all(0 <= i < len(self.layers) for i in layers), layers
            tap = [slot.get(i, -1) for i in range(len(self.layers))]
            taps = torch.empty(n, len(layers) * x.shape[1], device="cpu")   # (n, k·H)
        hidden = kernels.decoder(x, self._c_layers, self.heads, self.kv_heads, self.head_dim, self.inner, cos, sin,
                                 cached, keep, tap, taps, self.final_norm, self.final_eps,
                                 self._c_keys_t)[None]   # (1, n, H)
        return hidden if not layers else (hidden, taps[None])

    def _forward_per_kernel(self, x, cos, sin, keep, cache, layers):
        """The same forward, one kernel call per operation and the cache written by
        ``cache.update``: any cache kind. ``kernels.decoder`` runs exactly these steps in C
        (the tests check the two agree bit for bit); this is the readable reference."""
        n = x.shape[0]
        qk_heads = self.heads + self.kv_heads
        d = self.head_dim
        taps: dict[int, torch.Tensor] = {}
        for i, w in enumerate(self.layers):
            if i in layers:
                taps[i] = x
            qkv = kernels.linear(kernels.rms_norm(x, w["norm1"], w["eps1"]), w["qkv"])   # (n, (Hq+2Hkv)·d)
            kernels.rope_(qkv, qk_heads, d, cos, sin)                           # RoPE on the q and k heads
            heads = qkv.view(n, qk_heads + self.kv_heads, d)
            q = heads[:, :self.heads]                                           # (n, Hq, d)
            k = heads[:, self.heads:qk_heads].transpose(0, 1)                   # (Hkv, n, d)
            v = heads[:, qk_heads:].transpose(0, 1)                             # (Hkv, n, d)
            keys, values = cache.update(k[None], v[None], i)                    # (1, Hkv, L, d)
            o = kernels.attention(q, keys[0], values[0], keep, w["scaling"])    # (n, Hq·d)
            x = x + kernels.linear(o, w["o"])
            gate_up = kernels.linear(kernels.rms_norm(x, w["norm2"], w["eps2"]), w["gate_up"])   # (n, 2I)
            x = x + kernels.linear(kernels.silu_mul(gate_up), w["down"])
        hidden = kernels.rms_norm(x, self.final_norm, self.final_eps)[None]   # (1, n, H)
        if not layers:
            return hidden
        return hidden, torch.cat([taps[i] for i in layers], dim=-1)[None]     # (1, n, k·H)

    def prefill(self, ids, cache, layers: tuple[int, ...] = ()):
        """The prompt's forward (causal, positions 0..m-1) on the same kernels, so that the
        cache holds the same bits a decode step would have written."""
        positions = torch.arange(ids.shape[1], device="cpu")[None]
        return self(ids, positions, None, cache, layers)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V) float32 through the target's LM head, row-independent."""
        return kernels.linear(hidden.float(), self.lm_head)


class RopeTable:
    """cos, sin (n, d) float32 of positions (1, n), read from a table that the model's own
    rotary embedding fills once (grown in powers of two). The values are the ones it computes
    call by call (one product per element, no sum), without its ~0.1 ms a call, and a
    position's values never depend on which others share the forward."""

    def __init__(self, rotary_emb: nn.Module, head_dim: int):
        self.rotary_emb, self.head_dim = rotary_emb, head_dim
        self._cos = self._sin = torch.empty(0, device="cpu")

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = positions[0].tolist()
        need = max(pos) + 1
        if need > self._cos.shape[0]:
            size = max(256, 1 << (need - 1).bit_length())
            probe = torch.zeros(1, 1, self.head_dim, device="cpu")
            cos, sin = self.rotary_emb(probe, torch.arange(size, device="cpu")[None])
            self._cos, self._sin = cos[0].float(), sin[0].float()                 # (size, d)
        if pos == list(range(pos[0], pos[0] + len(pos))):      # a run of positions (a decode step, a prefill)
            return self._cos[pos[0]:need], self._sin[pos[0]:need]                # views, contiguous
        return self._cos[positions[0]].contiguous(), self._sin[positions[0]].contiguous()


class RowwiseDraftHead:
    """An EAGLE-1/2 head's forward (``DraftHead.forward``'s signature) on the same kernels.

    Drafting runs the head once per tree level over the few frontier nodes: 1-10 rows, the
    shape where eager small-M products are slowest. Here each level reads the head's weights
    once. Its features and outputs are float32 (what the fast target forward produces); the
    head's own weights keep their dtype, or with ``int8`` are quantized per output row
    (``kernels.quantize_int8``: half the bytes of bfloat16 to read at every level). Draft
    quality only affects speed, never output."""

    # attention_mask None: each row sees the whole cache and the rows before it (the C
    # attention's causal rule), as the mask of the head's pending pairs would say
    causal_without_mask = True
    # a mask may come as the (T, S) uint8 rows the kernels read, as well as (1, 1, T, S) bool
    takes_row_masks = True

    def __init__(self, head: nn.Module, int8: bool = False, embedding: nn.Module | None = None):
        """``embedding``: the target's input embedding, the head's token table where it has
        none of its own (``embed_ids``; None: the caller embeds)."""
        with torch.no_grad():
            self.fc = kernels.Packed(head.fc.weight, int8)                        # (H, 2H): [emb; f] -> H
            self.fc_bias = head.fc.bias.detach().float() if head.fc.bias is not None else None
        self._pack_layer(head.layers[0], head, int8, embedding)

    def _pack_layer(self, layer: nn.Module, head: nn.Module, int8: bool, embedding: nn.Module | None) -> None:
        """The decoder layer's weights packed, and its view for the C decoder (one layer, no
        input norm: ``norm1`` NULL; its cache fields are set per call)."""
        attn, mlp = layer.self_attn, layer.mlp
        cfg = head.config
        with torch.no_grad():
            self.qkv = kernels.Packed(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]), int8)
            self.o = kernels.Packed(attn.o_proj.weight, int8)
            self.gate_up = kernels.Packed(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), int8)
            self.down = kernels.Packed(mlp.down_proj.weight, int8)
            self.norm = layer.post_attention_layernorm.weight.detach().float()
        self.eps = layer.post_attention_layernorm.variance_epsilon
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scaling = getattr(attn, "scaling", self.head_dim ** -0.5)
        self.rope = RopeTable(head.rotary_emb, self.head_dim)
        self.inner = mlp.down_proj.in_features
        self._c_layer = (kernels.Layer * 1)()
        self._c_keys_t = (kernels.KeysT * 1)()
        c = self._c_layer[0]
        c.norm1, c.norm2, c.eps1, c.eps2, c.scale = None, self.norm.data_ptr(), 0.0, self.eps, self.scaling
        c.qkv, c.o, c.gate_up, c.down = (w.data.data_ptr() for w in (self.qkv, self.o, self.gate_up, self.down))
        c.wfmt = self.qkv.format
        self.one_call = self.qkv.format == self.o.format == self.gate_up.format == self.down.format
        table = head.embed_tokens if getattr(head, "embed_tokens", None) is not None else embedding
        self._embedding = table.weight.detach() if table is not None else None

    def embed_ids(self, tokens: list[int]) -> torch.Tensor | None:
        """(1, T, H) float32 input embeddings of ``tokens`` in one C call (what this forward
        reads), or None where it cannot (no table given, or the kernels cannot take it)."""
        out = kernels.embed(self._embedding, tokens) if self._embedding is not None else None
        return None if out is None else out[None]

    @staticmethod
    def supports(head) -> bool:
        """A plain EAGLE-1/2 head: SiLU MLP, no projection biases, no input norm."""
        layer = getattr(head, "layers", [None])[0]
        if layer is None or not hasattr(head, "fc") or hasattr(head, "logits"):
            return False
        return isinstance(layer.input_layernorm, nn.Identity) and _plain_layer(layer, head.config)

    def _layer_input(self, token_embeds: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, None]:
        """(T, H) what the layer reads: fc([emb; f]); and no embeddings beside it (EAGLE-3 has)."""
        x = kernels.linear(torch.cat((token_embeds[0].float(), features[0].float()), dim=-1), self.fc)   # (T, H)
        return (x + self.fc_bias if self.fc_bias is not None else x), None

    def __call__(self, token_embeds, features, position_ids, attention_mask, cache):
        T = token_embeds.shape[1]
        d = self.head_dim
        x, emb = self._layer_input(token_embeds, features)                                 # (T, H), (T, H) or None
        cos, sin = self.rope(position_ids)                                                # (T, d) each
        slots = kv.reserve(cache, T, self.kv_heads, d) if self.one_call else None
        if slots is not None and slots[0][1].dtype == torch.float32:
            # the layer in one C call (the same kernels as below, ~0.2 ms less Python a forward)
            (cached, keys, values), = slots
            kt, valid = cache.layers[0].keys_transposed()                   # (1, Hkv, C/16, d, 16), valid
            c, t = self._c_layer[0], self._c_keys_t[0]
            c.keys, c.values, c.kv_head = keys.data_ptr(), values.data_ptr(), keys.stride(1)
            t.keys_t, t.kt_head, t.valid = kt.data_ptr(), kt.stride(1), ctypes.addressof(valid)
            keep = attention_mask                                            # None, or (T, S) uint8
            if keep is not None and keep.dim() != 2:
                keep = keep[0, 0].to(torch.uint8).contiguous()
            if emb is not None:
                out = kernels.decoder_eagle3(x.contiguous(), emb, self._c_layer, self.heads, self.kv_heads, d,
                                             self.inner, cos, sin, cached, keep, self.norm_emb, self.eps_emb,
                                             keys_t=self._c_keys_t)
            else:
                out = kernels.decoder(x.contiguous(), self._c_layer, self.heads, self.kv_heads, d, self.inner,
                                      cos, sin, cached, keep, tap=None, taps=None, final_norm=None, final_eps=0.0,
                                      keys_t=self._c_keys_t)
            return out[None]                                                              # (1, T, H) float32
        if slots is not None:                       # reserved for a cache in another dtype: undo, take the path below
            kv.crop(cache, slots[0][0])
        return self._forward_per_kernel(x, cos, sin, T, d, attention_mask, cache, emb)

    def _forward_per_kernel(self, x, cos, sin, T, d, attention_mask, cache, emb=None):
        """The layer one kernel call at a time, the cache written by ``cache.update``: any
        cache kind. The one-call path above runs exactly these steps in C. ``emb``: EAGLE-3's
        (T, H) token embeddings, whose RMSNorm joins x's in what q, k and v read."""
        h = x if emb is None else torch.cat((kernels.rms_norm(emb, self.norm_emb, self.eps_emb),
                                             kernels.rms_norm(x, self.norm_hidden, self.eps_hidden)), dim=-1)
        qkv = kernels.linear(h, self.qkv)                                                 # (T, (Hq+2Hkv)·d)
        qk, v = qkv.split([(self.heads + self.kv_heads) * d, self.kv_heads * d], dim=-1)
        qk = qk.view(T, -1, d).transpose(0, 1)                                            # (Hq+Hkv, T, d)
        qk = qk * cos + rotate_half(qk) * sin
        q, k = qk.split([self.heads, self.kv_heads], dim=0)
        v = v.view(T, self.kv_heads, d).transpose(0, 1)                                   # (Hkv, T, d)
        keys, values = cache.update(k[None], v[None], 0)                                  # (1, Hkv, S, d)
        keep = attention_mask if attention_mask is None or attention_mask.dim() == 2 else attention_mask[0, 0]  # (T, S)
        o = kernels.attention(q.transpose(0, 1), keys[0], values[0], keep, self.scaling)  # (T, Hq·d)
        x = x + kernels.linear(o, self.o)
        x = x + kernels.linear(kernels.silu_mul(kernels.linear(kernels.rms_norm(x, self.norm, self.eps),
                                                                 self.gate_up)), self.down)
        return x[None]                                                                    # (1, T, H) float32


class RowwiseEagle3Head(RowwiseDraftHead):
    """An EAGLE-3 head's forward and its LM head (``Eagle3Head.forward`` / ``.logits``) on the
    same kernels, int8 or the head's own weights as ``RowwiseDraftHead``.

    What differs from EAGLE-1/2 (``heads/eagle3.py``): fc fuses the target's three tapped
    layers (3H -> H) and is skipped from the second draft level on, where the head reads its
    own state (H); the token embedding does not go through fc but beside the state into
    q, k and v, each RMS-normed: [norm_emb(emb); norm_hidden(g)] (2H); the state g is the
    residual; and the head has its own final norm and LM head over its draft vocabulary
    (``logits``). One C call a forward where the build has ``kernels.decoder_eagle3``."""

    def __init__(self, head: nn.Module, int8: bool = False, embedding: nn.Module | None = None):
        mid = head.midlayer
        with torch.no_grad():
            self.fc = kernels.Packed(head.fc.weight, int8)                        # (H, 3H): [l; m; h] -> g (no bias)
            self.lm_head = kernels.Packed(head.lm_head.weight, int8)              # (Vd, H)
            self.norm_emb = mid.input_layernorm.weight.detach().float()
            self.norm_hidden = mid.hidden_norm.weight.detach().float()
            self.final_norm = head.norm.weight.detach().float()
        self.eps_emb = mid.input_layernorm.variance_epsilon
        self.eps_hidden = mid.hidden_norm.variance_epsilon
        self.final_eps = head.norm.variance_epsilon
        self.hidden_size = head.config.hidden_size
        self._pack_layer(mid, head, int8, embedding)
        c = self._c_layer[0]
        c.norm1, c.eps1 = self.norm_hidden.data_ptr(), self.eps_hidden    # the C layer's input norm: hidden_norm
        self.one_call = self.one_call and kernels.has_eagle3_layer()

    @staticmethod
    def supports(head) -> bool:
        """An EAGLE-3 head (``Eagle3Head``) with a SiLU MLP and no biases."""
        mid = getattr(head, "midlayer", None)
        return (mid is not None and hasattr(head, "logits") and getattr(head, "fc", None) is not None
                and head.fc.bias is None and _plain_layer(mid, head.config))

    def _layer_input(self, token_embeds, features):
        """g = fc([l; m; h]) from the target's taps (3H), or the head's own state as is (H);
        the embeddings go beside it into the layer."""
        x = features[0].float()                                                           # (T, 3H) or (T, H)
        if x.shape[-1] == self.fc.in_features:
            x = kernels.linear(x, self.fc)                                                # (T, H)
        elif x.shape[-1] != self.hidden_size:
            raise ValueError(f"EAGLE-3 head reads {self.fc.in_features} (target) or {self.hidden_size} "
                             f"(its own) features, got {x.shape[-1]}")
        return x.contiguous(), token_embeds[0].float().contiguous()

    def logits(self, feats: torch.Tensor) -> torch.Tensor:
        """(F, H) head states -> (F, Vd) draft logits: the head's final RMSNorm, then its LM head."""
        return kernels.linear(kernels.rms_norm(feats.float().contiguous(), self.final_norm, self.final_eps),
                              self.lm_head)


def _plain_layer(layer: nn.Module, config) -> bool:
    """A Llama layer the draft kernels run: SiLU MLP, no biases in attention or MLP."""
    attn, mlp = layer.self_attn, layer.mlp
    return (getattr(config, "hidden_act", "") == "silu"
            and all(getattr(attn, n).bias is None for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
            and all(getattr(mlp, n).bias is None for n in ("gate_proj", "up_proj", "down_proj")))
