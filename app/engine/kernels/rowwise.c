/* Batch-invariant CPU kernels for the target's decode/verify forward.
 *
 * Why by hand: a decode step multiplies a handful of rows (1 token, or the root plus a
 * draft tree) by every weight of the model. Such a step is bound by reading the weights,
 * so it should cost about one pass over them whatever the number of rows. MKL's small-M
 * sgemm does not do that (it reads the weights about once per row for 2-3 rows), and no
 * library kernel promises the second property the engine needs: that a row's result has
 * the same bits whether it is computed alone or beside others. Without it a greedy EAGLE
 * run and plain decoding of the same model part after a near-tie (the tree's rows round
 * differently from the single token's), which is what "lossless" forbids.
 *
 * Every kernel here computes each output element with one fixed sequence of operations
 * that depends on the problem (K, head_dim, the row's own keys) and never on the number of
 * rows, on which row it is, or on the number of threads:
 *
 *   linear     y[m][n] = one multiply-add chain over k in order (see below). Rows are
 *              processed in register blocks of up to MB (the weights are read once per
 *              block and its rows reuse them from registers); the arithmetic per element
 *              is the same in every block shape. On AMX, bfloat16 rows go in tiles of 16
 *              (see groups_amx).
 *   attention  for each (row, head): scores in key order (each one FMA chain over the head
 *              dimension, read from a transposed copy of the keys), max, exp, sum in key
 *              order, output accumulated in key order; one (row, head) never looks at
 *              another, and keys a row may not see contribute exactly nothing.
 *   rmsnorm, silu_mul, rope   row by row, element by element.
 *   decoder    the whole decoder stack in one call: the kernels above in the order the
 *              per-kernel Python path calls them, on the same data (no new arithmetic).
 *
 * Weights may be float32 or bfloat16 (stored as uint16: the high half of a float32, so the
 * widening is exact). Activations and accumulation are float32; with native bfloat16 dot
 * products (AVX512-BF16) a row is rounded to bfloat16 once before a product. The draft head
 * may also use int8 weights with a float32 scale per output column (``block_i8``): half the
 * bytes of bfloat16 for a model whose numbers only propose tokens, never decide them.
 *
 * Built by app/engine/kernels/__init__.py with gcc, once per CPU kind, for AVX-512 (with or
 * without BF16, with or without AMX tiles) or AVX2 + FMA (chosen at run time), and called
 * through ctypes.
 */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- a 16-float vector on either ISA ------------------------------------------------ */
