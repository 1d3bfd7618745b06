"""The only code that touches KV-cache internals.

transformers' ``DynamicCache`` keeps, per layer, ``keys`` and ``values`` of shape
(B, kv_heads, S, head_dim). After a tree verification the cache holds the prefix, the root
and every drafted node; only the root and the accepted path may stay.

``PreallocatedLayer`` / ``preallocated_cache`` keep each layer's keys and values in one
buffer written in place instead of a tensor re-concatenated every step. The engine's caches
(target and draft head) use them, cropped and compacted by ``crop`` / ``keep_positions``
below; so does the training data stage's batched generation (app/train/data.py), which only
appends and drops finished rows.
"""
from __future__ import annotations

import ctypes
import itertools

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from app.engine import kernels


def cache_length(cache) -> int:
    return cache.get_seq_length() if cache is not None else 0


def crop(cache, length: int) -> None:
    """Keep the first ``length`` positions of every layer."""
    for layer in cache.layers:
        if isinstance(layer, PreallocatedLayer):
            layer.truncate(length)
        elif getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.shape[-2] > length:
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
    layers = cache.layers
    if all(isinstance(layer, PreallocatedLayer) and layer.is_initialized for layer in layers):
        buffers = [b for layer in layers for b in (layer.key_buffer, layer.value_buffer)]
        kept = getattr(cache, "_keep_rows_plan", None)     # (buffers, plan): made again when one grows
        same = kept is not None and len(kept[0]) == len(buffers) and all(a is b for a, b in zip(kept[0], buffers))
        plan = kept[1] if same else kernels.keep_rows_plan(buffers)
        if plan is not None and not same:
            cache._keep_rows_plan = (buffers, plan)
        if plan is not None and kernels.keep_rows(buffers, start, offsets, plan):
            for layer in layers:                        # the rows moved in C: one call for every layer
                layer.length = start + len(offsets)
                layer._forget_keys_t_from(start)
            return
    device = cache.layers[0].keys.device
    index = torch.tensor([start + o for o in offsets], device=device)
    for layer in cache.layers:
        if isinstance(layer, PreallocatedLayer):
            layer.gather_tail(start, index)
            continue
        for name in ("keys", "values"):
            t = getattr(layer, name)
            kept = t.index_select(-2, index)              # (B, H, k, D), a copy
            t = t[..., : start + len(offsets), :]
            t[..., start:, :] = kept
            setattr(layer, name, t)


