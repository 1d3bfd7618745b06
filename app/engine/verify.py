"""Verification: which drafted tokens the target accepts. Pure functions over tensors.

Notation of the speculative-decoding papers: ``p`` is the *target* distribution, ``q`` the
*draft's*. Rows of ``p`` / ``logits`` are indexed like the verify forward's input:
row 0 is the root (the last committed token), row i + 1 is draft node i. The distribution of
node i's token is therefore row ``parents[i] + 1``.

``logits`` and ``p`` only need ``[row]`` indexing, so they can be full tensors (tests) or
``LazyRows`` that run the LM head on a row only when verification visits it (the engine).

Each rule returns ``(path, bonus)``: the accepted node indices from the root down, and the
token the target itself contributes after them. All three are lossless:

* greedy      — accept a child iff it equals the target's argmax: the output is exactly
                that of plain greedy decoding.
* sequential  — for trees whose children were chosen deterministically (top-k of q): at the
                current node try its children in order; accept child c with probability
                r(c) under the residual r (initially p); on rejection set r(c) = 0 and
                renormalise; if every child is rejected, the bonus is drawn from r. Because
                each candidate's draft "distribution" is a point mass, this is the
                min(1, p/q) rule applied repeatedly, and the output is distributed as p.
* chain       — for a chain whose tokens were *sampled* from q: accept with probability
                min(1, p(x)/q(x)); on the first rejection draw from norm(max(0, p - q)).
All random draws use the caller's ``torch.Generator``, so a run replays exactly.
"""
from __future__ import annotations

import torch

from app.engine import kernels
from app.engine.config import SamplingConfig, TreeConfig
from app.engine.events import GREEDY, RULES, SAMPLED_CHAIN, SAMPLED_TREE  # noqa: F401  (the rules' names)


def rule_for(tree: TreeConfig | None, sampling: SamplingConfig) -> str:
    """Which rule verifies a step: greedy at temperature 0; under sampling, ``chain_verify``
    for a chain whose drafts were sampled from q (``TreeConfig.samples_drafts``), else
    ``sequential_verify`` (q's top-k as fixed candidates; with no tree at all it simply draws
    the next token from p)."""
    if sampling.greedy:
        return GREEDY
    return SAMPLED_CHAIN if tree is not None and tree.samples_drafts(sampling) else SAMPLED_TREE


def logits_to_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities shaped by temperature, top-k, top-p.

    With temperature 0 (greedy) this is the plain softmax: used for the records' p and q.
    """
    logits = logits.float()
    if sampling.temperature > 0:
        logits = logits / sampling.temperature
    if sampling.temperature > 0 and sampling.top_k_sampling > 0 and sampling.top_k_sampling < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k_sampling, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.temperature > 0 and sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the mass strictly before it already reaches top_p (the best token stays)
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class LazyRows:
    """``rows[r]`` = ``compute(r)``, computed on first access and kept. ``batch`` (R, ...)
    holds rows computed together, ``batch[i]`` being row ``batch_rows[i]``; they are read
    from it when asked for (a view per row read, not per row of the batch)."""

    def __init__(self, compute, batch: torch.Tensor | None = None, batch_rows: list[int] = ()):
        self._compute = compute
        self._batch = batch
        self._in_batch = {row: i for i, row in enumerate(batch_rows)}
        self._rows: dict[int, torch.Tensor] = {}

    def __getitem__(self, row: int) -> torch.Tensor:
        if row not in self._rows:
            i = self._in_batch.get(row)
            self._rows[row] = self._compute(row) if i is None else self._batch[i]
        return self._rows[row]


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a (V,) distribution."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def _uniform(generator: torch.Generator, device) -> float:
    return float(torch.rand((), generator=generator, device=device).item())


def argmax(row: torch.Tensor) -> int:
    """The target's greedy token for a row of logits (V,): torch.argmax's rule (the first
    maximum), by the fast kernels where they run (~10 against ~60 us for 49,152 logits on
    one CPU core), else by torch. Vanilla and EAGLE steps both come through here."""
    best = kernels.argmax(row)
    return int(row.argmax()) if best is None else best


def greedy_verify(logits, tokens: list[int], children: list[list[int]]) -> tuple[list[int], int]:
    """logits[row] (V,). Walk down while a child equals the target's argmax."""
    path: list[int] = []
    row = 0
    while True:
        best = argmax(logits[row])
        nxt = next((c for c in children[row] if tokens[c] == best), None)
        if nxt is None:
            return path, best
        path.append(nxt)
        row = nxt + 1


def sequential_verify(p, tokens: list[int], children: list[list[int]],
                      generator: torch.Generator) -> tuple[list[int], int]:
    """p[row] (V,) target probabilities. Multi-candidate rejection for deterministic children."""
    path: list[int] = []
    row = 0
    while True:
        residual = p[row]
        accepted = None
        for c in children[row]:
            mass = float(residual[tokens[c]])
            if mass > 0 and _uniform(generator, residual.device) < mass:
                accepted = c
                break
            if mass > 0:
                residual = residual.clone()
                residual[tokens[c]] = 0.0
                residual = residual / residual.sum()
        if accepted is None:
            return path, sample(residual, generator)
        path.append(accepted)
        row = accepted + 1


def chain_verify(p, q: torch.Tensor, tokens: list[int],
                 generator: torch.Generator) -> tuple[list[int], int]:
    """p[row] (V,) target, q (N, V) draft probabilities of a sampled chain (node i = depth i+1)."""
    path: list[int] = []
    for i, tok in enumerate(tokens):
        p_i = p[i]
        p_x, q_x = float(p_i[tok]), float(q[i, tok])
        if q_x > 0 and _uniform(generator, p_i.device) < min(1.0, p_x / q_x):
            path.append(i)
            continue
        residual = (p_i - q[i]).clamp_min(0.0)
        total = residual.sum()
        # total == 0 only if p == q, where rejection has probability 0; fall back to p for safety
        return path, sample(residual / total if total > 0 else p_i, generator)
    return path, sample(p[len(tokens)], generator)