#if defined(__AVX512F__)
typedef __m512 v16;
static inline v16 v_zero(void) { return _mm512_setzero_ps(); }
static inline v16 v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline v16 v_set1(float a) { return _mm512_set1_ps(a); }
static inline v16 v_fma(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
static inline void v_store(float *p, v16 a) { _mm512_storeu_ps(p, a); }
static inline v16 v_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
static inline v16 v_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
static inline v16 v_div(v16 a, v16 b) { return _mm512_div_ps(a, b); }
static inline v16 v_neg(v16 a) { return _mm512_sub_ps(_mm512_setzero_ps(), a); }
static inline v16 v_max(v16 a, v16 b) { return _mm512_max_ps(a, b); }
static inline float v_hmax(v16 a) { return _mm512_reduce_max_ps(a); }
#else
typedef struct { __m256 lo, hi; } v16;
static inline v16 v_zero(void) { v16 r = {_mm256_setzero_ps(), _mm256_setzero_ps()}; return r; }
static inline v16 v_load(const float *p) { v16 r = {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; return r; }
static inline v16 v_set1(float a) { v16 r = {_mm256_set1_ps(a), _mm256_set1_ps(a)}; return r; }
static inline v16 v_fma(v16 a, v16 b, v16 c) {
    v16 r = {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
    return r;
}
static inline void v_store(float *p, v16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
static inline v16 v_add(v16 a, v16 b) { v16 r = {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; return r; }
static inline v16 v_mul(v16 a, v16 b) { v16 r = {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; return r; }
static inline v16 v_div(v16 a, v16 b) { v16 r = {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; return r; }
static inline v16 v_neg(v16 a) { return v_add(v_zero(), v_mul(a, v_set1(-1.0f))); }
static inline v16 v_max(v16 a, v16 b) { v16 r = {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; return r; }
static inline float v_hmax(v16 a) {
    __m256 m8 = _mm256_max_ps(a.lo, a.hi);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}
#endif

/* The fixed lane tree: (l, l+8), then (l, l+4), (l, l+2), (l, l+1), in shuffles. */
#if defined(__AVX512F__)
static inline float v_sum(v16 a) {
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
#else
static inline float v_sum(v16 a) {
    __m256 s8 = _mm256_add_ps(a.lo, a.hi);
#endif
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    return _mm_cvtss_f32(s1);
}

/* exp(x) lane by lane: x = n ln2 + r, |r| <= ln2/2, e^r by a degree-6 polynomial (Horner,
 * FMA), 2^n through the exponent bits. Relative error ~2e-7 on [-87, 88]; below -87 it
 * returns 0. The same instruction sequence for every lane, so a value does not depend on
 * where in a vector it sits. */
#if !defined(__AVX512F__)
/* AVX2: the same steps in ymm intrinsics. gcc left the lane loop below scalar for the
 * two-ymm v16 (3.4 ns an element against 0.31 with AVX-512): on an AVX2 CPU the softmax
 * numerators and SwiGLU of a forward spent ~0.6 ms a row at 500 cached positions. Each
 * step is the loop's, element for element, so the bits are the same on both ISAs:
 * min(88, x) and max(-87, v) keep a NaN as the loop's comparisons do, the rounding is
 * to nearest even as nearbyintf's, and every fmaf is one FMA. */
static inline __m256 exp8(__m256 x) {
    const __m256 log2e = _mm256_set1_ps(1.44269504f), ln2_hi = _mm256_set1_ps(0.693359375f),
                 ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
    __m256 v = _mm256_max_ps(_mm256_set1_ps(-87.0f), _mm256_min_ps(_mm256_set1_ps(88.0f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 neg_n = _mm256_sub_ps(_mm256_setzero_ps(), n);
    __m256 r = _mm256_fmadd_ps(neg_n, ln2_hi, v);
    r = _mm256_fmadd_ps(neg_n, ln2_lo, r);
    __m256 p = _mm256_set1_ps(1.3981999507e-3f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 out = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_blendv_ps(out, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ));
}
static inline v16 v_exp(v16 x) { v16 r = {exp8(x.lo), exp8(x.hi)}; return r; }
#else
static inline v16 v_exp(v16 x) {
    const float LOG2E = 1.44269504f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
    float xs[16], out[16];
    v_store(xs, x);
    for (int l = 0; l < 16; l++) {                 /* branch-free: gcc vectorises it */
        float v = xs[l] > 88.0f ? 88.0f : xs[l];
        v = v < -87.0f ? -87.0f : v;
        float n = nearbyintf(v * LOG2E);
        float r = fmaf(-n, LN2_HI, v);
        r = fmaf(-n, LN2_LO, r);
        float p = 1.3981999507e-3f;
        p = fmaf(p, r, 8.3334519073e-3f);
        p = fmaf(p, r, 4.1665795894e-2f);
        p = fmaf(p, r, 1.6666665459e-1f);
        p = fmaf(p, r, 5.0000001201e-1f);
        p = fmaf(p, r, 1.0f);
        p = fmaf(p, r, 1.0f);
        int32_t e = ((int32_t)n + 127) << 23;
        float scale;
        memcpy(&scale, &e, 4);
        out[l] = xs[l] < -87.0f ? 0.0f : p * scale;
    }
    return v_load(out);
}
#endif

/* ---- linear ------------------------------------------------------------------------- */
/* The weight W (N, K) is packed once (``pack`` in __init__.py) into groups of G output
 * columns, each group stored k-major: P[g][k][c] = W[g*G + c][k], zero rows padding N up to
 * a multiple of G. Reading a group is then one sequential stream, and the kernel needs no
 * horizontal sums: lane c of the vector at (g, k) belongs to output column g*G + c.
 *
 *   y[m][n] = fma(x[m][K-1], W[n][K-1], ... fma(x[m][1], W[n][1], x[m][0] * W[n][0] + 0))
 *
 * one chain in ascending k for every element, whatever the block it falls in. A block is
 * MB rows of x against one group: MB x GV accumulators, GV weight vectors loaded once per
 * k and reused by every row from registers. */
/* Block shape: GV weight vectors per group (G = VW * GV output columns) by MB rows of x.
 * An FMA takes 4 cycles and two issue per cycle, so a block needs at least 8 independent
 * accumulator chains to keep both FMA units busy. With GV = 3, four rows (an EAGLE chain or
 * a small tree) already have 12 chains and eight rows on AVX-512 24, in one block, and a
 * k-row of a group is 3 vectors that stream on. Against GV = 2 (MB 6 / 12) it is faster at
 * 4 and 8 rows on both ISAs and no slower at one (scripts/linear_blocks.py sweeps shapes;
 * numbers in benchmarks/fast-forward/linear-block-shape.md). The shape changes only which
 * accumulators sit in registers together, never an element's chain, so the output bits do
 * not depend on it. -DGV=.. -DMB=.. (both) override it, for the sweep. */
#ifndef GV
#define GV 3
#if defined(__AVX512F__)
#define MB 8                             /* 24 accumulators + 3 weights + 1 broadcast of 32 zmm */
#else
#define MB 4                             /* 12 accumulators + 3 weights + 1 broadcast of 16 ymm */
#endif
#endif
#if defined(__AVX512F__)
typedef v16 vn;                          /* the native vector is the 16-float one */
#define VW 16
#define n_zero v_zero
#define n_load v_load
#define n_set1 v_set1
#define n_fma v_fma
#define n_store v_store
/* bfloat16 -> float32: a zero word below each of the 4 lower / upper words of every 128-bit lane */
static inline vn n_bf16_lo(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), _mm512_loadu_si512((const void *)p)));
}
static inline vn n_bf16_hi(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), _mm512_loadu_si512((const void *)p)));
}
#else
typedef __m256 vn;                       /* 8 floats */
#define VW 8
static inline vn n_zero(void) { return _mm256_setzero_ps(); }
static inline vn n_load(const float *p) { return _mm256_loadu_ps(p); }
static inline vn n_set1(float a) { return _mm256_set1_ps(a); }
static inline vn n_fma(vn a, vn b, vn c) { return _mm256_fmadd_ps(a, b, c); }
static inline void n_store(float *p, vn a) { _mm256_storeu_ps(p, a); }
/* A zero made where it is used: the CPU drops the zero idiom at rename (no port, no
 * latency), and being volatile it is not hoisted, so it never holds one of the 16 ymm
 * registers across the loop (hoisted, gcc spilled two accumulators of a 4 x 3 block). */
static inline __m256i fresh_zero(void) { __m256i z; __asm__ volatile("vpxor %0, %0, %0" : "=x"(z)); return z; }
static inline vn n_bf16_hi(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_unpackhi_epi16(fresh_zero(), _mm256_loadu_si256((const __m256i *)p)));
}
#endif
#define G (VW * GV)

/* Ask for the weights PREFETCH_BYTES ahead of the loads. With a few rows per block the
 * hardware prefetcher alone left the loads and the FMAs unoverlapped: T(4) cost 1.7-1.8x
 * T(1) under AVX2 emulation, 1.16-1.18x with a prefetch (benchmarks/fast-forward/
 * prefetch-avx2.md). The distance is in bytes, a few times what one core has in flight
 * (~9 GB/s x a few hundred ns on the 2-vCPU VMs): 32 k-rows (1.5 KB of AVX2 bfloat16) was
 * too short there, and 6 KB (128 such k-rows, 64 of float32) made T(1)..T(4) faster in every
 * interleaved round (second-block.md). Locality 3 (into L1 and L2): as a non-temporal hint it
 * kept the lines out of L2, so a second row block re-read its group from memory, and on
 * AVX-512 it made T(8) slower; with locality 3 it makes AVX-512 faster too (float32 T(8)
 * 47.2 -> 41.6 ms, 2 threads). A prefetch is only a hint: no arithmetic changes, exactness
 * is untouched. */
#define PREFETCH_BYTES 6144
#define PREFETCH_WEIGHTS_AT(p, LOC) __builtin_prefetch((const char *)(p) + PREFETCH_BYTES, 0, LOC)
/* A target's weights (float32, bfloat16) are read once a forward, 270-540 MB that pass through
 * the caches every step and push out what the step reads again: the KV cache (41 MB at 900
 * positions), the draft head's weights (~9 MB in int8), the activations. Where one row block
 * covers the step's rows, so that nothing reads a group again, they are asked for as
 * non-temporal (locality 0). End to end, interleaved with the previous build, the trees ran
 * 1-4% faster natively and 2% under AVX2, plain decoding 0-7% and 1-4%, drafting up to
 * 0.09 ms less a step, in every run (benchmarks/fast-forward/streamed-weights.md). With more
 * rows, later blocks re-read the group from L2, which a non-temporal line may have left (the
 * Xeon's T(8) was slower so), and the draft head's int8 weights, read again next step, keep
 * locality 3. */
#define STREAM_WEIGHTS(p, stream) \
    do { if (stream) PREFETCH_WEIGHTS_AT(p, 0); else PREFETCH_WEIGHTS_AT(p, 3); } while (0)
/* Measured on AMD only. On the Intel Xeon with AMX a non-temporal prefetch of the weights
 * (there in the tile loop, into L1 only) doubled the forward (adaptive.md), so other vendors
 * keep locality 3 everywhere. */
static int weights_nt = -1;
static int stream_weights(void) {
    if (weights_nt < 0) {
        unsigned a, b, c, d;
        weights_nt = __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u;   /* "Auth"enticAMD */
    }
    return weights_nt;
}
/* ...for every 64-byte line of a step's BYTES (a compile-time constant, so the loop unrolls).
 * A step of an AVX-512 block reads 3 lines (GV vectors of 64 bytes); one prefetch a step left
 * two of every three lines to the hardware prefetcher. On a Zen 5 EPYC, whose cores each read
 * 2-3 times as fast as the Xeon's, the forward's T(8) with native bfloat16 went from 9.3 to
 * 7.4 ms with all three asked for, interleaved (benchmarks/fast-forward/prefetch-every-line.md). */
#if VW == 16
#define PREFETCH_STEP(p, BYTES, stream) \
    do { for (int l_ = 0; l_ < (BYTES); l_ += 64) STREAM_WEIGHTS((const char *)(p) + l_, stream); } while (0)
#else
/* AVX2: a step is 24-96 bytes, and one prefetch a step is what prefetch-avx2.md measured; a
 * second for float32's 96-byte step measured no better under AVX2 emulation (T(1) 15.1
 * against 14.3 ms, T(8) 17.3 against 17.7, interleaved: within the VM's noise) */
#define PREFETCH_STEP(p, BYTES, stream) STREAM_WEIGHTS(p, stream)
#endif
/* With more rows than one block (MB), a group's later blocks read it from the cache; without
 * more, nothing would stream from memory while they compute. So every block of a group also
 * prefetches its share of the next group (groups lie end to end): block j of nb walks the
 * next group's k-rows [j K/nb, (j+1) K/nb) at 1/nb of a k-row a step, and the next group
 * arrives while this one's blocks compute (AVX2 bfloat16 T(8) 32.9 -> 26.4 ms, 2 threads).
 * PREFETCH_NEXT(k) runs at step k of a block, with the block's `next` (its share's start,
 * or NULL) and `next_step` (elements a step, times 256) as the group loop set them. */
#if VW == 16
/* an AVX-512 step is 192 bytes of a group, so a block's share of it (192 / nb) may span 2 lines */
#define PREFETCH_NEXT(k)                                                                  \
    do {                                                                                  \
        if (next) {                                                                       \
            const char *p_ = (const char *)(next + (((long)(k) * next_step) >> 8));       \
            __builtin_prefetch(p_, 0, 3);                                                 \
            __builtin_prefetch(p_ + 64, 0, 3);                                            \
        }                                                                                 \
    } while (0)
#else
#define PREFETCH_NEXT(k) \
    do { if (next) __builtin_prefetch(next + (((long)(k) * next_step) >> 8), 0, 3); } while (0)
#endif

/* A block's accumulators to rows [0, mb) of y; the last group stores only its ncols columns. */
static inline __attribute__((always_inline)) void store_block(float *y, long ldy, vn acc[MB][GV], int mb,
                                                              int ncols) {
    for (int i = 0; i < mb; i++) {
        if (ncols == G) {
            for (int v = 0; v < GV; v++) n_store(y + i * ldy + v * VW, acc[i][v]);
        } else {                         /* the last group: padding columns are not stored */
            float tmp[G];
            for (int v = 0; v < GV; v++) n_store(tmp + v * VW, acc[i][v]);
            memcpy(y + i * ldy, tmp, sizeof(float) * ncols);
        }
    }
}

int rowwise_group(void) { return G; }
int rowwise_vector_width(void) { return VW; }

/* One k-row of a block: GV weight vectors (WEIGHT, an expression of v), each loaded once
 * and multiply-added into every row's accumulators from registers. */
#define BLOCK_STEP(KK, WEIGHT)                                                                \
    {                                                                                         \
        vn wv[GV];                                                                            \
        for (int v = 0; v < GV; v++) wv[v] = (WEIGHT);                                        \
        for (int i = 0; i < mb; i++) {                                                        \
            vn xk = n_set1(x[i * ldx + (KK)]);                                                \
            for (int v = 0; v < GV; v++) acc[i][v] = n_fma(xk, wv[v], acc[i][v]);             \
        }                                                                                     \
    }

/* One block: rows [0, mb) of x against one packed group (K x G) of weights stored as WT, one
 * k-row of G after another, LOAD(p) giving the VW weights at p as floats. `mb` is a
 * compile-time constant at every call site (the switch below), so the loops unroll into
 * registers. */
#define DEFINE_BLOCK(NAME, WT, LOAD)                                                          \
static inline __attribute__((always_inline)) void NAME(                                       \
        const float *x, long ldx, const WT *wg, float *y, long ldy, int K, int ncols,         \
        const int mb, const WT *next, long next_step, int stream) {                           \
    vn acc[MB][GV];                                                                           \
    for (int i = 0; i < mb; i++)                                                              \
        for (int v = 0; v < GV; v++) acc[i][v] = n_zero();                                    \
    for (int k = 0; k < K; k++) {                                                             \
        PREFETCH_STEP(wg + (long)k * G, G * (int)sizeof(WT), stream);                          \
        PREFETCH_NEXT(k);                                                                     \
        BLOCK_STEP(k, LOAD(wg + (long)k * G + v * VW))                                        \
    }                                                                                         \
    store_block(y, ldy, acc, mb, ncols);                                                      \
}
DEFINE_BLOCK(block_f32, float, n_load)

/* bfloat16 weights widened in registers (CPUs without bfloat16 dot products). A bfloat16 is
 * the upper half of a float32, so a weight widens exactly by placing a zero word below it.
 * VPUNPCKHWD with a zero vector does that for the 4 upper words of each 128-bit lane, one
 * shuffle-port instruction straight from memory: the FMA ports do only FMAs (a zero-extend
 * and a 16-bit shift took one FMA-port slot per weight vector and block, 1 in 5 of a 4-row
 * block's). The weights are packed for it (``Packed`` in __init__.py): a group's k-rows in
 * pairs (K padded to even), each pair GV chunks of 2 VW weights,
 *   chunk[v][q][s][e] = W[g*G + v*VW + 4q + e][2 kp + s]   (q < VW/4 lanes, s < 2, e < 4).
 * Lane q of a chunk holds its 4 columns of row 2kp in the low half and of row 2kp+1 in the
 * high half: loaded as is, the upper words are row 2kp+1's vector v (and the lower words,
 * by VPUNPCKLWD, row 2kp's: AVX-512); loaded 4 words (8 bytes) early, the upper words are
 * row 2kp's (AVX2; ``Packed`` puts zeros before the first chunk). Each element's chain is
 * the float32 one, k ascending: the bits do not depend on the layout. */
static inline __attribute__((always_inline)) void block_bf16(
        const float *x, long ldx, const uint16_t *wg, float *y, long ldy, int K, int ncols,
        const int mb, const uint16_t *next, long next_step, int stream) {
    vn acc[MB][GV];
    for (int i = 0; i < mb; i++)
        for (int v = 0; v < GV; v++) acc[i][v] = n_zero();
#if defined(__AVX512F__)
    /* 32 registers: a pair's chunks widen twice, low then high words, from aligned loads */
    int k = 0;
    for (; k + 2 <= K; k += 2) {
        const uint16_t *pair = wg + (long)k * G;
        PREFETCH_STEP(pair, 2 * G * 2, stream);
        PREFETCH_NEXT(k);
        BLOCK_STEP(k, n_bf16_lo(pair + v * 2 * VW))
        BLOCK_STEP(k + 1, n_bf16_hi(pair + v * 2 * VW))
    }
    if (k < K) BLOCK_STEP(k, n_bf16_lo(wg + (long)k * G + v * 2 * VW))   /* odd K: the last pair's low words */
#else
    /* 16 registers, all held by a 4 x 3 block: one widening for every row (two in a loop body
     * left gcc spilling accumulators), the upper words loaded 4 words early for an even row */
    const uint16_t *row = wg - 4;
    for (int k = 0; k < K; k++) {
        STREAM_WEIGHTS(row, stream);
        PREFETCH_NEXT(k);
        BLOCK_STEP(k, n_bf16_hi(row + v * 2 * VW))
        row += k & 1 ? 2 * G - 4 : 4;           /* odd k: on to the next pair, 4 words early */
    }
#endif
    store_block(y, ldy, acc, mb, ncols);
}
int rowwise_bf16_unpack(void) { return 1; }

/* int8 weights with one float32 scale per output column (the draft head's: ``Packed`` with
 * int8=True), laid out as float32's, P[g][k][c] = q[g*G + c][k], behind the group's scales:
 *   y[m][n] = scale[n] * fma(x[m][K-1], q[n][K-1], ... fma(x[m][0], q[n][0], 0))
 * An int8 widens exactly to float32 (sign-extend to int32, convert), so each element is the
 * float32 chain over the integers, then one product with its column's scale (in the group
 * loop). Why: drafting reads the head's layer and its LM head once or twice a step, ~18 MB
 * in bfloat16 for SmolLM2's head; int8 halves that, and a draft only proposes tokens (the
 * target's verification decides them), so its rounding changes speed, never output. */
#if defined(__AVX512F__)
static inline vn n_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
#else
static inline vn n_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
#endif
DEFINE_BLOCK(block_i8, int8_t, n_i8)
int rowwise_int8(void) { return 1; }

#define CASE(BLOCK, R) case R: BLOCK(xb, ldx, wg, yb, ldy, K, ncols, R, next, next_step, stream); break;
/* one case per row count 1..MB, each a block unrolled for that many rows */
#define UP_TO_MB(C) C(1) C(2) C(3) C(4) IF_MB_5(C(5) C(6)) IF_MB_7(C(7) C(8)) IF_MB_9(C(9) C(10) C(11) C(12))
#if MB > 4
#define IF_MB_5(x) x
#else
#define IF_MB_5(x)
#endif
#if MB > 6
#define IF_MB_7(x) x
#else
#define IF_MB_7(x)
#endif
#if MB > 8
#define IF_MB_9(x) x
#else
#define IF_MB_9(x)
#endif
#if MB != 4 && MB != 6 && MB != 8 && MB != 12
#error "MB must be 4, 6, 8 or 12 (the row-count cases come in those steps)"
#endif
#define CASE_block_f32(R) CASE(block_f32, R)
#define CASE_block_bf16(R) CASE(block_bf16, R)
#define CASE_block_i8(R) CASE(block_i8, R)

/* Every row block of x against groups [g0, g1): a group stays in the L2 cache while the
 * row blocks pass over it, so a long input (a prefill) still reads the weights once. More
 * rows than one block are split evenly (5 rows of a 4-row block as 3 + 2, not 4 + 1): a
 * block of one row has GV accumulator chains, too few to hide the FMA latency, so it took
 * nearly a full block's time. The split changes which rows share registers, never a chain. */
#define DEFINE_GROUPS(NAME, WT, BLOCK, KROWS, STREAMS)                                        \
static void NAME(const float *x, long ldx, int M, const WT *w, int g0, int g1, int N, int K,  \
                 float *y, long ldy) {                                                        \
    int nb = (M + MB - 1) / MB;                          /* row blocks per group */          \
    int stream = STREAMS && nb == 1 && stream_weights(); /* non-temporal weights (above) */   \
    int per = (M + nb - 1) / nb;                         /* rows a block, at most MB */       \
    long next_step = ((long)G << 8) / nb;                /* elements a step, times 256 */     \
    long kg = (long)KROWS(K) * G;                         /* elements a group */               \
    for (int g = g0; g < g1; g++) {                                                           \
        const WT *wg = w + g * kg;                                                            \
        int ncols = N - g * G < G ? N - g * G : G;                                            \
        for (int m = 0; m < M; m += per) {                                                    \
            const float *xb = x + (long)m * ldx;                                              \
            float *yb = y + (long)m * ldy + (long)g * G;                                      \
            const WT *next = nb > 1 && g + 1 < g1 ? wg + kg + (m / per) * kg / nb : NULL;     \
            switch (M - m < per ? M - m : per) { UP_TO_MB(CASE_##BLOCK) }                    \
        }                                                                                     \
    }                                                                                         \
}

#define K_AS_IS(K) (K)
#define K_EVEN(K) (((K) + 1) & ~1)
DEFINE_GROUPS(groups_f32, float, block_f32, K_AS_IS, 1)
DEFINE_GROUPS(groups_bf16, uint16_t, block_bf16, K_EVEN, 1)    /* k-pairs: K padded to even */
DEFINE_GROUPS(groups_i8, int8_t, block_i8, K_AS_IS, 0)         /* the draft head's: kept */

/* Native bfloat16 (AVX512-BF16): VDPBF16PS multiplies pairs of bfloat16 and adds both
 * products into a float32 lane, twice the multiply-adds of an FMA per instruction. The
 * weight is packed in k-pairs, P[g][k/2][c][2] = W[g*G + c][k .. k+1] (K padded to even), and
 * each row of x is rounded to bfloat16 once (round to nearest even) before the loop. Per
 * element: one chain over ascending k-pairs, as fixed as the float32 one. */
#if defined(__AVX512BF16__)
int rowwise_bf16_pairs(void) { return 1; }

static inline uint16_t f32_to_bf16(float f) {           /* round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline __attribute__((always_inline)) void block_dp(
        const uint32_t *xp, long ldxp, const uint16_t *wg, float *y, long ldy, int Kp, int ncols,
        const int mb, const uint16_t *next, long next_step, int stream) {
    __m512 acc[MB][GV];
    for (int i = 0; i < mb; i++)
        for (int v = 0; v < GV; v++) acc[i][v] = _mm512_setzero_ps();
    for (int k = 0; k < Kp; k++) {
        __m512i wv[GV];
        PREFETCH_STEP(wg + (long)k * G * 2, 2 * G * 2, stream);
        PREFETCH_NEXT(k);
        for (int v = 0; v < GV; v++) wv[v] = _mm512_loadu_si512((const void *)(wg + ((long)k * G + v * VW) * 2));
        for (int i = 0; i < mb; i++) {
            __m512i xk = _mm512_set1_epi32((int)xp[i * ldxp + k]);
            for (int v = 0; v < GV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)xk, (__m512bh)wv[v]);
        }
    }
    store_block(y, ldy, acc, mb, ncols);                /* vn is __m512 on AVX-512 */
}

#define CASE_DP(R) case R: block_dp(xb, Kp, wg, yb, ldy, Kp, ncols, R, next, next_step, stream); break;
static void groups_dp(const uint32_t *xp, int M, const uint16_t *w, int g0, int g1, int N, int Kp,
                      float *y, long ldy) {
    int nb = (M + MB - 1) / MB;                          /* row blocks per group */
    int per = (M + nb - 1) / nb;                         /* rows a block: split evenly, as above */
    int stream = nb == 1 && stream_weights();            /* non-temporal weights (above) */
    long next_step = ((long)G * 2 << 8) / nb;            /* elements a k-pair, times 256 */
    long kg = (long)Kp * G * 2;                          /* elements a group */
    for (int g = g0; g < g1; g++) {
        const uint16_t *wg = w + g * kg;
        int ncols = N - g * G < G ? N - g * G : G;
        for (int m = 0; m < M; m += per) {
            const uint32_t *xb = xp + (long)m * Kp;
            float *yb = y + (long)m * ldy + (long)g * G;
            const uint16_t *next = nb > 1 && g + 1 < g1 ? wg + kg + (m / per) * kg / nb : NULL;
            switch (M - m < per ? M - m : per) { UP_TO_MB(CASE_DP) }
        }
    }
}
#else
int rowwise_bf16_pairs(void) { return 0; }
#endif

/* AMX (Sapphire Rapids and later Xeons): TDPBF16PS multiplies a tile of up to 16 rows by
 * 32 k (16 k-pairs) of bfloat16 against a tile of 16 k-pairs by 16 columns, in one
 * instruction, into a 16 x 16 float32 tile. It reads the same packed weights as VDPBF16PS:
 * a group's k-pairs kp0 .. kp0+15 for columns v*16 .. v*16+15 are 16 rows of 64 bytes, one
 * group row (G columns x 2) apart. With a few rows per step the dot products cost next to
 * nothing beside the weights' reading (a tile of 16 rows costs the same instruction as one
 * row), so a forward over 16 rows costs about one over 1 row: a larger draft tree is nearly
 * free to verify.
 *
 * Rows are processed in tiles of 16 (x padded with zero rows; a step of fewer rows, in one
 * tile of just its rows), columns in GV = 3 tiles of 16, k-pairs in tiles of 16 ascending.
 * The arithmetic of an element is the hardware's
 * fixed sequence over ascending k-pairs, whatever the other rows of its tile hold, so a
 * row's bits do not depend on the rows beside it. They are not VDPBF16PS's bits (the
 * instructions round inside a pair differently), so whether a linear runs on AMX depends
 * on its K alone (whole tiles of 16 k-pairs: K a multiple of 32), never on its rows. */
#if defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_KP 16                        /* k-pairs in a tile: 64 bytes a tile row */
#ifndef AMX_ROWS
#define AMX_ROWS 16                      /* rows of x in a tile (at most 16); -DAMX_ROWS=.. for the tests */
#endif
#define ARCH_REQ_XCOMP_PERM 0x1023       /* Linux: ask to use a dynamically enabled state... */
#define XFEATURE_XTILEDATA 18            /* ...the AMX tile data */
static int amx_granted = -1;             /* -1: not asked yet */
#ifndef AMX_PREFETCH
#define AMX_PREFETCH (4 * AMX_KP * G * 4)     /* bytes: the weights 4 tiles of k-pairs ahead */
#endif

/* 1 when this process may run AMX (Linux grants the tile state on request, once). */
int rowwise_amx(void) {
    if (amx_granted < 0) amx_granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return amx_granted;
}

struct tile_config {                     /* palette 1: 8 tiles, each up to 16 rows of 64 bytes */
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* tiles 0-2: y's columns v*16 .. +15 (`rows` rows of float32); tile 3: `rows` rows of x,
 * 16 k-pairs; tiles 4-6: 16 k-pairs of the weights, 16 columns each. A step of fewer rows
 * than AMX_ROWS configures tiles of just its rows: TDPBF16PS, the x tile's load and the
 * stores then do one row's work for a one-row step instead of 16 (a row's arithmetic is
 * the same in a tile of any height). Against tiles always AMX_ROWS high, the forward's T(1)
 * 21.4 -> 19.5 ms on 2 threads (benchmarks/fast-forward/amx-short-tiles.md). */
static void amx_configure(int rows) {
    struct tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 7; t++) { c.rows[t] = t < 4 ? rows : AMX_KP; c.colsb[t] = 64; }
    _tile_loadconfig(&c);
}

#if G != 48
#error "the AMX path covers a group with three 16-column tiles (GV = 3)"
#endif
/* third j (0..2) of the 16 k-pair rows of a group ahead (AMX_KP * G * 4 bytes, 48 lines) */
#define AMX_PREFETCH_THIRD(ahead, j)                                                          \
    for (int line = (j) * AMX_KP * G * 4 / 3; line < ((j) + 1) * AMX_KP * G * 4 / 3; line += 64) \
        _mm_prefetch((ahead) + line, _MM_HINT_T0)
static void groups_amx(const uint16_t *xp, int M, const uint16_t *w, int g0, int g1, int N, int Kp,
                       float *y, long ldy) {
    amx_configure(M < AMX_ROWS ? M : AMX_ROWS);    /* more rows: whole tiles, x zero-padded */
    float out[AMX_ROWS][G];
    for (int g = g0; g < g1; g++) {
        const uint16_t *wg = w + (long)g * Kp * G * 2;
        int ncols = N - g * G < G ? N - g * G : G;
        for (int m = 0; m < M; m += AMX_ROWS) {
            const uint16_t *xb = xp + (long)m * Kp * 2;
            _tile_zero(0); _tile_zero(1); _tile_zero(2);
            for (int kp = 0; kp < Kp; kp += AMX_KP) {
                const uint16_t *wk = wg + (long)kp * G * 2;
                const char *ahead = (const char *)wk + AMX_PREFETCH;
                /* the 48 lines of a k-pair tile row's prefetch, 16 after each product: issued
                 * in one burst they filled the core's line-fill buffers, and the tile loads
                 * and products waited behind them (perf: half the kernel's samples on the
                 * prefetches); spread out, the forward's T(1) 21.4 -> 20.1 ms on 2 threads */
                _tile_loadd(3, xb + kp * 2, Kp * 4);            /* the rows of x, 16 k-pairs */
                _tile_loadd(4, wk, G * 4);                      /* 16 k-pairs x columns 0..15 */
                _tile_dpbf16ps(0, 3, 4);
                AMX_PREFETCH_THIRD(ahead, 0);
                _tile_loadd(5, wk + 32, G * 4);                 /* columns 16..31 */
                _tile_dpbf16ps(1, 3, 5);
                AMX_PREFETCH_THIRD(ahead, 1);
                _tile_loadd(6, wk + 64, G * 4);                 /* columns 32..47 */
                _tile_dpbf16ps(2, 3, 6);
                AMX_PREFETCH_THIRD(ahead, 2);
            }
            _tile_stored(0, &out[0][0], G * 4);
            _tile_stored(1, &out[0][16], G * 4);
            _tile_stored(2, &out[0][32], G * 4);
            int rows = M - m < AMX_ROWS ? M - m : AMX_ROWS;
            for (int i = 0; i < rows; i++) memcpy(y + (long)(m + i) * ldy + (long)g * G, out[i], sizeof(float) * ncols);
        }
    }
    _tile_release();
}
#else
int rowwise_amx(void) { return 0; }
#define AMX_ROWS MB
#endif
/* Rows a linear reads its weights once for (the larger blocks re-read them from the cache):
 * bfloat16 weights (on AMX tiles where granted), float32 weights. */
int rowwise_block_rows(void) { return rowwise_amx() ? AMX_ROWS : MB; }
int rowwise_block_rows_f32(void) { return MB; }

/* The packed weight's format (``Packed.format``): float32, bfloat16 (uint16), or int8 behind
 * a float32 scale per output column (groups * G of them, then the int8 groups). */
enum { W_F32 = 0, W_BF16 = 1, W_I8 = 2 };

/* y (M, N), row stride ldy  =  x (M, K), row stride ldx  @  W.T, W packed as above in the
 * format wfmt. */
void rowwise_linear(const float *x, long ldx, int M, const void *w, int wfmt, int N, int K,
                    float *y, long ldy, int threads) {
    if (M <= 0) return;                   /* no rows: nothing to write (and no 0-row AMX tile to configure) */
    int groups = (N + G - 1) / G;
    int wbf16 = wfmt == W_BF16;
    if (threads > groups) threads = groups;
    uint16_t *xb = NULL;                  /* native bfloat16: the rows, rounded once, in k-pairs */
    int Kp = (K + 1) / 2;
#if defined(__AMX_BF16__) && defined(__AVX512BF16__)
    int amx = wbf16 && Kp % AMX_KP == 0 && rowwise_amx();
    int Mp = amx && M > AMX_ROWS ? (M + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS : M;   /* whole tiles, zero-padded */
#else
    int amx = 0, Mp = M;
#endif
#if defined(__AVX512BF16__)
    if (wbf16) {
        xb = (uint16_t *)calloc((size_t)Mp * Kp * 2, sizeof(uint16_t));
        for (int i = 0; i < M; i++) {
            int k = 0;
            for (; k + 16 <= K; k += 16)       /* VCVTNEPS2BF16: round to nearest even, as f32_to_bf16 */
                _mm256_storeu_si256((__m256i *)(xb + (long)i * Kp * 2 + k),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + (long)i * ldx + k)));
            for (; k < K; k++) xb[(long)i * Kp * 2 + k] = f32_to_bf16(x[(long)i * ldx + k]);
        }
    }
#endif
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
#ifdef _OPENMP
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        int t = 0, nt = 1;
#endif
        int g0 = (int)((long)groups * t / nt), g1 = (int)((long)groups * (t + 1) / nt);
#if defined(__AMX_BF16__) && defined(__AVX512BF16__)
        if (amx) groups_amx(xb, M, (const uint16_t *)w, g0, g1, N, Kp, y, ldy);
        else
#endif
#if defined(__AVX512BF16__)
        if (xb) groups_dp((const uint32_t *)xb, M, (const uint16_t *)w, g0, g1, N, Kp, y, ldy);
        else
#endif
        if (wfmt == W_I8) {
            const float *scale = (const float *)w;             /* then the int8 groups */
            groups_i8(x, ldx, M, (const int8_t *)(scale + (long)groups * G), g0, g1, N, K, y, ldy);
            int n0 = g0 * G, n1 = g1 * G < N ? g1 * G : N;     /* this thread's columns */
            for (int i = 0; i < M; i++)
                for (int n = n0; n < n1; n++) y[(long)i * ldy + n] *= scale[n];
        } else if (wbf16) groups_bf16(x, ldx, M, (const uint16_t *)w, g0, g1, N, K, y, ldy);
        else groups_f32(x, ldx, M, (const float *)w, g0, g1, N, K, y, ldy);
    }
    free(xb);
}

/* ---- attention ---------------------------------------------------------------------- */
/* Keys transposed. A score q . k_j is a chain of d multiply-adds; with the keys as the cache
 * stores them (position-major, d contiguous floats each) a vector of 16 lanes holds 16 of
 * one key's d elements, and each score ends in a lane tree of shuffles and a scalar store,
 * more instructions than its multiply-adds. So attention reads a second copy of the keys,
 * transposed in tiles of 16 positions (2-4% off a tree step at 900 cached positions, and
 * off a plain one on long prompts: benchmarks/fast-forward/transposed-keys.md):
 *   kt   (Hkv heads, tiles, d, 16): kt + g*kt_head + (j/16)*16*d + t*16 + j%16 = k[g][j][t]
 * where 16 keys sit in the lanes and a score is one FMA chain over t = 0 .. d-1 in its own
 * lane, the same for every key, row and number of rows. The copy is kept beside the cache
 * (kv.PreallocatedLayer.key_t_buffer) and brought up to date here: positions below *valid
 * are current, the rest are transposed from k before use. */
static void transpose_keys(const float *k, long kv_head, float *kt, long kt_head, int Hkv, int d, int from,
                           int to) {
    for (int g = 0; g < Hkv; g++)
        for (int j = from; j < to; j++) {
            const float *src = k + (long)g * kv_head + (long)j * d;
            float *dst = kt + (long)g * kt_head + (long)(j / 16) * 16 * d + j % 16;
            for (int t = 0; t < d; t++) dst[t * 16] = src[t];
        }
}

/* Scores of `na` query heads (1..4, a compile-time constant at each call) against the keys
 * [0, keys) of one key/value head, from its transposed tiles ktg:
 *   p[a][j] = scale * (one FMA chain over t = 0 .. d-1 of q_a[t] k_j[t])
 * for whole tiles of 16 keys (lanes past `keys` hold what the tile holds; the caller
 * overwrites them). KT_TILES tiles at once give na * KT_TILES independent chains, enough to
 * hide the FMA latency; a query element is broadcast once for all of them. */
#if defined(__AVX512F__)
#define KT_TILES 4                             /* 4 na accumulators + 4 tiles + na broadcasts */
#else
#define KT_TILES 1                             /* v16 is two ymm: 2 na + 2 + na of 16 */
#endif
static inline __attribute__((always_inline)) void scores_heads(
        const float *const *qa, const int na, const float *ktg, int d, int keys, float scale, float *p, long ldp) {
    int tiles = (keys + 15) / 16, b = 0;
    long tile = 16L * d;                       /* floats from one tile to the next */
    for (; b + KT_TILES <= tiles; b += KT_TILES) {
        const float *kb = ktg + b * tile;
        v16 c[4][KT_TILES];
        for (int a = 0; a < na; a++)
            for (int u = 0; u < KT_TILES; u++) c[a][u] = v_zero();
        for (int t = 0; t < d; t++) {
            v16 kt[KT_TILES];
            for (int u = 0; u < KT_TILES; u++) kt[u] = v_load(kb + u * tile + t * 16);
            for (int a = 0; a < na; a++) {
                v16 qt = v_set1(qa[a][t]);
                for (int u = 0; u < KT_TILES; u++) c[a][u] = v_fma(qt, kt[u], c[a][u]);
            }
        }
        for (int a = 0; a < na; a++)
            for (int u = 0; u < KT_TILES; u++) v_store(p + a * ldp + (b + u) * 16, v_mul(v_set1(scale), c[a][u]));
    }
    for (; b < tiles; b++) {                   /* the last tiles, one at a time: the same chains */
        const float *kb = ktg + b * tile;
        v16 c[4];
        for (int a = 0; a < na; a++) c[a] = v_zero();
        for (int t = 0; t < d; t++) {
            v16 kt = v_load(kb + t * 16);
            for (int a = 0; a < na; a++) c[a] = v_fma(v_set1(qa[a][t]), kt, c[a]);
        }
        for (int a = 0; a < na; a++) v_store(p + a * ldp + b * 16, v_mul(v_set1(scale), c[a]));
    }
}

/* o_a = sum_j p[a][j] v_j over ascending j, for `na` heads (1..4, compile-time) sharing one
 * value head: each output element is the same FMA chain as one head alone would give, and a
 * value row is loaded once for all na heads. A zero p (a masked key) adds an exact zero to
 * the chain and to the denominator (acc starts at +0 and never becomes -0; values are
 * finite), so every key is visited, with no test: skipping keys whose p was zero for every
 * head cost a compare and a branch a key, and under AVX2 a forward over 8 rows at 900 cached
 * positions took 0.9 ms longer for it (benchmarks/fast-forward/attention-no-skip.md). */
#if defined(__AVX512F__)
#define PV_VECS 4                              /* 4 na accumulators + 4 values of 16 floats */
#else
#define PV_VECS 2                              /* v16 is two ymm: 2 x 2 na + 2 x 2 ymm */
#endif
static inline __attribute__((always_inline)) void values_heads(
        const float *p, long ldp, const int na, const float *vg, int d, int keys, float *inv,
        float *const *oa) {
    int t = 0;
    if (d < 16 * PV_VECS)                        /* no wide pass below to sum beside */
        for (int a = 0; a < na; a++) {
            float sum = 0.0f;
            for (int j = 0; j < keys; j++) sum += p[a * ldp + j];
            inv[a] = 1.0f / sum;
        }
    for (; t + 16 * PV_VECS <= d; t += 16 * PV_VECS) {
        v16 acc[4][PV_VECS];
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int a = 0; a < na; a++)
            for (int u = 0; u < PV_VECS; u++) acc[a][u] = v_zero();
        for (int j = 0; j < keys; j++) {
            const float *vj = vg + (long)j * d + t;
            v16 vv[PV_VECS];
            for (int u = 0; u < PV_VECS; u++) vv[u] = v_load(vj + 16 * u);
            for (int a = 0; a < na; a++) {
                sum[a] += p[a * ldp + j];    /* the softmax denominator: ascending j, beside the FMAs */
                v16 pj = v_set1(p[a * ldp + j]);
                for (int u = 0; u < PV_VECS; u++) acc[a][u] = v_fma(pj, vv[u], acc[a][u]);
            }
        }
        if (t == 0)
            for (int a = 0; a < na; a++) inv[a] = 1.0f / sum[a];
        for (int a = 0; a < na; a++)
            for (int u = 0; u < PV_VECS; u++) v_store(oa[a] + t + 16 * u, v_mul(acc[a][u], v_set1(inv[a])));
    }
    for (; t + 16 <= d; t += 16)
        for (int a = 0; a < na; a++) {
            v16 acc = v_zero();
            for (int j = 0; j < keys; j++)
                acc = v_fma(v_set1(p[a * ldp + j]), v_load(vg + (long)j * d + t), acc);
            v_store(oa[a] + t, v_mul(acc, v_set1(inv[a])));
        }
}

/* out[i][h*d + t] = softmax_j(scale * q_i,h . k_j) v_j over the keys row i may see.
 *   q       (n rows, Hq heads, d): q + i*q_row + h*q_head
 *   k, v    (Hkv heads, L keys, d): k + g*kv_head + j*d      (head h reads g = h / (Hq/Hkv))
 *   mask    (n, L) bytes, nonzero = visible; NULL: row i sees keys j <= L - n + i (causal)
 *   out     (n, Hq*d), row stride ldo
 *   scratch (threads, Hq/Hkv, L + 16) floats
 *   kt      the keys transposed (see transpose_keys), kt_head floats a head, current below
 *           *kt_valid (set to L on return); NULL: transposed here into a buffer of this call
 * The n new keys, at [L - n, L), are transposed again whatever *kt_valid says.
 * Masked keys get probability exactly 0, which adds exact zeros, so a row's result is the
 * same whether the keys it does not see are absent (a decode step) or masked (a tree).
 * Work goes key/value head by key/value head (each head's keys and values, L d floats each,
 * stay in the L2 cache while every row reads them) and, within one, up to four query heads
 * at a time share each loaded key tile and value. Per element the arithmetic is
 * scores_heads' chain and one FMA chain over ascending keys whatever n is or which heads
 * share a pass. */
void rowwise_attention(const float *q, long q_row, long q_head, const float *k, const float *v,
                       long kv_head, int n, int Hq, int Hkv, int d, int L, const uint8_t *mask,
                       float scale, float *out, long ldo, float *scratch, int threads,
                       float *kt, long kt_head, int *kt_valid) {
    int group = Hq / Hkv;
    float *own = NULL;
    int valid = kt && kt_valid ? *kt_valid : 0;
    if (!kt) {
        kt_head = (long)((L + 15) / 16) * 16 * d;
        kt = own = (float *)malloc(sizeof(float) * Hkv * kt_head);
    }
    if (valid > L - n) valid = L - n;
    if (valid < 0) valid = 0;
    transpose_keys(k, kv_head, kt, kt_head, Hkv, d, valid, L);
    if (kt_valid) *kt_valid = L;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && n * Hkv > 1)
    for (int task = 0; task < n * Hkv; task++) {
        int g = task / n, i = task % n;               /* key/value head outer, row inner */
#ifdef _OPENMP
        float *scr = scratch + (long)omp_get_thread_num() * group * (L + 16);
#else
        float *scr = scratch;
#endif
        const float *ktg = kt + (long)g * kt_head, *vg = v + (long)g * kv_head;
        const uint8_t *row = mask ? mask + (long)i * L : NULL;
        int keys = mask ? L : L - n + i + 1;          /* causal: row i sees keys [0, keys) */
        long ldp = L + 16;
        for (int a0 = 0; a0 < group; a0 += 4) {
            int na = group - a0 < 4 ? group - a0 : 4;
            const float *qa[4];
            float *oa[4], inv[4];
            for (int a = 0; a < na; a++) {
                int h = g * group + a0 + a;
                qa[a] = q + (long)i * q_row + (long)h * q_head;
                oa[a] = out + (long)i * ldo + (long)h * d;
            }
            float *p = scr + (long)a0 * ldp;
            switch (na) {
            case 1: scores_heads(qa, 1, ktg, d, keys, scale, p, ldp); break;
            case 2: scores_heads(qa, 2, ktg, d, keys, scale, p, ldp); break;
            case 3: scores_heads(qa, 3, ktg, d, keys, scale, p, ldp); break;
            default: scores_heads(qa, 4, ktg, d, keys, scale, p, ldp); break;
            }
            for (int a = 0; a < na; a++) {            /* softmax numerators */
                float *pa = p + a * ldp;
                for (int j = keys; j < keys + 16; j++) pa[j] = -INFINITY;
                if (row)
                    for (int j = 0; j < keys; j++) pa[j] = row[j] ? pa[j] : -INFINITY;
                v16 m16 = v_load(pa);                  /* the maximum, in any order: it is exact */
                for (int j = 16; j < keys; j += 16) m16 = v_max(m16, v_load(pa + j));
                v16 m = v_set1(v_hmax(m16));
                for (int j = 0; j < keys; j += 16)     /* -inf - mx -> exp gives 0 */
                    v_store(pa + j, v_exp(v_add(v_load(pa + j), v_neg(m))));
            }
            if (d % 16 != 0)                           /* else values_heads sums beside its FMAs */
                for (int a = 0; a < na; a++) {
                    float sum = 0.0f;
                    for (int j = 0; j < keys; j++) sum += p[a * ldp + j];
                    inv[a] = 1.0f / sum;
                }
            if (d % 16 == 0) {
                switch (na) {
                case 1: values_heads(p, ldp, 1, vg, d, keys, inv, oa); break;
                case 2: values_heads(p, ldp, 2, vg, d, keys, inv, oa); break;
                case 3: values_heads(p, ldp, 3, vg, d, keys, inv, oa); break;
                default: values_heads(p, ldp, 4, vg, d, keys, inv, oa); break;
                }
            } else {
                for (int a = 0; a < na; a++)
                    for (int t = 0; t < d; t++) {
                        float acc = 0.0f, *pa = p + a * ldp;
                        for (int j = 0; j < keys; j++)
                            acc = fmaf(pa[j], vg[(long)j * d + t], acc);
                        oa[a][t] = acc * inv[a];
                    }
            }
        }
    }
    free(own);
}

/* ---- element-wise ------------------------------------------------------------------- */
/* Per row: out = x / sqrt(mean(x^2) + eps) * w. The sum of squares: 16 lanes over ascending
 * chunks, the fixed lane tree, then the tail in order. */
void rowwise_rmsnorm(const float *x, int n, int H, const float *w, float eps, float *out) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + (long)i * H;
        float *oi = out + (long)i * H;
        v16 acc = v_zero();
        int t = 0;
        for (; t + 16 <= H; t += 16) { v16 a = v_load(xi + t); acc = v_fma(a, a, acc); }
        float ss = v_sum(acc);
        for (; t < H; t++) ss = fmaf(xi[t], xi[t], ss);
        float r = 1.0f / sqrtf(ss / (float)H + eps);
        for (t = 0; t < H; t++) oi[t] = (xi[t] * r) * w[t];
    }
}

