"""Why the page's default tree has the size it has: autotune's measured parts, drawn.

``app.engine.autotune.choose_tree`` picks the tree with the highest predicted tokens/s from
two measurements on this machine (its ``TreeChoice.to_dict()`` is the input here):

- left, the cost curve T(n): one target forward over n query tokens, i.e. the verify forward
  of a tree of n - 1 draft nodes. On a GPU it is nearly flat (decoding is memory-bound), so
  big trees are almost free; on a small CPU it climbs, and every node must earn its cost;
- right, the prediction for every candidate: tau / (T(N + 1) + drafting + other), with
  total_tokens N on the x axis and one line per depth (top-1 chains as diamonds), plain
  decoding's tokens/s as a dashed line, and the chosen tree as a star.

The text beside it (``choice_markdown``) gives the numbers: the chosen tree, the parts of
its step and the best few candidates.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.engine.config import TreeShape
from app.viz import style

# a line per depth: light to dark as trees get deeper
DEPTH_COLOURS = ("#93c5fd", "#60a5fa", "#3b82f6", "#2563eb", "#1d4ed8", "#1e40af", "#1e3a8a")


def _label(c: dict, default_top_k: int | None = None) -> str:
    """"tree 8/3/4" (total / depth / top_k) or "chain 2/2/1"; a candidate's top_k is None when
    it is the calibration's."""
    top_k = c.get("top_k") or default_top_k
    kind = "chain" if c.get("top_k") == 1 else "tree"
    if not top_k:        # neither the candidate's nor the calibration's: only N/d is known
        return f"{kind} {c['total_tokens']}/{c['depth']}"
    return f"{kind} {TreeShape.of({**c, 'top_k': top_k})}"


def chosen_candidate(choice: dict) -> dict:
    """The candidate the chosen tree was made from (``TreeChoice.chosen``): the smallest tree
    within noise of the fastest, not always the first (fastest) row. The text, the table's
    "← chosen" mark and the figure's star all read this one."""
    t, default_k = choice["tree"], choice.get("calibration_top_k")
    return next((c for c in choice["candidates"] if (c["depth"], c["total_tokens"]) == (t["depth"], t["total_tokens"])
                 and (c.get("top_k") or default_k) == t["top_k"]), choice["candidates"][0])


