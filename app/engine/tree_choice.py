"""The choice: predicted tokens/s of every candidate tree from a cost curve and a calibration
(plain arithmetic, no model runs), and the smallest tree within noise of the best
(``pick_robust``); ``TreeChoice`` carries everything needed to show why."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from app.engine.calibration import Calibration, mean
from app.engine.config import TreeConfig
from app.engine.cost import CostCurve, quantile

# Candidate tree sizes (draft nodes) and depths searched by ``choose_tree``.
DEFAULT_TOTALS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 63)
DEFAULT_DEPTHS = (1, 2, 3, 4, 5, 6, 7)


@dataclass
class Candidate:
    depth: int
    total_tokens: int
    tau: float                 # measured tokens per step (bonus included)
    tau_confidence: float      # EAGLE-2's estimate: 1 + sum of the kept nodes' confidences
    verify_ms: float           # T(total_tokens + 1)
    draft_ms: float            # T_draft(depth)
    other_ms: float
    tokens_per_s: float        # tau / (verify + draft + other)
    top_k: int | None = None   # 1 for a top-1 chain; None = the calibration's top_k
    noise: float = 0.0         # relative uncertainty of tokens_per_s (tau's standard error, T(n)'s spread)


def predict(cost: CostCurve, tau: float, depth: int, total_tokens: int, draft_ms_per_level: float,
            other_ms: float, verify_ms_per_row: float = 0.0) -> tuple[float, float, float]:
    """(verify ms, draft ms, predicted tokens/s) of one tree size. The whole cost model."""
    rows = total_tokens + 1                          # root + nodes in one forward
    verify = cost(rows) + verify_ms_per_row * rows   # + per-row acceptance work (softmax of p)
    draft = draft_ms_per_level * depth               # one head forward + LM head per level
    return verify, draft, 1000.0 * tau / (verify + draft + other_ms)


def rank_candidates(cost: CostCurve, tau_of, draft_ms_per_level: float, other_ms: float,
                    depths=DEFAULT_DEPTHS, totals=DEFAULT_TOTALS, verify_ms_per_row: float = 0.0,
                    tau_chain_of=None, tau_se_of=None) -> list[Candidate]:
    """Every (depth, total_tokens) in the grid with its predicted tokens/s, best first.

    ``tau_of(depth, total) -> (tau, tau_confidence)``. Trees with fewer nodes than levels
    are skipped (a depth-d tree needs at least d nodes to reach depth d). With
    ``tau_chain_of(depth)``, the top-1 chain of every depth (``top_k = 1``) competes too:
    with the same node count a chain reaches deeper than the dynamic tree's siblings, which
    wins where a few nodes are all the hardware affords. Ties go to the smaller tree
    (cheaper in memory, and the prediction's noise favours no one).
    """
    out = []

    def add(d: int, t: int, taus: tuple[float, float], top_k: int | None = None) -> None:
        tau, tau_c = taus
        verify, draft, tps = predict(cost, tau, d, t, draft_ms_per_level, other_ms, verify_ms_per_row)
        se = tau_se_of(d, None if top_k == 1 else t) if tau_se_of is not None else 0.0
        noise = ((se / tau) ** 2 + cost.rel_noise(t + 1) ** 2) ** 0.5 if tau > 0 else 0.0
        out.append(Candidate(depth=d, total_tokens=t, tau=tau, tau_confidence=tau_c, verify_ms=verify,
                             draft_ms=draft, other_ms=other_ms, tokens_per_s=tps, top_k=top_k, noise=noise))

    for d in depths:
        for t in totals:
            if t >= d:
                add(d, t, tau_of(d, t))
        if tau_chain_of is not None:
            add(d, d, tau_chain_of(d), top_k=1)   # a chain of depth d has exactly d nodes
    out.sort(key=lambda c: (-c.tokens_per_s, c.total_tokens, c.depth))
    return out


def pick_robust(ranked: list[Candidate]) -> Candidate:
    """The smallest candidate whose predicted tokens/s is within noise of the best one.

    A larger tree must beat a smaller one by more than the two predictions' combined noise
    (their relative uncertainties added in quadrature, times the best rate) to be chosen:
    a small tree costs less memory and less when the prediction is wrong, and on a shared
    machine a noisy measurement should not buy a big tree. With no noise this is the argmax.
    ``ranked`` is best first (``rank_candidates``)."""
    best = ranked[0]
    by_size = sorted(ranked, key=lambda c: (c.total_tokens, c.depth))
    for c in by_size:
        if (c.total_tokens, c.depth) > (best.total_tokens, best.depth):
            break
        margin = best.tokens_per_s * (best.noise ** 2 + c.noise ** 2) ** 0.5
        if c.tokens_per_s >= best.tokens_per_s - margin:
            return c
    return best


@dataclass
class TreeChoice:
    """The chosen tree and everything needed to show why (the app renders ``to_dict``)."""

    tree: TreeConfig
    predicted_tokens_per_s: float
    predicted_vanilla_tokens_per_s: float
    cost_curve: CostCurve
    draft_ms_per_level: float
    other_ms: float
    verify_ms_per_row: float
    candidates: list[Candidate]          # best first
    calibration_steps: int
    calibration_top_k: int | None = None  # the top_k of every candidate whose own top_k is None

    @property
    def beats_vanilla(self) -> bool:
        """False when no tree is predicted to beat plain decoding (e.g. an untrained head):
        then the caller should decode with method vanilla, and say why."""
        return self.predicted_speedup > 1.0

    @property
    def predicted_speedup(self) -> float:
        v = self.predicted_vanilla_tokens_per_s
        return self.predicted_tokens_per_s / v if v > 0 else 0.0

    @property
    def chosen(self) -> Candidate:
        """The candidate the tree was made from (``pick_robust``'s, not always the argmax)."""
        t = self.tree
        return next((c for c in self.candidates if (c.depth, c.total_tokens) == (t.depth, t.total_tokens)
                     and (c.top_k or self.calibration_top_k) == t.top_k), self.candidates[0])

    def summary(self) -> str:
        c = self.chosen
        return (f"auto tree: depth {self.tree.depth}, total_tokens {self.tree.total_tokens}, top_k {self.tree.top_k} "
                f"-> predicted {self.predicted_tokens_per_s:.1f} tokens/s (tau {c.tau:.2f}, "
                f"verify {c.verify_ms:.0f} + draft {c.draft_ms:.0f} + other {c.other_ms:.0f} ms per step), "
                f"{self.predicted_speedup:.2f}x predicted vanilla {self.predicted_vanilla_tokens_per_s:.1f} tokens/s")

    def to_dict(self) -> dict:
        return {
            "tree": {"method": self.tree.method, "depth": self.tree.depth, "top_k": self.tree.top_k,
                     "total_tokens": self.tree.total_tokens},
            "predicted_tokens_per_s": self.predicted_tokens_per_s,
            "predicted_vanilla_tokens_per_s": self.predicted_vanilla_tokens_per_s,
            "predicted_speedup": self.predicted_speedup,
            "beats_vanilla": self.beats_vanilla,
            "cost_curve": asdict(self.cost_curve),
            "draft_ms_per_level": self.draft_ms_per_level,
            "other_ms": self.other_ms,
            "verify_ms_per_row": self.verify_ms_per_row,
            "calibration_steps": self.calibration_steps,
            "calibration_top_k": self.calibration_top_k,
            "candidates": [asdict(c) for c in self.candidates],
        }


def choose_from(cost: CostCurve, cal: Calibration, base: TreeConfig = TreeConfig(),
                depths=DEFAULT_DEPTHS, totals=DEFAULT_TOTALS) -> TreeChoice:
    """The tree to decode with, from a cost curve and a calibration (pure: no model runs):
    the smallest candidate within noise of the cost model's argmax (``pick_robust``).

    The calibration's timings were taken at another moment than the curve's, perhaps under
    another load, so they are first put on the curve's scale: the calibration's own vanilla
    step (timed between its tree runs) corresponds to the curve's T(1), and every calibration
    time is multiplied by T(1) / that step. A busy neighbour during either measurement then
    changes no prediction's ratio to vanilla."""
    depths = [d for d in depths if d <= cal.depth]
    totals = [t for t in totals if t <= cal.total_tokens]
    vanilla_cal = quantile(cal.vanilla_step_ms, 0.5) if cal.vanilla_step_ms else 0.0
    scale = cost(1) / vanilla_cal if vanilla_cal > 0 else 1.0
    draft_per_level = scale * mean(cal.draft_ms) / cal.depth
    # The engine's verify phase = the bare forward T(n) + per-row work (the softmax of every
    # row's logits, acceptance); whatever exceeds T(n) at the calibration size is charged per row.
    rows = cal.total_tokens + 1
    per_row = max(0.0, scale * mean(cal.verify_ms) - cost(rows)) / rows
    # Everything else in a step (KV commit, the step record): a constant.
    other = scale * max(0.0, mean(cal.step_ms) - mean(cal.draft_ms) - mean(cal.verify_ms))
    ranked = rank_candidates(cost, cal.tau, draft_per_level, other, depths, totals, per_row,
                             tau_chain_of=cal.tau_chain, tau_se_of=cal.tau_se)
    best = pick_robust(ranked)
    vanilla_ms = cost(1)          # the vanilla step on the curve's scale
    tree = replace(base, method="dynamic", depth=best.depth, total_tokens=best.total_tokens,
                   top_k=best.top_k or cal.top_k)
    return TreeChoice(tree=tree, predicted_tokens_per_s=best.tokens_per_s,
                      predicted_vanilla_tokens_per_s=1000.0 / vanilla_ms, cost_curve=cost,
                      draft_ms_per_level=draft_per_level, other_ms=other, verify_ms_per_row=per_row,
                      candidates=ranked,
                      calibration_steps=len(cal.steps), calibration_top_k=cal.top_k)