/* SwiGLU's product: out[i][t] = silu(gu[i][t]) * gu[i][I + t], silu(g) = g / (1 + e^-g).
 * gu (n, 2I): the [gate; up] projection's output. */
void rowwise_silu_mul(const float *gu, int n, int I, float *out) {
    for (int i = 0; i < n; i++) {
        const float *g = gu + (long)i * 2 * I, *u = g + I;
        float *o = out + (long)i * I;
        int t = 0;
        for (; t + 16 <= I; t += 16) {
            v16 gv = v_load(g + t);
            v16 e = v_exp(v_neg(gv));
            v_store(o + t, v_mul(v_div(gv, v_add(v_set1(1.0f), e)), v_load(u + t)));
        }
        for (; t < I; t++) {
            float pad[16] = {0};
            pad[0] = -g[t];
            float e[16];
            v_store(e, v_exp(v_load(pad)));
            o[t] = (g[t] / (1.0f + e[0])) * u[t];
        }
    }
}

/* RoPE in place on the first `heads` heads of each row of qkv (n, ld): for head h of row i,
 * x = qkv[i][h*d ...], x'[t] = x[t] cos[i][t] + r[t] sin[i][t] with r = (-x[d/2 ..], x[.. d/2]);
 * a product, a product and a sum, each rounded, as transformers' apply_rotary_pos_emb. */
