"""Load and call the batch-invariant CPU kernels of ``rowwise.c``.

``load()`` returns the loaded library, or None where the kernels cannot run here (an x86 CPU
with AVX2 + FMA and a C compiler or a cached build are needed), with ``why_not()`` saying why;
nothing here raises on a machine without them: the engine then keeps its eager forward. The
shared library is compiled once per (source, ISA, compiler) into ``cache_dir()/kernels`` and
loaded from there on every later start.

The package:

    __init__.py     the loaded library (``load``) and one Python function per kernel: each
                    checks its tensors and calls C (``linear``, ``attention``, ``decoder``,
                    ``top_probs``, ...), and ``Packed``, a weight in the layout ``linear`` reads
    builds.py       which ISA this CPU runs (``isa``), compiling ``rowwise.c`` for it and the
                    cache of builds, keyed by a hash of every source file (``build``)
    signatures.py   the C functions' ctypes signatures and the structs ``decoder`` passes
    hugepages.py    memory on 2 MB pages for the packed weights
    rowwise.c       the kernels, with its parts in ``rowwise/`` (one file per kernel family)

The loaded library is this module's ``_lib``: benchmarks swap another build in there to time
two builds in one process (``load_other``).
"""
from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import torch

from app.engine.device import cpu_flags  # noqa: F401  (for scripts)
from app.engine.kernels import builds, hugepages
from app.engine.kernels.builds import (FLAGS, SOURCE, build, command, compiler, isa,  # noqa: F401
                                       library_path, source_key, sources)
from app.engine.kernels.signatures import KeysT, Layer, declare  # noqa: F401

_lib = None
_why_not: str | None = None


def load(log=None):
    """The loaded library, or None (``why_not()`` says why). Tried once per process."""
    global _lib, _why_not
    if _lib is not None or _why_not is not None:
        return _lib
    kind, cc = isa(), compiler()
    if kind is None:
        _why_not = "this CPU has no AVX2 + FMA"
    else:
        try:
            lib = ctypes.CDLL(str(build(kind, cc, log)))
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            _why_not = f"building the kernels failed: {exc}"
        else:
            _lib = declare(lib, kind)
    return _lib


def load_other(source: Path, out: Path):
    """A build of another ``rowwise.c`` (e.g. an earlier revision) for this process's ISA,
    compiled to ``out``: benchmarks swap it in as ``_lib`` to time old and new kernels
    interleaved in one process (scripts/forward_kernels.py --baseline)."""
    kind = isa()
    cmd = command(kind, compiler(), out)
    cmd[cmd.index(str(builds.SOURCE))] = str(source)
    subprocess.run(cmd, check=True, capture_output=True)
    return declare(ctypes.CDLL(str(out)), kind)


def why_not() -> str | None:
    """Why the kernels are unavailable (after ``load``), or None."""
    return _why_not


def reset() -> None:
    """Forget the load attempt (tests that simulate a missing compiler)."""
    global _lib, _why_not
    _lib, _why_not = None, None


def keep_rows_plan(buffers: list[torch.Tensor]) -> tuple | None:
    """What ``keep_rows`` passes to C for these KV buffers (their pointers and geometry), or
    None unless the kernels are already loaded and every buffer is a contiguous float32 CPU
    tensor (1, heads, capacity, d) of one shape. Checking 60 buffers and listing their
    pointers cost ~0.1 ms, so ``kv.keep_positions`` keeps the plan while the buffers stay."""
    if _lib is None or not buffers or not hasattr(_lib, "rowwise_keep_rows"):
        return None
    first = buffers[0]
    if first.dim() != 4 or first.shape[0] != 1 or first.dtype != torch.float32 or first.device.type != "cpu" \
            or not all(b.shape == first.shape and b.dtype == first.dtype and b.device == first.device
                       and b.is_contiguous() for b in buffers):
        return None
    _, heads, capacity, d = first.shape
    pointers = (ctypes.c_void_p * len(buffers))(*[b.data_ptr() for b in buffers])
    return pointers, len(buffers), capacity * d, heads, d


