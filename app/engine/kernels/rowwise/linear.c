/* rowwise/linear.c: the weight products y = x W^T on float32, bfloat16 and int8 weights
 * (register blocks of MB rows by G packed output columns, the weights prefetched ahead, one
 * multiply-add chain per element in ascending k). Natively bfloat16 products (VDPBF16PS,
 * AMX tiles) and the entry point ``rowwise_linear`` are in linear_bf16.c, after this part.
 *
 * Part of rowwise.c's one translation unit: included there, after the parts before it in
 * its list, never compiled alone.
 */
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