def choice_figure(choice: dict, height: int = 340) -> go.Figure:
    """Cost curve (left) and predicted tokens/s of every candidate (right) of one TreeChoice."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "measured: one target forward over n tokens", "predicted: tokens/s of each tree size"))
    curve = choice["cost_curve"]
    fig.add_trace(go.Scatter(x=curve["sizes"], y=curve["ms"], mode="lines+markers", name="T(n)",
                             line=dict(color=style.ROOT), showlegend=False,
                             hovertemplate="n = %{x} tokens: %{y:.1f} ms<extra></extra>"), row=1, col=1)
    fig.update_xaxes(title_text="n (query tokens = 1 + draft nodes)", type="log", row=1, col=1)
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=1)

    trees = [c for c in choice["candidates"] if c.get("top_k") != 1]
    for depth in sorted({c["depth"] for c in trees}):
        line = sorted((c for c in trees if c["depth"] == depth), key=lambda c: c["total_tokens"])
        fig.add_trace(go.Scatter(
            x=[c["total_tokens"] for c in line], y=[c["tokens_per_s"] for c in line], mode="lines+markers",
            name=f"depth {depth}", marker=dict(size=5),
            line=dict(color=DEPTH_COLOURS[min(depth, len(DEPTH_COLOURS)) - 1], width=1.5),
            customdata=[[c["tau"], c["verify_ms"] + c["draft_ms"] + c["other_ms"]] for c in line],
            hovertemplate=f"depth {depth}, %{{x}} nodes: %{{y:.1f}} tokens/s "
                          "(tau %{customdata[0]:.2f}, %{customdata[1]:.0f} ms a step)<extra></extra>"), row=1, col=2)
    chains = sorted((c for c in choice["candidates"] if c.get("top_k") == 1), key=lambda c: c["total_tokens"])
    if chains:
        fig.add_trace(go.Scatter(
            x=[c["total_tokens"] for c in chains], y=[c["tokens_per_s"] for c in chains], mode="markers",
            name="top-1 chain", marker=dict(symbol="diamond", size=8, color=style.DRAFT),
            customdata=[[c["tau"]] for c in chains],
            hovertemplate="chain of %{x}: %{y:.1f} tokens/s (tau %{customdata[0]:.2f})<extra></extra>"),
            row=1, col=2)
    best = chosen_candidate(choice)
    fig.add_trace(go.Scatter(x=[best["total_tokens"]], y=[best["tokens_per_s"]], mode="markers",
                             name=f"chosen: {_label(best, choice.get('calibration_top_k'))}",
                             marker=dict(symbol="star", size=16, color="#f59e0b", line=dict(color="black", width=1)),
                             hovertemplate="chosen: %{y:.1f} tokens/s<extra></extra>"), row=1, col=2)
    fig.add_hline(y=choice["predicted_vanilla_tokens_per_s"], line=dict(color=style.VANILLA, dash="dash"),
                  annotation_text="vanilla", annotation_position="bottom right", row=1, col=2)
    fig.update_xaxes(title_text="total_tokens (draft nodes verified)", type="log", row=1, col=2)
    fig.update_yaxes(title_text="tokens/s", rangemode="tozero", row=1, col=2)
    fig.update_layout(style.BASE_LAYOUT, height=height, margin=dict(l=50, r=20, t=60, b=45),
                      legend=dict(orientation="h", y=-0.28, x=0.55, font=dict(size=11)))
    return fig


def choice_markdown(choice: dict, rows: int = 5) -> str:
    """The chosen tree, its predicted step, the shape of the cost curve and the best candidates."""
    best, cost = chosen_candidate(choice), choice["cost_curve"]
    t1 = cost["ms"][0]
    chosen = choice["tree"]
    step = best["verify_ms"] + best["draft_ms"] + best["other_ms"]
    lines = [
        f"**Chosen here: total_tokens {chosen['total_tokens']}, depth {chosen['depth']}, top_k {chosen['top_k']}** — "
        f"predicted {best['tokens_per_s']:.1f} tokens/s, "
        f"**{best['tokens_per_s'] / choice['predicted_vanilla_tokens_per_s']:.2f}×** plain "
        f"decoding ({choice['predicted_vanilla_tokens_per_s']:.1f} tokens/s)."
        + ("" if best is choice["candidates"][0] else
           f" The fastest prediction, {_label(choice['candidates'][0], choice.get('calibration_top_k'))} at "
           f"{choice['candidates'][0]['tokens_per_s']:.1f} tokens/s, is within the measurement's noise of it, so "
           "the smaller tree is kept (less work per step for the same speed)."),
        "",
        f"A step of this tree: verify {best['verify_ms']:.1f} ms (one forward over {best['total_tokens'] + 1} tokens) + "
        f"draft {best['draft_ms']:.1f} ms ({best['depth']} head forwards, {choice['draft_ms_per_level']:.1f} ms each) + "
        f"other {best['other_ms']:.1f} ms = {step:.1f} ms, which commits τ = {best['tau']:.2f} tokens on average. "
        f"Predicted tokens/s = τ / step time, for every candidate; the largest wins.",
        "",
        "On this machine one forward costs " + ", ".join(
            f"{ms:.0f} ms over {n} token{'s' if n > 1 else ''} ({ms / t1:.1f}× one)" if n > 1 else f"{ms:.0f} ms over 1 token"
            for n, ms in zip(cost["sizes"], cost["ms"]) if n in (1, 4, 16, 64)) + ". "
        "The flatter this curve, the bigger the tree that pays: on a GPU it is nearly flat and EAGLE-2's "
        "60-node trees win; on a small CPU each extra node must add more tokens than its share of the forward costs.",
        "",
        f"τ of each tree is measured, not modelled: a calibration run ({choice['calibration_steps']} steps with one large "
        "tree, built-in prompts) records which nodes the target accepted, and a smaller tree accepts exactly the "
        "accepted nodes it contains.",
        "",
        "| tree (total / depth / top_k) | τ | verify ms | draft ms | tokens/s | × vanilla |",
        "|---|---|---|---|---|---|",
    ]
    vanilla = choice["predicted_vanilla_tokens_per_s"]
    shown = choice["candidates"][:rows]
    biggest = max(choice["candidates"], key=lambda c: (c["total_tokens"], c["tokens_per_s"]))
    for extra in (best, biggest):
        if extra not in shown:
            shown = shown + [extra]
    for i, c in enumerate(shown):
        name = _label(c, choice.get("calibration_top_k"))
        name += (" ← chosen" if c is best else " (fastest predicted)" if i == 0 else
                 " (largest tried)" if c is biggest and i >= rows else "")
        lines.append(f"| {name} | {c['tau']:.2f} | {c['verify_ms']:.1f} | {c['draft_ms']:.1f} | "
                     f"{c['tokens_per_s']:.1f} | {c['tokens_per_s'] / vanilla:.2f} |")
    if not choice["beats_vanilla"]:
        lines += ["", "No tree is predicted to beat plain decoding with this head here: use method vanilla."]
    return "\n".join(lines)