void rowwise_rope(float *qkv, int n, long ld, int heads, int d, const float *cos, const float *sin) {
    int half = d / 2;
    float r[1024];
    for (int i = 0; i < n; i++) {
        const float *c = cos + (long)i * d, *s = sin + (long)i * d;
        for (int h = 0; h < heads; h++) {
            float *x = qkv + (long)i * ld + (long)h * d;
            for (int t = 0; t < half; t++) { r[t] = -x[t + half]; r[t + half] = x[t]; }
            for (int t = 0; t < d; t++) {
                float a = x[t] * c[t];
                float b = r[t] * s[t];
                x[t] = a + b;
            }
        }
    }
}

/* ---- the whole decoder in one call -------------------------------------------------- */
/* Why: a one-row forward of a small model (SmolLM2-135M: 30 layers) made ~270 kernel calls
 * through ctypes plus the torch ops between them (views, the cache write, residual adds):
 * ~1.8 ms of Python per forward against ~11 ms of kernels in bfloat16. Here the same
 * kernels run in the same order on the same data, so every element's arithmetic is the one
 * the per-kernel path computes (bit for bit: tests/test_rowwise.py), and so still
 * independent of the number of rows, their place and the thread count.
 *
 * One layer's weights (RowwiseLlamaDecoder packs them; H hidden size, Hq query heads, Hkv
 * key/value heads, d head size, I the MLP's inner size), and where its KV cache lives. */
