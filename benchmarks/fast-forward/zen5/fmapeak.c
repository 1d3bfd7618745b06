/* FMA throughput of one core: 12 independent accumulator chains, the loop in inline asm so
 * the compiler can neither drop nor reorder the FMAs. ymm (AVX2) and zmm (AVX-512). */
#include <stdio.h>
#include <omp.h>
static double ymm(long n) {
    double t = omp_get_wtime();
    __asm__ volatile(
        "vxorps %%ymm0,%%ymm0,%%ymm0\n vxorps %%ymm1,%%ymm1,%%ymm1\n vxorps %%ymm2,%%ymm2,%%ymm2\n"
        "vxorps %%ymm3,%%ymm3,%%ymm3\n vxorps %%ymm4,%%ymm4,%%ymm4\n vxorps %%ymm5,%%ymm5,%%ymm5\n"
        "vxorps %%ymm6,%%ymm6,%%ymm6\n vxorps %%ymm7,%%ymm7,%%ymm7\n vxorps %%ymm8,%%ymm8,%%ymm8\n"
        "vxorps %%ymm9,%%ymm9,%%ymm9\n vxorps %%ymm10,%%ymm10,%%ymm10\n vxorps %%ymm11,%%ymm11,%%ymm11\n"
        "vxorps %%ymm12,%%ymm12,%%ymm12\n vxorps %%ymm13,%%ymm13,%%ymm13\n"
        "1:\n"
        "vfmadd231ps %%ymm12,%%ymm13,%%ymm0\n vfmadd231ps %%ymm12,%%ymm13,%%ymm1\n vfmadd231ps %%ymm12,%%ymm13,%%ymm2\n"
        "vfmadd231ps %%ymm12,%%ymm13,%%ymm3\n vfmadd231ps %%ymm12,%%ymm13,%%ymm4\n vfmadd231ps %%ymm12,%%ymm13,%%ymm5\n"
        "vfmadd231ps %%ymm12,%%ymm13,%%ymm6\n vfmadd231ps %%ymm12,%%ymm13,%%ymm7\n vfmadd231ps %%ymm12,%%ymm13,%%ymm8\n"
        "vfmadd231ps %%ymm12,%%ymm13,%%ymm9\n vfmadd231ps %%ymm12,%%ymm13,%%ymm10\n vfmadd231ps %%ymm12,%%ymm13,%%ymm11\n"
        "dec %0\n jnz 1b\n" : "+r"(n) : : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","cc");
    return omp_get_wtime() - t;
}
static double zmm(long n) {
    double t = omp_get_wtime();
    __asm__ volatile(
        "vxorps %%zmm0,%%zmm0,%%zmm0\n vxorps %%zmm1,%%zmm1,%%zmm1\n vxorps %%zmm2,%%zmm2,%%zmm2\n"
        "vxorps %%zmm3,%%zmm3,%%zmm3\n vxorps %%zmm4,%%zmm4,%%zmm4\n vxorps %%zmm5,%%zmm5,%%zmm5\n"
        "vxorps %%zmm6,%%zmm6,%%zmm6\n vxorps %%zmm7,%%zmm7,%%zmm7\n vxorps %%zmm8,%%zmm8,%%zmm8\n"
        "vxorps %%zmm9,%%zmm9,%%zmm9\n vxorps %%zmm10,%%zmm10,%%zmm10\n vxorps %%zmm11,%%zmm11,%%zmm11\n"
        "vxorps %%zmm12,%%zmm12,%%zmm12\n vxorps %%zmm13,%%zmm13,%%zmm13\n"
        "1:\n"
        "vfmadd231ps %%zmm12,%%zmm13,%%zmm0\n vfmadd231ps %%zmm12,%%zmm13,%%zmm1\n vfmadd231ps %%zmm12,%%zmm13,%%zmm2\n"
        "vfmadd231ps %%zmm12,%%zmm13,%%zmm3\n vfmadd231ps %%zmm12,%%zmm13,%%zmm4\n vfmadd231ps %%zmm12,%%zmm13,%%zmm5\n"
        "vfmadd231ps %%zmm12,%%zmm13,%%zmm6\n vfmadd231ps %%zmm12,%%zmm13,%%zmm7\n vfmadd231ps %%zmm12,%%zmm13,%%zmm8\n"
        "vfmadd231ps %%zmm12,%%zmm13,%%zmm9\n vfmadd231ps %%zmm12,%%zmm13,%%zmm10\n vfmadd231ps %%zmm12,%%zmm13,%%zmm11\n"
        "dec %0\n jnz 1b\n" : "+r"(n) : : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","cc");
    return omp_get_wtime() - t;
}
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
            printf("%s, %d thread(s): %.2f G FMA/s (%.0f GFLOP/s float32)\n", w ? "zmm" : "ymm", threads, g, g * (w ? 32 : 16));
        }
    return 0;
}
