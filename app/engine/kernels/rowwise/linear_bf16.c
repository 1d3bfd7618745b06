/* rowwise/linear_bf16.c: the weight products on CPUs with native bfloat16 arithmetic
 * (VDPBF16PS on AVX512-BF16, AMX tiles on Sapphire Rapids and later), the register block
 * heights the Python side asks for, and ``rowwise_linear``, which picks the product for a
 * call's weights (float32, bfloat16 or int8; linear.c) and splits its groups over threads.
 *
 * Part of rowwise.c's one translation unit: included there, after the parts before it in
 * its list, never compiled alone.
 */
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

/* k-pair k of a block (as BLOCK_STEP in linear.c): GV weight vectors loaded once, each row's
 * pair of x broadcast, one VDPBF16PS into each of its GV accumulators. */
#define DP_STEP(k)                                                                            \
    {                                                                                         \
        __m512i wv[GV];                                                                       \
        for (int v = 0; v < GV; v++) wv[v] = _mm512_loadu_si512((const void *)(wg + ((long)(k) * G + v * VW) * 2)); \
        for (int i = 0; i < mb; i++) {                                                        \
            __m512i xk = _mm512_set1_epi32((int)xp[i * ldxp + (k)]);                          \
            for (int v = 0; v < GV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)xk, (__m512bh)wv[v]); \
        }                                                                                     \
    }

static inline __attribute__((always_inline)) void block_dp(
        const uint32_t *xp, long ldxp, const uint16_t *wg, float *y, long ldy, int Kp, int ncols,
        const int mb, const uint16_t *next, long next_step, int stream) {
    __m512 acc[MB][GV];
    for (int i = 0; i < mb; i++)
        for (int v = 0; v < GV; v++) acc[i][v] = _mm512_setzero_ps();
    for (int k = 0; k < Kp; k++) {
        PREFETCH_STEP(wg + (long)k * G * 2, 2 * G * 2, stream);
        PREFETCH_NEXT(k);
        DP_STEP(k)
    }
    store_block(y, ldy, acc, mb, ncols);                /* vn is __m512 on AVX-512 */
}

/* Rows of 2 to CHUNK_BLOCKS register blocks (a tree of 9 to 16 rows) go over a group chunk
 * by chunk: each block runs the chunk's CHUNK_BYTES of weights (from L1 after the first
 * block has read them), keeps its accumulators in `carry` and takes them up again at the next
 * chunk, while every block asks for its share of the next chunk, spread over its steps, into
 * L2. Block after block over a whole group (55 KB, more than L1), the later blocks re-read it
 * from L2 while nothing streamed from memory, and 9 rows cost 1.3x 8 (forward T(8) 12.8 ->
 * T(9) 16.5 ms on a Zen 4 EPYC; chunked, T(9) about T(8): benchmarks/fast-forward/
 * chunked-blocks.md). A float32 store and load are exact, so every element's chain over
 * ascending k-pairs is the one a block over the whole group runs. AVX-512-BF16 only: the
 * widening blocks of linear.c, whose AVX2 groups (27 KB) fit L1, measured slower so. */
#define CHUNK_BYTES 6144                 /* 32 k-pairs of a group */
#define CHUNK_BLOCKS 2                   /* 9-16 rows: 3-4 blocks measured no faster chunked */
static inline __attribute__((always_inline)) void chunk_dp(
        const uint32_t *xp, long ldxp, const uint16_t *wg, float *carry, int k0, int k1, const int mb,
        const char *ahead, long ahead_step) {
    __m512 acc[MB][GV];
    for (int i = 0; i < mb; i++)
        for (int v = 0; v < GV; v++) acc[i][v] = k0 ? _mm512_loadu_ps(carry + i * G + v * VW) : _mm512_setzero_ps();
    for (int k = k0; k < k1; k++) {
        const char *p = ahead + (((long)(k - k0) * ahead_step) >> 8);   /* this step's share of the next chunk */
        __builtin_prefetch(p, 0, 2);
        __builtin_prefetch(p + 64, 0, 2);
        DP_STEP(k)
    }
    for (int i = 0; i < mb; i++)
        for (int v = 0; v < GV; v++) _mm512_storeu_ps(carry + i * G + v * VW, acc[i][v]);
}

#define CASE_DP(R) case R: block_dp(xb, Kp, wg, yb, ldy, Kp, ncols, R, next, next_step, stream); break;
#define CASE_CHUNK(R) case R: chunk_dp(xb, Kp, wg, carry[b], k0, k1, R, ahead, ahead_step); break;
static void groups_dp(const uint32_t *xp, int M, const uint16_t *w, int g0, int g1, int N, int Kp,
                      float *y, long ldy) {
    int nb = (M + MB - 1) / MB;                          /* row blocks per group */
    int per = (M + nb - 1) / nb;                         /* rows a block: split evenly, as above */
    int stream = nb == 1 && stream_weights();            /* non-temporal weights (above) */
    long next_step = ((long)G * 2 << 8) / nb;            /* elements a k-pair, times 256 */
    long kg = (long)Kp * G * 2;                          /* elements a group */
    if (nb > 1 && nb <= CHUNK_BLOCKS) {                  /* chunk by chunk (above) */
        float carry[CHUNK_BLOCKS][MB * G];               /* each block's accumulators, (rows, G) */
        const int kch = CHUNK_BYTES / (G * 4);           /* k-pairs a chunk */
        for (int g = g0; g < g1; g++) {
            const uint16_t *wg = w + g * kg;
            int ncols = N - g * G < G ? N - g * G : G;
            for (int k0 = 0; k0 < Kp; k0 += kch) {
                int k1 = k0 + kch < Kp ? k0 + kch : Kp;
                for (int m = 0, b = 0; m < M; m += per, b++) {
                    const uint32_t *xb = xp + (long)m * Kp;
                    /* block b's share of the next chunk (the next group's first, after the last) */
                    const char *ahead = (const char *)(wg + (long)k1 * G * 2) + (long)b * CHUNK_BYTES / nb;
                    long ahead_step = ((long)CHUNK_BYTES / nb << 8) / (k1 - k0);     /* bytes a step, x 256 */
                    switch (M - m < per ? M - m : per) { UP_TO_MB(CASE_CHUNK) }
                }
            }
            for (int m = 0, b = 0; m < M; m += per, b++)
                for (int i = 0; i < per && m + i < M; i++)
                    memcpy(y + (long)(m + i) * ldy + (long)g * G, carry[b] + i * G, sizeof(float) * ncols);
        }
        return;
    }
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