struct rowwise_layer {
    const float *norm1, *norm2;        /* (H,) float32: input and post-attention RMSNorm */
    float eps1, eps2, scale;           /* the two norms' epsilon; attention's 1/sqrt(d) or the config's */
    const void *qkv;                   /* packed ((Hq + 2 Hkv) d, H): [q; k; v] */
    const void *o;                     /* packed (H, Hq d) */
    const void *gate_up;               /* packed (2 I, H): [gate; up] */
    const void *down;                  /* packed (H, I) */
    int wfmt;                          /* the packed weights' format: W_F32, W_BF16 or W_I8 */
    float *keys, *values;              /* cache buffers (Hkv, capacity, d) float32 */
    long kv_head;                      /* floats from one key/value head to the next: capacity * d */
};

/* A layer's keys transposed for attention (transpose_keys), kept beside its cache. */
struct rowwise_keys_t {
    float *keys_t;                     /* (Hkv, capacity / 16, d, 16) float32 */
    long kt_head;                      /* floats from one head to the next */
    int *valid;                        /* keys_t is current below this position (updated here) */
};

/* The decoder stack over n rows at positions cached .. (the cache already holds `cached`
 * positions of every layer; this writes the n new ones at [cached, cached + n)).
 *   x         (n, H) the token embeddings; overwritten: the residual stream
 *   cos, sin  (n, d) RoPE of each row's position
 *   mask      (n, cached + n) bytes, nonzero = visible, or NULL (causal)
 *   tap       (layers,) -1, or the slot s at which layer l's input is copied to
 *   taps      (n, slots * H), row stride ldt (EAGLE-3's features; NULL when no tap)
 *   out       (n, H) the final RMSNorm of the last layer's output (its copy if final_norm is NULL)
 *   kt        (layers,) each layer's transposed keys, or NULL (attention transposes per call)
 * Per layer, as RowwiseLlamaDecoder._forward_per_kernel does with one call per kernel:
 *   h = rmsnorm(x); qkv = h Wqkv^T; RoPE on q, k; k, v -> cache; a = attention(q, cache)
 *   x = x + a Wo^T;  h = rmsnorm(x); x = x + (silu(h Wg^T) * h Wu^T) Wd^T
 * (each residual add is one rounded float32 add per element, as torch's). */
