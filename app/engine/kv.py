"""The only code that touches KV-cache internals.

transformers' ``DynamicCache`` keeps, per layer, ``keys`` and ``values`` of shape
(B, kv_heads, S, head_dim). After a tree verification the cache holds the prefix, the root
and every drafted node; only the root and the accepted path may stay.

``PreallocatedLayer`` / ``preallocated_cache`` serve the training data stage's batched
generation (app/train/data.py), which only ever appends and drops finished rows.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


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


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in one buffer allocated at the first
    update, sized for the whole answer, so a decode step writes one column in place.

    transformers' ``DynamicLayer`` concatenates every new key/value onto the old tensors, which
    copies the whole cache each step: for a batch of 64 answers with 300 cached positions that
    ``torch.cat`` was 31% of a bf16 decode step on this CPU (torch.profiler). ``keys``/``values``
    stay what the attention reads: views ``[:, :, :length]`` of the buffers.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, heads, _, d = key_states.shape
        self.device = key_states.device
        self.key_buffer = key_states.new_empty(B, heads, self.capacity, d)      # (B, kv_heads, C, d)
        self.value_buffer = value_states.new_empty(B, heads, self.capacity, value_states.shape[-1])
        self.length = 0
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.length + n > self.capacity:
            raise RuntimeError(f"KV buffer of {self.capacity} positions is full")
        self.key_buffer[:, :, self.length:self.length + n] = key_states
        self.value_buffer[:, :, self.length:self.length + n] = value_states
        self.length += n
        self._expose()
        return self.keys, self.values

    def _expose(self) -> None:
        self.keys = self.key_buffer[:, :, :self.length]
        self.values = self.value_buffer[:, :, :self.length]

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the data stage never crops its cache")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows ``indices`` (answers still being generated): one copy."""
        if self.is_initialized:
            self.key_buffer = self.key_buffer[indices]
            self.value_buffer = self.value_buffer[indices]
            self._expose()


def preallocated_cache(model, capacity: int):
    """A ``DynamicCache`` for ``model`` whose full-attention layers are ``PreallocatedLayer``s
    of ``capacity`` positions (other layer kinds, e.g. sliding windows, are kept as they are)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer
                    for layer in cache.layers]
    return cache
