/* FMA throughput of one core and of all: 12 independent accumulator chains, the loop in
 * inline assembly so that the compiler can neither drop nor reorder the FMAs; ymm (AVX2) and
 * zmm (AVX-512).  gcc -O2 -fopenmp -mavx512f fmapeak.c && ./a.out
 * -DDPBF16 -mavx512bf16 -mavx512vl: the same for VDPBF16PS (the native bfloat16 kernels'
 * instruction, 2 multiply-adds a lane), printed as instructions a second. */
#include <stdio.h>
#include <omp.h>

#define Z(R, i) "vxorps %%" R #i ",%%" R #i ",%%" R #i "\n"
#ifdef DPBF16
#define F(R, i) "vdpbf16ps %%" R "12,%%" R "13,%%" R #i "\n"
#else
#define F(R, i) "vfmadd231ps %%" R "12,%%" R "13,%%" R #i "\n"
#endif
#define ALL(M, R) M(R, 0) M(R, 1) M(R, 2) M(R, 3) M(R, 4) M(R, 5) M(R, 6) M(R, 7) M(R, 8) M(R, 9) M(R, 10) M(R, 11)
#define DEFINE_PEAK(NAME, R)                                                                   \
static double NAME(long n) {         /* seconds for n rounds of 12 FMAs */                     \
    double t = omp_get_wtime();                                                                \
    __asm__ volatile(ALL(Z, R) Z(R, 12) Z(R, 13) "1:\n" ALL(F, R) "dec %0\n jnz 1b\n"          \
                     : "+r"(n) : : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",     \
                       "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "cc");      \
    return omp_get_wtime() - t;                                                                \
}
DEFINE_PEAK(ymm, "ymm")
DEFINE_PEAK(zmm, "zmm")

int main(void) {
    long n = 100000000;                          /* 1.2 G FMAs a thread */
    for (int threads = 1; threads <= 2; threads++)
        for (int w = 0; w < 2; w++) {
            double best = 1e9;
            for (int r = 0; r < 3; r++) {
                double worst = 0;
                #pragma omp parallel num_threads(threads) reduction(max:worst)
                { double s = w ? zmm(n) : ymm(n); worst = s > worst ? s : worst; }
                best = worst < best ? worst : best;
            }
            double g = threads * 12.0 * n / best / 1e9;
            printf("%s, %d thread(s): %.2f G FMA/s (%.0f GFLOP/s float32)\n", w ? "zmm" : "ymm", threads, g,
                   g * (w ? 32 : 16));
        }
    return 0;
}