void rowwise_decoder(float *x, int n, const struct rowwise_layer *layer, int layers, int H, int Hq, int Hkv,
                     int d, int I, const float *cos, const float *sin, int cached, const uint8_t *mask,
                     const int *tap, float *taps, long ldt, const float *final_norm, float final_eps,
                     float *out, int threads, const struct rowwise_keys_t *kt) {
    int Nqkv = (Hq + 2 * Hkv) * d, L = cached + n, group = Hq / Hkv;
    /* work space: qkv (n, Nqkv), attention output (n, Hq d), normed h (n, H), a product
     * to add (n, H), gate_up (n, 2I), silu * up (n, I), attention scratch */
    size_t sizes[7] = {(size_t)n * Nqkv, (size_t)n * Hq * d, (size_t)n * H, (size_t)n * H, (size_t)n * 2 * I,
                       (size_t)n * I, (size_t)threads * group * (L + 16)};
    size_t total = 0;
    for (int s = 0; s < 7; s++) total += sizes[s];
    float *work = (float *)malloc(total * sizeof(float));
    float *qkv = work, *att = qkv + sizes[0], *h = att + sizes[1], *add = h + sizes[2], *gu = add + sizes[3],
          *act = gu + sizes[4], *scratch = act + sizes[5];
    long nx = (long)n * H;
    for (int l = 0; l < layers; l++) {
        const struct rowwise_layer *w = layer + l;
        if (tap && tap[l] >= 0)
            for (int i = 0; i < n; i++) memcpy(taps + i * ldt + (long)tap[l] * H, x + (long)i * H, sizeof(float) * H);
        /* attention block (an EAGLE head's layer has no input norm: norm1 NULL) */
        if (w->norm1) rowwise_rmsnorm(x, n, H, w->norm1, w->eps1, h);
        else memcpy(h, x, sizeof(float) * nx);
        rowwise_linear(h, H, n, w->qkv, w->wfmt, Nqkv, H, qkv, Nqkv, threads);
        rowwise_rope(qkv, n, Nqkv, Hq + Hkv, d, cos, sin);
        for (int i = 0; i < n; i++)                   /* row i's k and v heads -> cache position cached + i */
            for (int g = 0; g < Hkv; g++) {
                long at = (long)g * w->kv_head + (long)(cached + i) * d;
                memcpy(w->keys + at, qkv + (long)i * Nqkv + (long)(Hq + g) * d, sizeof(float) * d);
                memcpy(w->values + at, qkv + (long)i * Nqkv + (long)(Hq + Hkv + g) * d, sizeof(float) * d);
            }
        rowwise_attention(qkv, Nqkv, d, w->keys, w->values, w->kv_head, n, Hq, Hkv, d, L, mask, w->scale,
                          att, (long)Hq * d, scratch, threads, kt ? kt[l].keys_t : NULL,
                          kt ? kt[l].kt_head : 0, kt ? kt[l].valid : NULL);
        rowwise_linear(att, (long)Hq * d, n, w->o, w->wfmt, H, Hq * d, add, H, threads);
        for (long e = 0; e < nx; e++) x[e] = x[e] + add[e];
        /* MLP block */
        rowwise_rmsnorm(x, n, H, w->norm2, w->eps2, h);
        rowwise_linear(h, H, n, w->gate_up, w->wfmt, 2 * I, H, gu, 2 * I, threads);
        rowwise_silu_mul(gu, n, I, act);
        rowwise_linear(act, I, n, w->down, w->wfmt, H, I, add, H, threads);
        for (long e = 0; e < nx; e++) x[e] = x[e] + add[e];
    }
    if (final_norm) rowwise_rmsnorm(x, n, H, final_norm, final_eps, out);
    else memcpy(out, x, sizeof(float) * nx);                /* no final norm (an EAGLE head) */
    free(work);
}

