"""Attention alone (``rowwise_attention``) over 30 layers' caches of L positions, for 1-8 query
rows under a tree mask, this checkout's build interleaved with others (a git revision or a
variant ``rowwise.c``, as ``scripts/forward_kernels.py --baseline`` takes them); a 4 MB sweep
between layers stands in for the weights that stream through the caches in a forward.

    L=900 python benchmarks/fast-forward/attention_two_rows_bench.py HEAD~1

Prints median / minimum ms of the 30 calls, per row count and build."""
import ctypes, sys, time, statistics, os
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "scripts"))
import torch
from app.engine import kernels
import forward_kernels as fk
L, layers, d, Hq, Hkv, threads = int(os.environ.get("L", 400)), 30, 64, 9, 3, 2
torch.set_num_threads(threads)
libs = {"new": kernels.load()}
for rev in sys.argv[1:]:
    libs[rev] = fk.baseline_kernels(rev)
cap = L + 64
K = [torch.randn(Hkv, cap, d) for _ in range(layers)]; V = [torch.randn(Hkv, cap, d) for _ in range(layers)]
KT = [torch.zeros(Hkv, cap // 16 + 1, d, 16) for _ in range(layers)]
sweep = torch.randn(1 << 20)
res = {(name, n): [] for name in libs for n in (1, 2, 4, 6, 8)}
for rep in range(15):
    for n in (1, 2, 4, 6, 8):
        q = torch.randn(n, Hq, d)
        mask = (torch.rand(n, L) > 0.2).to(torch.uint8); mask[:, 0] = 1
        out = torch.empty(n, Hq * d)
        scr = torch.empty(threads, max(lib.rowwise_attention_rows() for lib in libs.values()) * Hq // Hkv, L + 16)
        for name, lib in libs.items():
            valid = [ctypes.c_int(0) for _ in range(layers)]
            # bring the transposed copies up to date first (not timed)
            for l in range(layers):
                lib.rowwise_attention(q.data_ptr(), q.stride(0), q.stride(1), K[l].data_ptr(), V[l].data_ptr(), K[l].stride(0), n, Hq, Hkv, d, L, mask.data_ptr(), 0.125, out.data_ptr(), Hq * d, scr.data_ptr(), threads, KT[l].data_ptr(), KT[l].stride(0), ctypes.byref(valid[l]))
            t = 0.0
            for l in range(layers):
                sweep.add_(1.0)
                t0 = time.perf_counter()
                lib.rowwise_attention(q.data_ptr(), q.stride(0), q.stride(1), K[l].data_ptr(), V[l].data_ptr(), K[l].stride(0), n, Hq, Hkv, d, L, mask.data_ptr(), 0.125, out.data_ptr(), Hq * d, scr.data_ptr(), threads, KT[l].data_ptr(), KT[l].stride(0), ctypes.byref(valid[l]))
                t += time.perf_counter() - t0
            res[(name, n)].append(t * 1e3)
for name in libs:
    print(name, " ".join(f"n{n}:{statistics.median(res[(name, n)]):.2f}/{min(res[(name, n)]):.2f}" for n in (1, 2, 4, 6, 8)))
