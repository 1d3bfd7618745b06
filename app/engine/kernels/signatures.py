"""The C side's signatures, for ctypes: the two structs ``rowwise_decoder`` reads and each
exported function's argument and result types (``declare``).

ctypes calls a C function with whatever it is given; without these declarations a ``long``
or a ``float`` argument would be passed as an ``int``, and a pointer truncated. Every
function of ``rowwise.c`` the Python side calls is declared here, once per loaded build.
Builds of older sources (benchmarks load them beside the current one,
``kernels.load_other``) may lack newer functions: ``declare`` then gives them a stand-in or
leaves them out, and the callers in ``__init__.py`` check ``hasattr`` before using one.
"""
from __future__ import annotations

import ctypes


class Layer(ctypes.Structure):
    """``struct rowwise_layer`` of rowwise.c: one decoder layer's weights and KV-cache buffers
    for ``decoder``. The tensors behind the pointers must outlive every call (the caller
    keeps them)."""

    _fields_ = [("norm1", ctypes.c_void_p), ("norm2", ctypes.c_void_p),
                ("eps1", ctypes.c_float), ("eps2", ctypes.c_float), ("scale", ctypes.c_float),
                ("qkv", ctypes.c_void_p), ("o", ctypes.c_void_p), ("gate_up", ctypes.c_void_p),
                ("down", ctypes.c_void_p), ("wfmt", ctypes.c_int),
                ("keys", ctypes.c_void_p), ("values", ctypes.c_void_p), ("kv_head", ctypes.c_long)]


class KeysT(ctypes.Structure):
    """``struct rowwise_keys_t``: one layer's keys transposed for attention
    (``kv.PreallocatedLayer.keys_transposed``), passed to ``decoder`` beside the ``Layer``s
    (a separate array, so that builds of older sources, which do not read it, still run)."""

    _fields_ = [("keys_t", ctypes.c_void_p), ("kt_head", ctypes.c_long), ("valid", ctypes.c_void_p)]


def declare(lib, kind: str):
    """Give a loaded build of ``rowwise.c`` its C signatures (and ``kind``); returns it."""
    lib.rowwise_linear.restype = None
    lib.rowwise_linear.argtypes = [
        ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
        ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    lib.rowwise_attention.restype = None
    lib.rowwise_attention.argtypes = [
        ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p,
        ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p]   # (older builds ignore the last three)
    lib.rowwise_group.restype = lib.rowwise_bf16_pairs.restype = ctypes.c_int
    try:
        lib.rowwise_block_rows.restype = ctypes.c_int
    except AttributeError:      # a build of an older source (--baseline): its fixed block height
        lib.rowwise_block_rows = lambda: 12 if kind.startswith("avx512") else 6
    try:
        lib.rowwise_attention_rows.restype = ctypes.c_int
    except AttributeError:      # an older build: one row a pass
        lib.rowwise_attention_rows = lambda: 1
    lib.rowwise_rmsnorm.restype = lib.rowwise_silu_mul.restype = None
    lib.rowwise_rmsnorm.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                    ctypes.c_float, ctypes.c_void_p]
    lib.rowwise_silu_mul.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    lib.rowwise_rope.restype = None
    lib.rowwise_rope.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_void_p, ctypes.c_void_p]
    lib.rowwise_decoder.restype = None
    lib.rowwise_decoder.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(Layer), ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_float,
        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]   # (older builds ignore the last)
    if hasattr(lib, "rowwise_decoder_eagle3"):       # builds of older sources have none
        lib.rowwise_decoder_eagle3.restype = None
        lib.rowwise_decoder_eagle3.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(Layer), ctypes.c_int, ctypes.c_int,
            ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    try:
        lib.rowwise_argmax1.restype, lib.rowwise_argmax1.argtypes = ctypes.c_long, [ctypes.c_void_p, ctypes.c_int]
        lib.rowwise_argmax.restype = lib.rowwise_top_probs.restype = None
        lib.rowwise_argmax.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_void_p]
        lib.rowwise_top_probs.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_int,
                                          ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    except AttributeError:      # a build of an older source (--baseline)
        pass
    try:
        lib.rowwise_keep_rows.restype = None
        lib.rowwise_keep_rows.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_int,
                                          ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    except AttributeError:      # a build of an older source (--baseline)
        pass
    try:
        lib.rowwise_node_probs.restype = lib.rowwise_embed.restype = None
        lib.rowwise_node_probs.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_void_p,
                                           ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.rowwise_embed.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_void_p]
    except AttributeError:      # a build of an older source (--baseline)
        pass
    try:
        lib.rowwise_amx.restype, lib.rowwise_amx.argtypes = ctypes.c_int, []
    except AttributeError:      # a build of an older source (--baseline): no tiles
        lib.rowwise_amx = lambda: 0
    try:
        lib.rowwise_block_rows_f32.restype = ctypes.c_int
    except AttributeError:      # a build of an older source (--baseline): one block height for both
        lib.rowwise_block_rows_f32 = lib.rowwise_block_rows
    try:
        lib.rowwise_bf16_unpack.restype = lib.rowwise_vector_width.restype = ctypes.c_int
    except AttributeError:      # a build of an older source (--baseline): widened k-row by k-row
        lib.rowwise_bf16_unpack = lambda: 0
    lib.kind = kind
    return lib