def keep_rows(buffers: list[torch.Tensor], start: int, offsets: list[int], plan: tuple | None = None) -> bool:
    """In each KV buffer (1, heads, capacity, d), move row ``start + offsets[j]`` to
    ``start + j`` (``offsets`` ascending): ``kv.keep_positions``'s compaction in one C call
    for all layers. ``plan``: ``keep_rows_plan(buffers)``, if already made. Returns False,
    having done nothing, where the C call cannot take the buffers (``keep_rows_plan``)."""
    plan = plan or keep_rows_plan(buffers)
    if plan is None:
        return False
    pointers, nbuf, head_stride, heads, d = plan
    moves = (ctypes.c_int * len(offsets))(*offsets)
    _lib.rowwise_keep_rows(pointers, nbuf, head_stride, heads, d, start, moves, len(offsets))
    return True


def _rows_of(x: torch.Tensor, symbol: str) -> torch.Tensor | None:
    """x as (n, V) float32 CPU rows with unit stride on V, or None where ``symbol`` of the
    loaded library cannot take it (not loaded, another dtype or device, an older build)."""
    if _lib is None or not hasattr(_lib, symbol) or x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() > 2:
        return None
    rows = x.reshape(1, -1) if x.dim() == 1 else x
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def argmax(row: torch.Tensor) -> int | None:
    """The index of the largest value of a row (V,): torch.argmax's answer (the first maximum;
    a NaN counts as the largest), ~10 us for 49,152 logits with the call where torch takes
    ~55 us on one core. None where the kernels cannot run it (not loaded, or not a contiguous float32 CPU
    row): use torch."""
    if _lib is None or row.dtype != torch.float32 or row.device.type != "cpu" or row.dim() != 1 \
            or row.stride(0) != 1 or not hasattr(_lib, "rowwise_argmax1"):
        return None
    return _lib.rowwise_argmax1(row.data_ptr(), row.shape[0])


