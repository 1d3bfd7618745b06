"""The only code that touches KV-cache internals.

transformers' ``DynamicCache`` keeps, per layer, ``keys`` and ``values`` of shape
(B, kv_heads, S, head_dim). After a tree verification the cache holds the prefix, the root
and every drafted node; only the root and the accepted path may stay.
"""
from __future__ import annotations

import torch


def cache_length(cache) -> int:
    return cache.get_seq_length() if cache is not None else 0


def crop(cache, length: int) -> None:
    """Keep the first ``length`` positions of every layer."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.shape[-2] > length:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def keep_positions(cache, start: int, offsets: list[int]) -> None:
    """Keep positions [0, start) and start + offsets (ascending), drop everything after start.

    offsets = [0, 1 + i for each accepted node i] keeps the root and the accepted path. When
    they are contiguous (0, 1, 2, ...), as for a chain or a path of first children, this is a
    plain crop; otherwise the kept entries are gathered into place.
    """
    if offsets == list(range(len(offsets))):
        crop(cache, start + len(offsets))
        return
    device = cache.layers[0].keys.device
    index = torch.tensor([start + o for o in offsets], device=device)
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)
            kept = t.index_select(-2, index)              # (B, H, k, D), a copy
            t = t[..., : start + len(offsets), :]
            t[..., start:, :] = kept
            setattr(layer, name, t)
