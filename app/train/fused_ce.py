"""The training-time test's per-depth loss over the draft vocabulary, fused by inductor.

At every depth s of an EAGLE-3 training step the head's logits q_s (N, Vd) meet the target's
distribution p (R, Vd) at the rows ``rows`` (N,) that step reads:

    ce  = mean_n  -Σ_v p[rows[n], v] · log softmax(q_s[n])_v        (soft targets)
    acc = mean_n  [argmax q_s[n] == argmax p[rows[n]]]              (top-1 agreement)

With Vd = 8,192 and N ≈ 3,300 rows a batch, each (N, Vd) float32 tensor is ~100 MB, and in
eager PyTorch the upcast, the gather of p's rows, log_softmax, the product, its sum and the
argmax each read and write one — and backward as many again. That memory traffic was ~45% of
a step's profiled time on a CPU (``aten::mul``, ``_log_softmax``, ``index``, ``copy_`` and
``argmax`` on (N, Vd) tensors). ``torch.compile`` fuses each direction into one pass over the
rows: this part runs ~3x faster, the whole step 8% (2 threads) to 17% (1 thread) faster on a
2-vCPU AMX Xeon (``benchmarks/eagle3-training-step.md``). Shapes vary from batch to batch,
so it is compiled once with dynamic shapes.

Where inductor cannot build (no C compiler, say) the same function runs eagerly, with the
reason logged once: the values are the same either way.
"""
from __future__ import annotations

import sys

import torch


def soft_ce_and_agreement(logits: torch.Tensor, p: torch.Tensor, rows: torch.Tensor,
                          p_top: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ce, acc) as in the module doc. ``logits`` (N, Vd) any float dtype (bf16 under
    autocast), ``p`` (R, Vd) float32 rows summing to 1, ``rows`` (N,) long, ``p_top`` (R,) long
    (argmax of p). ce carries the gradient; acc does not."""
    q = logits.float()
    ce = -(p[rows] * torch.log_softmax(q, -1)).sum(-1).mean()
    acc = (q.detach().argmax(-1) == p_top[rows]).float().mean()
    return ce, acc


def target_distribution(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, argmax p): the target's softmax over the draft vocabulary, float32, and its top token."""
    p = torch.softmax(logits.float(), -1)
    return p, p.argmax(-1)


_FAILED: list[str] = []


def fused(fn):
    """``fn`` compiled by inductor (dynamic shapes, compiled at its first call), or ``fn``
    itself where compiling fails; the first failure is reported on stderr and every fused
    function runs eagerly from then on."""
    compiled = torch.compile(fn, dynamic=True)

    def call(*args):
        if _FAILED:
            return fn(*args)
        try:
            return compiled(*args)
        except Exception as exc:    # inductor's failures come as many types (no compiler, a backend bug)
            _FAILED.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            print(f"[train] the fused loss could not be compiled ({_FAILED[0]}); running it eagerly "
                  "(same values, slower)", file=sys.stderr, flush=True)
            return fn(*args)
    return call


fused_soft_ce_and_agreement = fused(soft_ce_and_agreement)
fused_target_distribution = fused(target_distribution)