/* ---- the KV cache after a tree verification -------------------------------------------- */
/* Keep cache rows [0, start) and move row start + offsets[j] to start + j (offsets ascending,
 * so offsets[j] >= j and a row is read before anything overwrites it), for every head of
 * every (heads, capacity, d) float32 buffer: what kv.keep_positions does with an
 * index_select and a copy per buffer, in one call for all layers (SmolLM2: 60 buffers,
 * ~0.4 ms a step in torch). Copies only: no arithmetic. */
void rowwise_keep_rows(float *const *buffers, int nbuf, long head_stride, int heads, int d, int start,
                       const int *offsets, int k) {
    for (int b = 0; b < nbuf; b++)
        for (int h = 0; h < heads; h++) {
            float *base = buffers[b] + (long)h * head_stride;
            for (int j = 0; j < k; j++)
                if (offsets[j] != j)
                    memmove(base + (long)(start + j) * d, base + (long)(start + offsets[j]) * d, sizeof(float) * d);
        }
}

/* ---- reductions over a row of logits ---------------------------------------------------- */
/* Why by hand: torch's argmax over SmolLM2's 49,152 logits took ~55 us and its topk +
 * logsumexp over the 8,192 draft logits ~45 us a row on one core; a greedy step does several
 * of each, while these take a few microseconds. */