_layouts = itertools.count(1)      # PreallocatedLayer.layout: unique over the process


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in one buffer, so a decode step writes
    its new columns in place; ``keys``/``values`` (what the attention reads) are views
    ``[:, :, :length]`` of the buffers.

    transformers' ``DynamicLayer`` concatenates every new key/value onto the old tensors, which
    copies the whole cache each step, a cost that grows with the context (a large share of a
    batched training-data step; benchmarks/engine-notes.md).
    A full buffer doubles (amortised O(1) per token); ``truncate`` and ``gather_tail`` let
    the engine drop rejected tree nodes without reallocating.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = max(1, int(capacity))
        self.length = 0
        # the keys transposed in tiles of 16 positions, (B, kv_heads, tiles, d, 16), for the
        # fast forward's attention (app/engine/kernels/rowwise.c, transpose_keys), made by
        # ``keys_transposed``; current below ``key_t_valid`` (the C code moves it up, every
        # change to a position below it here moves it down)
        self.key_t_buffer = None
        self.key_t_valid = ctypes.c_int(0)
        # a new number whenever a buffer is (re)allocated: the fast forward's C layers hold
        # the buffers' addresses and re-read them only when a layer's layout changed (reading
        # 5 addresses of 30 layers every forward cost ~0.1 ms a step; ``layouts``)
        self.layout = next(_layouts)

    # ``keys``/``values`` are made when read, not each time the length changes: a decode
    # step reserves, crops or compacts every layer of the cache, and re-slicing 2 views per
    # layer each time cost ~0.4 ms a step for SmolLM2's 30 layers, read by no one on the
    # fast forward (it writes and reads the buffers in C). Before the buffers exist they are
    # what ``DynamicLayer`` stores (None).
    @property
    def keys(self):
        return self.key_buffer[:, :, :self.length] if self.is_initialized else self._keys

    @keys.setter
    def keys(self, value):
        self._keys = value

    @property
    def values(self):
        return self.value_buffer[:, :, :self.length] if self.is_initialized else self._values

    @values.setter
    def values(self, value):
        self._values = value

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, heads, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.key_buffer = key_states.new_empty(B, heads, self.capacity, d)      # (B, kv_heads, C, d)
        self.value_buffer = value_states.new_empty(B, heads, self.capacity, value_states.shape[-1])
        self.length = 0
        self.key_t_buffer, self.key_t_valid.value = None, 0
        self.layout = next(_layouts)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.length + n > self.capacity:
            self._grow(max(2 * self.capacity, self.length + n))
        self.key_buffer[:, :, self.length:self.length + n] = key_states
        self.value_buffer[:, :, self.length:self.length + n] = value_states
        self.length += n
        return self.keys, self.values

    def reserve(self, n: int, heads: int, head_dim: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        """Make room for ``n`` new positions and count them as cached, for a caller that writes
        their keys and values into the buffers itself (the fast forward's one-call decoder,
        app/engine/rowwise.py). Returns the first new position and the key and value buffers,
        (B, heads, capacity, head_dim) each; float32 on the CPU if made here."""
        if not self.is_initialized:
            empty = torch.empty(1, heads, 0, head_dim, device="cpu")
            self.lazy_initialization(empty, empty)
        start = self.length
        if start + n > self.capacity:
            self._grow(max(2 * self.capacity, start + n))
        self.length = start + n
        return start, self.key_buffer, self.value_buffer

    def keys_transposed(self) -> tuple[torch.Tensor, ctypes.c_int]:
        """The transposed copy of the keys, (B, kv_heads, capacity / 16, d, 16), and the
        position below which it is current, made on first use (empty, current nowhere)."""
        if self.key_t_buffer is None:
            B, heads, capacity, d = self.key_buffer.shape
            self.key_t_buffer = self.key_buffer.new_empty(B, heads, -(-capacity // 16), d, 16)
            self.key_t_valid.value = 0
            self.layout = next(_layouts)
        return self.key_t_buffer, self.key_t_valid

    def _forget_keys_t_from(self, position: int) -> None:
        """Positions from ``position`` on change: the transposed copy is no longer current there."""
        if self.key_t_valid.value > position:
            self.key_t_valid.value = position

    def _grow(self, capacity: int) -> None:
        """Move the cached positions into buffers of ``capacity`` positions (one copy)."""
        for name in ("key_buffer", "value_buffer"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:2], capacity, old.shape[-1])
            new[:, :, :self.length] = old[:, :, :self.length]
            setattr(self, name, new)
        # the transposed copy is made again at the new capacity, current nowhere (a cache grows
        # rarely; the next attention transposes every position once)
        self.key_t_buffer, self.key_t_valid.value = None, 0
        self.capacity = capacity
        self.layout = next(_layouts)

    def get_seq_length(self) -> int:
        return self.length

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions (no copy: later writes overwrite the rest)."""
        if self.is_initialized and length < self.length:
            self.length = length
            self._forget_keys_t_from(length)

    def gather_tail(self, start: int, index: torch.Tensor) -> None:
        """Keep positions [0, start) followed by the positions ``index`` (ascending, all >= start)."""
        if not self.is_initialized:
            return
        k = index.numel()
        for buffer in (self.key_buffer, self.value_buffer):
            buffer[:, :, start:start + k] = buffer.index_select(2, index)   # index_select copies first
        self.length = start + k
        self._forget_keys_t_from(start)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("use kv.crop(cache, length) or truncate(length)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows ``indices`` (answers still being generated): one copy."""
        if self.is_initialized:
            self.key_buffer = self.key_buffer[indices]
            self.value_buffer = self.value_buffer[indices]
            if self.key_t_buffer is not None:
                self.key_t_buffer = self.key_t_buffer[indices]
            self.layout = next(_layouts)


def reserve(cache, n: int, heads: int, head_dim: int) -> list[tuple[int, torch.Tensor, torch.Tensor]] | None:
    """``PreallocatedLayer.reserve`` on every layer of ``cache``, or None (and nothing
    changed) unless it has layers and every one is a ``PreallocatedLayer``."""
    if cache is None or not cache.layers or not all(isinstance(layer, PreallocatedLayer) for layer in cache.layers):
        return None
    return [layer.reserve(n, heads, head_dim) for layer in cache.layers]


def layouts(cache) -> list[int]:
    """Every layer's ``PreallocatedLayer.layout``: equal lists, the same buffers."""
    return [layer.layout for layer in cache.layers]


def preallocated_cache(model, capacity: int):
    """A ``DynamicCache`` for ``model`` whose full-attention layers are ``PreallocatedLayer``s
    of ``capacity`` positions to start with (other layer kinds, e.g. sliding windows, are
    kept as they are). ``model=None`` gives a cache of layers made on first use (the draft
    head's, whose one layer is not described by a model config)."""
    if model is None:
        cache = DynamicCache()
        cache.layer_class_to_replicate = lambda: PreallocatedLayer(capacity)
        return cache
    cache = DynamicCache(config=model.config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer
                    for layer in cache.layers]
    return cache