def top_probs(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Softmax's k largest probabilities of each row of logits (n, V) and their indices, best
    first (the earlier index on a tie), and each row's logsumexp: (n, k) float32, (n, k) int64,
    (n,) float32. One pass per row in C where torch's topk + logsumexp took ~45 us for 8,192
    logits. None where the kernels cannot run it (use torch)."""
    rows = _rows_of(x, "rowwise_top_probs")
    if rows is None:
        return None
    n, V = rows.shape
    k = min(k, V)
    q = torch.empty(n, k, device="cpu")          # device: the default device may be another (a test's 'meta')
    idx, lse = torch.empty(n, k, dtype=torch.int64, device="cpu"), torch.empty(n, device="cpu")
    _lib.rowwise_top_probs(rows.data_ptr(), n, rows.stride(0), V, k, q.data_ptr(), idx.data_ptr(), lse.data_ptr())
    return q, idx, lse


def node_probs(x: torch.Tensor, rows: list[int], tokens: list[int]) -> list[float] | None:
    """exp(x[rows[i], tokens[i]] - logsumexp(x[rows[i]])) for each i: the softmax probability
    of each token in its row of logits x (n, V), as a list, in one C call (the step record's
    p of every node). None where the kernels cannot run it (use torch)."""
    x = _rows_of(x, "rowwise_node_probs")
    if x is None:
        return None
    n, V = x.shape
    N = len(rows)
    assert N == len(tokens) and all(0 <= r < n for r in rows) and all(0 <= t < V for t in tokens)
    lse, p = (ctypes.c_float * n)(), (ctypes.c_float * N)()
    _lib.rowwise_node_probs(x.data_ptr(), n, x.stride(0), V, (ctypes.c_int * N)(*rows), (ctypes.c_long * N)(*tokens),
                            N, lse, p)
    return list(p)


def embed(table: torch.Tensor, ids: list[int]) -> torch.Tensor | None:
    """table[ids] as (n, H) float32: an embedding lookup in one C call where torch's
    index_select and conversion took two. None where the kernels cannot run it (not loaded,
    an older build, a table that is not a contiguous float32 or bfloat16 CPU matrix)."""
    if _lib is None or not hasattr(_lib, "rowwise_embed") or table.device.type != "cpu" or table.dim() != 2 \
            or table.dtype not in (torch.float32, torch.bfloat16) or not table.is_contiguous():
        return None
    V, H = table.shape
    n = len(ids)
    if not all(0 <= i < V for i in ids):
        raise IndexError(f"token ids out of range for an embedding of {V} rows: {ids}")
    out = torch.empty(n, H, device="cpu")
    _lib.rowwise_embed(table.data_ptr(), int(table.dtype == torch.bfloat16), (ctypes.c_long * n)(*ids), n, H,
                       out.data_ptr())
    return out


def group() -> int:
    """Output columns per packed group (``rowwise.c``'s G): 48 with AVX-512, 24 with AVX2."""
    return (_lib or load()).rowwise_group()


def amx() -> bool:
    """Whether this process's bfloat16 linears run on AMX tiles (a Sapphire Rapids or later
    Xeon whose kernel granted the tile state; ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`` turns
    them off)."""
    lib = _lib or load()
    return bool(lib is not None and lib.rowwise_amx())


def block_rows(bf16: bool = True) -> int:
    """Rows of x in one register block (``rowwise.c``'s MB): 8 with AVX-512, 4 with AVX2, or
    in one AMX tile: 16 (bfloat16 weights only). A linear over at most this many rows reads
    its weight once; more rows read it again (from the cache) per further block."""
    lib = _lib or load()
    return lib.rowwise_block_rows() if bf16 else lib.rowwise_block_rows_f32()


F32, BF16, INT8 = 0, 1, 2        # ``Packed.format``: rowwise.c's W_F32, W_BF16, W_I8


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: (q (N, K) int8, scale (N,) float32), weight ≈ q * scale[:, None],
    the scale a row's largest magnitude / 127 (an all-zero row gets scale 1)."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


class Packed:
    """A linear layer's weight (N, K) packed for ``linear``: groups of G output columns,
    N padded with zero rows to a multiple of G, each group k-major: (G, K) -> (K, G) in
    float32. bfloat16 stays bfloat16, with k in pairs (K padded to even) in the layout this
    build's kernel reads: (K/2, G, 2) for bfloat16 dot products, or shuffled within 128-bit
    lanes for widening in registers (``rowwise.c`` block_bf16).

    ``int8=True`` (a draft head's weights: they propose tokens, the target decides them)
    stores ``quantize_int8(weight)`` instead: the padded columns' float32 scales, then the
    int8 groups laid out as float32's, half the bytes of bfloat16."""

    def __init__(self, weight: torch.Tensor, int8: bool = False):
        N, K = weight.shape
        lib = _lib or load()
        g = lib.rowwise_group()
        w = weight.detach()
        if N % g:
            w = torch.cat([w, w.new_zeros(g - N % g, K)])      # new_zeros: on w's device
        self.out_features, self.in_features = N, K
        if int8:
            if not hasattr(lib, "rowwise_int8"):
                raise RuntimeError("this build of the kernels has no int8 weights")
            q, scale = quantize_int8(w)
            packed = torch.cat([scale.view(torch.uint8), q.view(-1, g, K).transpose(1, 2).reshape(-1).view(torch.uint8)])
            self.format = INT8
            self.data = hugepages.to_huge(packed)
            return
        bf16 = w.dtype == torch.bfloat16
        self.format = BF16 if bf16 else F32
        lead = 0
        pairs = bf16 and (lib.rowwise_bf16_pairs() or lib.rowwise_bf16_unpack())
        if pairs and K % 2:                                    # k in pairs: K padded to even
            w = torch.cat([w, w.new_zeros(w.shape[0], 1)], dim=1)
        if bf16 and lib.rowwise_bf16_pairs():
            # native bfloat16 dot products read k in pairs: (N/G, K/2, G, 2)
            packed = w.view(-1, g, w.shape[1] // 2, 2).permute(0, 2, 1, 3)
        elif bf16 and lib.rowwise_bf16_unpack():
            # each k-pair as GV chunks of (VW/4 lanes, 2 k, 4 columns): VPUNPCKHWD widens a
            # chunk's upper words in place, its lower words from a load 4 words early
            vw = lib.rowwise_vector_width()
            packed = (w.view(-1, g // vw, vw // 4, 4, w.shape[1] // 2, 2)   # (N/G, GV, q, e, K/2, s)
                      .permute(0, 4, 1, 2, 5, 3))                           # (N/G, K/2, GV, q, s, e)
            lead = 16           # zeros in front (32 bytes): the first early load stays in the buffer
            packed = torch.cat([packed.new_zeros(lead), packed.reshape(-1)])
        else:
            packed = w.view(-1, g, K).transpose(1, 2)                  # (N/G, K, G)
        # on 2 MB pages, next to the weight packed before it (a forward reads them in that order)
        self.data = hugepages.to_huge(packed)[lead:]


def linear(x: torch.Tensor, weight: Packed) -> torch.Tensor:
    """``x @ W.T`` in float32, each row's bits independent of the other rows.

    x (..., K) float32 with unit stride on K; ``weight`` a ``Packed`` (N, K).
    Returns (..., N) float32."""
    K, N = weight.in_features, weight.out_features
    rows = x.reshape(-1, K)
    if rows.stride(-1) != 1 or (rows.shape[0] > 1 and rows.stride(0) < K):
        rows = rows.contiguous()
    M = rows.shape[0]
    out = torch.empty(M, N, dtype=torch.float32, device="cpu")
    (_lib or load()).rowwise_linear(rows.data_ptr(), rows.stride(0) if M > 1 else K, M, weight.data.data_ptr(),
                        weight.format, N, K, out.data_ptr(), N, torch.get_num_threads())
    return out.view(*x.shape[:-1], N)


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
              scale: float) -> torch.Tensor:
    """Softmax attention of each query row over the keys it may see, row- and head-wise.

    q (n, Hq, d) float32 with unit stride on d; keys, values (Hkv, L, d) with the same
    layout as each other, unit strides on d and L·d; mask (n, L) bool or uint8 (nonzero =
    visible) or None (causal over the last n keys). The keys are transposed for this call
    (``decoder`` reads a copy kept beside the cache instead; the same arithmetic).
    Returns (n, Hq·d) float32."""
    n, Hq, d = q.shape
    Hkv, L, _ = keys.shape
    assert keys.stride() == values.stride() and keys.stride()[1:] == (d, 1) and q.stride(-1) == 1
    threads, lib = torch.get_num_threads(), _lib or load()
    out = torch.empty(n, Hq * d, dtype=torch.float32, device="cpu")
    scratch = torch.empty(threads, lib.rowwise_attention_rows() * Hq // Hkv, L + 16,    # (threads, rows a pass x group, L + 16)
                          dtype=torch.float32, device="cpu")
    if mask is not None and (mask.dtype != torch.uint8 or not mask.is_contiguous()):
        mask = mask.to(torch.uint8).contiguous()
    lib.rowwise_attention(q.data_ptr(), q.stride(0), q.stride(1), keys.data_ptr(), values.data_ptr(),
                          keys.stride(0), n, Hq, Hkv, d, L, mask.data_ptr() if mask is not None else None,
                          float(scale), out.data_ptr(), Hq * d, scratch.data_ptr(), threads, None, 0, None)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm of each row of x (n, H) float32 contiguous; weight (H,) float32."""
    n, H = x.shape
    out = torch.empty_like(x)
    (_lib or load()).rowwise_rmsnorm(x.data_ptr(), n, H, weight.data_ptr(), float(eps), out.data_ptr())
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up from the [gate; up] projection (n, 2I) float32 contiguous -> (n, I)."""
    n, two_i = gate_up.shape
    out = torch.empty(n, two_i // 2, dtype=torch.float32, device="cpu")
    (_lib or load()).rowwise_silu_mul(gate_up.data_ptr(), n, two_i // 2, out.data_ptr())
    return out


def rope_(qkv: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, in place, on the first ``heads`` heads of each row of the
    [q; k; v] projection ``qkv`` (n, ·) float32 contiguous; cos, sin (n, head_dim) float32
    contiguous. Returns ``qkv``."""
    assert head_dim <= 1024 and qkv.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
    n = qkv.shape[0]
    (_lib or load()).rowwise_rope(qkv.data_ptr(), n, qkv.stride(0), heads, head_dim, cos.data_ptr(), sin.data_ptr())
    return qkv


def decoder(x: torch.Tensor, layers, heads: int, kv_heads: int, head_dim: int, inner: int,
            cos: torch.Tensor, sin: torch.Tensor, cached: int, mask: torch.Tensor | None,
            tap: list[int] | None, taps: torch.Tensor | None, final_norm: torch.Tensor | None,
            final_eps: float, keys_t=None) -> torch.Tensor:
    """The whole decoder stack over n rows in one call (``rowwise_decoder``): per layer
    RMSNorm, [q; k; v], RoPE, the new keys and values written into each layer's cache buffers
    at positions [cached, cached + n), attention, o-projection + residual, RMSNorm, SwiGLU MLP
    + residual; then the final RMSNorm (none if ``final_norm`` is None; nor the input norm
    of a layer whose ``norm1`` is NULL: an EAGLE head's layer). The same kernels in the same
    order as one call each.

    x (n, H) float32 contiguous, the embeddings (overwritten with the residual stream);
    layers a ``Layer`` array with its cache fields set; cos, sin (n, d) float32 contiguous;
    mask (n, cached + n) uint8 contiguous or None (causal); tap (len(layers),) -1 or a slot,
    taps (n, slots·H) float32 contiguous receiving the tapped layers' inputs; keys_t a
    ``KeysT`` array, one per layer, or None (attention transposes the keys each call).
    Returns (n, H) float32."""
    n, H = x.shape
    assert x.is_contiguous() and x.dtype == torch.float32
    assert cos.shape == sin.shape == (n, head_dim) and cos.is_contiguous() and sin.is_contiguous()
    assert (taps is None) == (not tap) and (taps is None or (taps.is_contiguous() and taps.shape[0] == n
                                                            and taps.shape[1] >= (max(tap) + 1) * H))
    assert mask is None or (mask.dtype == torch.uint8 and mask.is_contiguous() and mask.shape == (n, cached + n))
    out = torch.empty_like(x)
    tap_arr = (ctypes.c_int * len(layers))(*tap) if tap else None
    (_lib or load()).rowwise_decoder(
        x.data_ptr(), n, layers, len(layers), H, heads, kv_heads, head_dim, inner, cos.data_ptr(), sin.data_ptr(),
        cached, mask.data_ptr() if mask is not None else None, tap_arr,
        taps.data_ptr() if taps is not None else None, taps.stride(0) if taps is not None else 0,
        final_norm.data_ptr() if final_norm is not None else None, float(final_eps), out.data_ptr(),
        torch.get_num_threads(), keys_t)
    return out


def has_eagle3_layer() -> bool:
    """Whether this build runs EAGLE-3's draft layer in one call (``decoder_eagle3``)."""
    return hasattr(_lib or load(), "rowwise_decoder_eagle3")


def decoder_eagle3(x: torch.Tensor, emb: torch.Tensor, layer, heads: int, kv_heads: int, head_dim: int, inner: int,
                   cos: torch.Tensor, sin: torch.Tensor, cached: int, mask: torch.Tensor | None,
                   norm_emb: torch.Tensor, eps_emb: float, keys_t=None) -> torch.Tensor:
    """EAGLE-3's draft layer over n rows in one call (``rowwise_decoder_eagle3``): ``decoder``'s
    one layer, except that q, k and v read [RMSNorm(emb; norm_emb); RMSNorm(x; the layer's
    norm1)] (n, 2H) and x stays the residual (``heads.eagle3.Eagle3Layer``); no final norm.

    x (n, H) float32 contiguous, the fused features g or the head's own state (not
    overwritten); emb (n, H) float32 contiguous, the token embeddings; ``layer`` a one-element
    ``Layer`` array with its cache fields set and ``qkv`` packed (N, 2H). Returns (n, H) float32."""
    n, H = x.shape
    assert x.is_contiguous() and x.dtype == torch.float32 and emb.shape == (n, H) and emb.is_contiguous() \
        and emb.dtype == torch.float32
    assert cos.shape == sin.shape == (n, head_dim) and cos.is_contiguous() and sin.is_contiguous()
    assert mask is None or (mask.dtype == torch.uint8 and mask.is_contiguous() and mask.shape == (n, cached + n))
    x = x.clone()                                   # the C side overwrites it with the residual stream
    out = torch.empty_like(x)
    (_lib or load()).rowwise_decoder_eagle3(
        x.data_ptr(), emb.data_ptr(), n, layer, H, heads, kv_heads, head_dim, inner, cos.data_ptr(), sin.data_ptr(),
        cached, mask.data_ptr() if mask is not None else None, norm_emb.data_ptr(), float(eps_emb), out.data_ptr(),
        torch.get_num_threads(), keys_t)
    return out