/* The largest of x[0 .. V): its value, and whether x holds a NaN or an infinity (then the
 * callers fall back to a plain scan). Any order finds the same maximum. */
static float row_max(const float *x, int V, int *special) {
    v16 m = v_set1(-INFINITY), z = v_zero();
    int i = 0;
    for (; i + 16 <= V; i += 16) {
        v16 v = v_load(x + i);
        m = v_max(m, v);
        z = v_add(z, v_mul(v, v_zero()));             /* NaN iff some v is NaN or infinite */
    }
    float mx = v_hmax(m), zs = v_sum(z);
    for (; i < V; i++) {
        mx = x[i] > mx ? x[i] : mx;
        zs += x[i] * 0.0f;
    }
    *special = zs != zs;
    return mx;
}

/* out[r] = the index of the largest x[r][j], the first on a tie, a NaN counting as the
 * largest (torch.argmax's rule), for n rows of V, row stride ldx. */
void rowwise_argmax(const float *x, int n, long ldx, int V, long *out) {
    for (int r = 0; r < n; r++) {
        const float *xr = x + (long)r * ldx;
        int special;
        float mx = row_max(xr, V, &special);
        long best = 0;
        if (special) {                                /* a NaN or an infinity: torch's rule, element by element */
            float bv = xr[0];
            for (int j = 1; j < V && bv == bv; j++)
                if (xr[j] > bv || xr[j] != xr[j]) { bv = xr[j]; best = j; }
        } else {
            while (xr[best] != mx) best++;            /* the first element equal to the maximum */
        }
        out[r] = best;
    }
}

/* rowwise_argmax for one row, returned */
long rowwise_argmax1(const float *x, int V) {
    long out;
    rowwise_argmax(x, 1, V, V, &out);
    return out;
}

/* log(sum_j exp(x[j])) over V logits: the sum over 16 lanes in ascending chunks, then the
 * fixed lane tree and the tail in order, so it does not depend on other rows */
static float row_lse(const float *xr, int V) {
    int special;
    float mx = row_max(xr, V, &special);
    v16 acc = v_zero(), m = v_set1(mx);
    int i = 0;
    for (; i + 16 <= V; i += 16) acc = v_add(acc, v_exp(v_add(v_load(xr + i), v_neg(m))));
    float s = v_sum(acc);
    for (; i < V; i++) {
        float pad[16], e[16];
        for (int l = 0; l < 16; l++) pad[l] = l == 0 ? xr[i] - mx : 0.0f;
        v_store(e, v_exp(v_load(pad)));
        s += e[0];
    }
    return mx + logf(s);
}

/* For n rows of V logits (row stride ldx): lse[r] = log(sum_j exp(x[r][j])), and the k largest
 * (the earlier index first on a tie) as probabilities q = exp(x - lse) with their indices,
 * best first. k may be 0 (only lse). */
void rowwise_top_probs(const float *x, int n, long ldx, int V, int k, float *q, long *idx, float *lse) {
    for (int r = 0; r < n; r++) {
        const float *xr = x + (long)r * ldx;
        float l = row_lse(xr, V);
        lse[r] = l;
        /* the k best, kept sorted: a later element enters only if strictly larger */
        float *qv = q + (long)r * k;
        long *qi = idx + (long)r * k;
        int have = 0;
        for (int j = 0; j < V && k > 0; j++) {
            float v = xr[j];
            if (have == k && !(v > qv[k - 1])) continue;
            int at = have < k ? have++ : k - 1;
            while (at > 0 && v > qv[at - 1]) { qv[at] = qv[at - 1]; qi[at] = qi[at - 1]; at--; }
            qv[at] = v;
            qi[at] = j;
        }
        for (int t = 0; t < have; t++) qv[t] = expf(qv[t] - l);
    }
}

/* p[i] = exp(x[row[i]][tok[i]] - lse(x[row[i]])) for N (row, token) pairs over n rows of V
 * logits, lse[r] left NaN for a row no pair reads: the target's probability of each draft
 * node's token given its parent, for the step record, in one call (its torch form took ~9
 * tensor operations a step, each a few microseconds more on a CPU whose caches the
 * forward's weights have just passed through). */
void rowwise_node_probs(const float *x, int n, long ldx, int V, const int *row, const long *tok, int N,
                        float *lse, float *p) {
    for (int r = 0; r < n; r++) lse[r] = NAN;                     /* only the rows some pair reads */
    for (int i = 0; i < N; i++) {
        const float *xr = x + (long)row[i] * ldx;
        if (lse[row[i]] != lse[row[i]]) lse[row[i]] = row_lse(xr, V);
        p[i] = expf(xr[tok[i]] - lse[row[i]]);
    }
}

/* out[i][0 .. H) = table[ids[i]] as float32, for n token ids: an embedding lookup (a bfloat16
 * row widens exactly, a zero word below each value), one call for what took an index_select
 * and a conversion in torch. */
void rowwise_embed(const void *table, int bf16, const long *ids, int n, int H, float *out) {
    for (int i = 0; i < n; i++) {
        float *o = out + (long)i * H;
        if (bf16) {
            const uint16_t *src = (const uint16_t *)table + ids[i] * (long)H;
            for (int t = 0; t < H; t++) {
                uint32_t u = (uint32_t)src[t] << 16;
                memcpy(o + t, &u, sizeof u);
            }
        } else {
            memcpy(o, (const float *)table + ids[i] * (long)H, sizeof(float) * H);
        }
    }
}
