/* rowwise/attention.c: softmax attention, each (row, query head) on its own, over keys read
 * from a transposed copy kept beside the KV cache (``rowwise_attention``).
 *
 * Part of rowwise.c's one translation unit: included there, after the parts before it in
 * its list, never compiled alone.
 */
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

/* Query vectors that share a pass over one key/value head's keys and values (a "pass" loads
 * each key tile and value row once for all of them): up to ATT_PASS (row, head) pairs, from
 * up to ATT_ROWS rows. On AVX-512 two rows' three query heads (SmolLM2: 9 heads over 3
 * key/value heads) make six, 24 accumulators of the 32 zmm registers in either loop; a row
 * alone read its head's keys and values (200 KB at 400 positions, more than L1) from L2 once
 * per row. AVX2's 16 ymm registers hold a pass of 4 (v16 is two ymm), one row at a time. */
#if defined(__AVX512F__)
#define ATT_ROWS 2
#define ATT_PASS 6
#else
#define ATT_ROWS 1
#define ATT_PASS 4
#endif
int rowwise_attention_rows(void) { return ATT_ROWS; }

/* Scores of `na` query vectors (1..ATT_PASS, a compile-time constant at each call) against the keys
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
        v16 c[ATT_PASS][KT_TILES];
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
        v16 c[ATT_PASS];
        for (int a = 0; a < na; a++) c[a] = v_zero();
        for (int t = 0; t < d; t++) {
            v16 kt = v_load(kb + t * 16);
            for (int a = 0; a < na; a++) c[a] = v_fma(v_set1(qa[a][t]), kt, c[a]);
        }
        for (int a = 0; a < na; a++) v_store(p + a * ldp + b * 16, v_mul(v_set1(scale), c[a]));
    }
}

/* o_a = sum_j p[a][j] v_j over ascending j, for `na` query vectors (1..ATT_PASS, compile-time) sharing
 * one value head: each output element is the same FMA chain as one head alone would give, and a
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
        v16 acc[ATT_PASS][PV_VECS];
        float sum[ATT_PASS] = {0.0f};
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
 *   scratch (threads, ATT_ROWS * Hq/Hkv, L + 16) floats (rowwise_attention_rows() = ATT_ROWS)
 *   kt      the keys transposed (see transpose_keys), kt_head floats a head, current below
 *           *kt_valid (set to L on return); NULL: transposed here into a buffer of this call
 * The n new keys, at [L - n, L), are transposed again whatever *kt_valid says.
 * Masked keys get probability exactly 0, which adds exact zeros, so a row's result is the
 * same whether the keys it does not see are absent (a decode step) or masked (a tree).
 * Work goes key/value head by key/value head (each head's keys and values, L d floats each,
 * stay in the L2 cache while every row reads them) and, within one, up to ATT_ROWS rows'
 * query heads at a time (ATT_PASS a pass) share each loaded key tile and value. A pass runs
 * over the keys the most-seeing of its rows may see; a row's keys beyond its own get
 * probability exactly 0 (the same exact zeros). Per element the arithmetic is scores_heads'
 * chain and one FMA chain over ascending keys whatever n is or which heads and rows share a
 * pass. */
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
    /* rows a task: ATT_ROWS where that still leaves each thread two tasks or more */
    int rows = n / ATT_ROWS * Hkv >= 2 * threads ? ATT_ROWS : 1;
    int blocks = (n + rows - 1) / rows;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && blocks * Hkv > 1)
    for (int task = 0; task < blocks * Hkv; task++) {
        int g = task / blocks, i0 = task % blocks * rows;    /* key/value head outer, rows inner */
        int i1 = i0 + rows < n ? i0 + rows : n;
#ifdef _OPENMP
        float *scr = scratch + (long)omp_get_thread_num() * ATT_ROWS * group * (L + 16);
#else
        float *scr = scratch;
#endif
        const float *ktg = kt + (long)g * kt_head, *vg = v + (long)g * kv_head;
        long ldp = L + 16;
        int items = (i1 - i0) * group;                 /* (row, head) pairs: row-major */
        for (int c0 = 0; c0 < items; c0 += ATT_PASS) {
            int na = items - c0 < ATT_PASS ? items - c0 : ATT_PASS, keys = 0;
            const float *qa[ATT_PASS];
            float *oa[ATT_PASS], inv[ATT_PASS];
            int seen[ATT_PASS];                        /* causal: item a's row sees keys [0, seen[a]) */
            const uint8_t *row[ATT_PASS];
            for (int a = 0; a < na; a++) {
                int i = i0 + (c0 + a) / group, h = g * group + (c0 + a) % group;
                qa[a] = q + (long)i * q_row + (long)h * q_head;
                oa[a] = out + (long)i * ldo + (long)h * d;
                row[a] = mask ? mask + (long)i * L : NULL;
                seen[a] = mask ? L : L - n + i + 1;
                if (seen[a] > keys) keys = seen[a];
            }
            float *p = scr + (long)c0 * ldp;
            switch (na) {
            case 1: scores_heads(qa, 1, ktg, d, keys, scale, p, ldp); break;
            case 2: scores_heads(qa, 2, ktg, d, keys, scale, p, ldp); break;
            case 3: scores_heads(qa, 3, ktg, d, keys, scale, p, ldp); break;
            case 4: scores_heads(qa, 4, ktg, d, keys, scale, p, ldp); break;
#if ATT_PASS > 4
            case 5: scores_heads(qa, 5, ktg, d, keys, scale, p, ldp); break;
            default: scores_heads(qa, 6, ktg, d, keys, scale, p, ldp); break;
#endif
            }
            for (int a = 0; a < na; a++) {            /* softmax numerators */
                float *pa = p + a * ldp;
                for (int j = seen[a]; j < keys + 16; j++) pa[j] = -INFINITY;
                if (row[a])
                    for (int j = 0; j < keys; j++) pa[j] = row[a][j] ? pa[j] : -INFINITY;
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
                case 4: values_heads(p, ldp, 4, vg, d, keys, inv, oa); break;
#if ATT_PASS > 4
                case 5: values_heads(p, ldp, 5, vg, d, keys, inv, oa); break;
                default: values_heads(p, ldp, 6, vg, d, keys, inv, oa); break;
#endif
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
