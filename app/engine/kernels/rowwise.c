/* Batch-invariant CPU kernels for the target's decode/verify forward.
 *
 * Why by hand: a decode step multiplies a handful of rows (1 token, or the root plus a
 * draft tree) by every weight of the model. Such a step is bound by reading the weights,
 * so it should cost about one pass over them whatever the number of rows. MKL's small-M
 * sgemm does not do that (it reads the weights about once per row for 2-3 rows), and no
 * library kernel promises the second property the engine needs: that a row's result has
 * the same bits whether it is computed alone or beside others. Without it a greedy EAGLE
 * run and plain decoding of the same model part after a near-tie (the tree's rows round
 * differently from the single token's), which is what "lossless" forbids.
 *
 * Every kernel here computes each output element with one fixed sequence of operations
 * that depends on the problem (K, head_dim, the row's own keys) and never on the number of
 * rows, on which row it is, or on the number of threads:
 *
 *   linear     y[m][n] = one multiply-add chain over k in order (see below). Rows are
 *              processed in register blocks of up to MB (the weights are read once per
 *              block and its rows reuse them from registers); the arithmetic per element
 *              is the same in every block shape. On AMX, bfloat16 rows go in tiles of 16
 *              (see groups_amx).
 *   attention  for each (row, head): scores in key order (each one FMA chain over the head
 *              dimension, read from a transposed copy of the keys), max, exp, sum in key
 *              order, output accumulated in key order; one (row, head) never looks at
 *              another, and keys a row may not see contribute exactly nothing.
 *   rmsnorm, silu_mul, rope   row by row, element by element.
 *   decoder    the whole decoder stack in one call: the kernels above in the order the
 *              per-kernel Python path calls them, on the same data (no new arithmetic).
 *
 * Weights may be float32 or bfloat16 (stored as uint16: the high half of a float32, so the
 * widening is exact). Activations and accumulation are float32; with native bfloat16 dot
 * products (AVX512-BF16) a row is rounded to bfloat16 once before a product. The draft head
 * may also use int8 weights with a float32 scale per output column (``block_i8``): half the
 * bytes of bfloat16 for a model whose numbers only propose tokens, never decide them.
 *
 * Built by app/engine/kernels/builds.py with gcc, once per CPU kind, for AVX-512 (with or
 * without BF16, with or without AMX tiles) or AVX2 + FMA (chosen at run time), and called
 * through ctypes (app/engine/kernels/__init__.py).
 *
 * The code lives in rowwise/, one file per kernel family, included below in this order into
 * this one translation unit:
 *
 *   vector.h        the 16-float vector on either ISA, its lane-tree sum and exp
 *   linear.c        the weight products on float32, bfloat16 (widened) and int8 weights
 *   linear_bf16.c   native bfloat16 products (VDPBF16PS, AMX tiles) and rowwise_linear
 *   attention.c     softmax attention over the transposed keys
 *   elementwise.c   RMSNorm, SwiGLU's product, RoPE
 *   decoder.c       the whole decoder stack in one call (and EAGLE-3's draft layer)
 *   cache.c         the KV cache's compaction after a tree verification
 *   logits.c        argmax, top-k q and p over rows of logits; the embedding lookup
 *
 * Why one translation unit rather than files compiled apart and linked: the parts share
 * static inline helpers, macros (MB, G, the prefetch distances) and the -D overrides of the
 * tests and sweeps, and gcc then inlines and schedules exactly as it did for one file, so
 * the split changed no instruction. The build's cache key hashes every part
 * (``builds.source_key``), so editing any of them rebuilds.
 */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "rowwise/vector.h"
#include "rowwise/linear.c"
#include "rowwise/linear_bf16.c"
#include "rowwise/attention.c"
#include "rowwise/elementwise.c"
#include "rowwise/decoder.c"
#include "rowwise/cache.c"
#include "rowwise/logits.c"
