/* rowwise/elementwise.c: the row-by-row kernels of a layer: RMSNorm, SwiGLU's product and
 * RoPE.
 *
 * Part of rowwise.c's one translation unit: included there, after the parts before it in
 * its list, never compiled alone.
 */
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
