/* rowwise/logits.c: reductions over rows of logits (argmax, the draft's top-k q, each
 * node's p) and the embedding lookup.
 *
 * Part of rowwise.c's one translation unit: included there, after the parts before it in
 * its list, never compiled alone.
 */
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
