/* rowwise/cache.c: the KV cache's compaction after a tree verification
 * (``rowwise_keep_rows``): copies only, no arithmetic.
 *
 * Part of rowwise.c's one translation unit: included there, after the parts before it in
 * its list, never compiled alone.
 */
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
