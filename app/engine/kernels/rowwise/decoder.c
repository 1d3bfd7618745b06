/* rowwise/decoder.c: the whole decoder stack in one call (``rowwise_decoder``): the kernels
 * of the parts before it, in the order the per-kernel Python path calls them.
 *
 * Part of rowwise.c's one translation unit: included there, after the parts before it in
 * its list, never compiled alone.
 */
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
static void decoder_stack(float *x, int n, const struct rowwise_layer *layer, int layers, int H, int Hq,
                          int Hkv, int d, int I, const float *cos, const float *sin, int cached,
                          const uint8_t *mask, const int *tap, float *taps, long ldt, const float *final_norm,
                          float final_eps, float *out, int threads, const struct rowwise_keys_t *kt,
                          const float *emb, const float *norm_emb, float eps_emb) {
    int Nqkv = (Hq + 2 * Hkv) * d, L = cached + n, group = Hq / Hkv;
    /* work space: qkv (n, Nqkv), attention output (n, Hq d), normed h (n, H; EAGLE-3: n, 2H),
     * a product to add (n, H), gate_up (n, 2I), silu * up (n, I), attention scratch,
     * EAGLE-3's normed embeddings (n, H) */
    size_t sizes[8] = {(size_t)n * Nqkv, (size_t)n * Hq * d, (size_t)n * H * (emb ? 2 : 1), (size_t)n * H,
                       (size_t)n * 2 * I, (size_t)n * I, (size_t)threads * ATT_ROWS * group * (L + 16),
                       emb ? (size_t)n * H : 0};
    size_t total = 0;
    for (int s = 0; s < 8; s++) total += sizes[s];
    float *work = (float *)malloc(total * sizeof(float));
    float *qkv = work, *att = qkv + sizes[0], *h = att + sizes[1], *add = h + sizes[2], *gu = add + sizes[3],
          *act = gu + sizes[4], *scratch = act + sizes[5], *e = scratch + sizes[6];
    long nx = (long)n * H;
    for (int l = 0; l < layers; l++) {
        const struct rowwise_layer *w = layer + l;
        if (tap && tap[l] >= 0)
            for (int i = 0; i < n; i++) memcpy(taps + i * ldt + (long)tap[l] * H, x + (long)i * H, sizeof(float) * H);
        /* attention block (an EAGLE head's layer has no input norm: norm1 NULL) */
        int K = H;
        if (emb && l == 0) {
            /* EAGLE-3's layer: q, k, v read [rmsnorm(emb); rmsnorm(x)] (n, 2H); x stays the residual */
            K = 2 * H;
            rowwise_rmsnorm(emb, n, H, norm_emb, eps_emb, e);
            rowwise_rmsnorm(x, n, H, w->norm1, w->eps1, add);          /* add: free until the o-projection */
            for (int i = 0; i < n; i++) {
                memcpy(h + (long)i * K, e + (long)i * H, sizeof(float) * H);
                memcpy(h + (long)i * K + H, add + (long)i * H, sizeof(float) * H);
            }
        } else if (w->norm1) rowwise_rmsnorm(x, n, H, w->norm1, w->eps1, h);
        else memcpy(h, x, sizeof(float) * nx);
        rowwise_linear(h, K, n, w->qkv, w->wfmt, Nqkv, K, qkv, Nqkv, threads);
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

void rowwise_decoder(float *x, int n, const struct rowwise_layer *layer, int layers, int H, int Hq, int Hkv,
                     int d, int I, const float *cos, const float *sin, int cached, const uint8_t *mask,
                     const int *tap, float *taps, long ldt, const float *final_norm, float final_eps,
                     float *out, int threads, const struct rowwise_keys_t *kt) {
    decoder_stack(x, n, layer, layers, H, Hq, Hkv, d, I, cos, sin, cached, mask, tap, taps, ldt, final_norm,
                  final_eps, out, threads, kt, NULL, NULL, 0.0f);
}

/* EAGLE-3's draft layer (one layer, no final norm): as rowwise_decoder, with the token
 * embeddings emb (n, H) beside x, the fused target features or the head's own state g:
 * q, k, v read [rmsnorm(emb, norm_emb); rmsnorm(x, norm1)] (2H wide) and x is the residual
 * (Eagle3Layer.forward). Its own entry point, so that the Python side can tell a build that
 * has it from an older one (kernels.load_other) by the symbol alone. */
void rowwise_decoder_eagle3(float *x, const float *emb, int n, const struct rowwise_layer *layer, int H, int Hq,
                            int Hkv, int d, int I, const float *cos, const float *sin, int cached,
                            const uint8_t *mask, const float *norm_emb, float eps_emb, float *out, int threads,
                            const struct rowwise_keys_t *kt) {
    decoder_stack(x, n, layer, 1, H, Hq, Hkv, d, I, cos, sin, cached, mask, NULL, NULL, 0, NULL, 0.0f, out,
                  threads, kt, emb, norm_emb, eps_emb);
}
