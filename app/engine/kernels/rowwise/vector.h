/* rowwise/vector.h: a vector of 16 floats on either ISA, and the few operations on it that
 * the kernels share: load, store, FMA, the fixed lane tree of a horizontal sum (v_sum), and
 * exp lane by lane (v_exp). On AVX-512 a v16 is one zmm register; on AVX2 it is two ymm,
 * and every operation is written so that a lane's result is the same bits on both ISAs.
 *
 * Part of rowwise.c's one translation unit: included there, after the parts before it in
 * its list, never compiled alone.
 */
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
