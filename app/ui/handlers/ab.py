"""A/B: a pinned run (A) against the run on screen (B): pinning, the comparison panel and
each run's short name."""
from __future__ import annotations

from app.ui.handlers.speedup import session_race
from app.ui.session import PinnedRun, Session
from app.viz.compare import ab_caption, ab_figure, ab_trees_figure
from app.viz.phases import tree_shape


def run_label(settings: dict, letter: str) -> str:
    """A short name of a run for the comparison: its letter, method and tree (N/d/k)."""
    method = settings.get("method", "?")
    tree = "" if method == "vanilla" else (" adaptive" if settings.get("adapt") else " " + tree_shape(
        {k: settings.get(k) for k in ("method", "total_tokens", "depth", "top_k")})
        + (f"+lookup{settings['lookup']}" if settings.get("lookup") else ""))
    temperature = settings.get("temperature") or 0.0
    return f"{letter}: {method}{tree}{f' T={temperature:g}' if temperature else ''}"


def pin(session: Session) -> dict:
    """Pin the run on screen as A (replacing any earlier pin: one pinned run per visitor)."""
    if session.summary is None or not session.steps:
        raise ValueError("Nothing to pin yet: generate or load a demo first, then pin it as A.")
    v = session.race_vanilla
    session.pinned = PinnedRun(run_id=session.run_id, label=run_label(session.settings, "A"),
                               settings=dict(session.settings), steps=tuple(session.steps), summary=session.summary,
                               vanilla_tokens_per_s=v.summary.tokens_per_s if v else None,
                               race=session_race(session))
    return {"ab_caption": f"**Pinned {session.pinned.label}.** Now change a setting and Generate, or load another "
                          "demo: that run becomes B and is compared with A here.",
            "ab": None, "ab_trees": None}


def compare_view(session: Session, index: int | None = None) -> dict:
    """The comparison panel: A (pinned) against B (the run on screen): acceptance by depth,
    tau and tokens/s (``ab_figure``), both trees at the same step index, and one caption.
    Empty views ({}) when nothing is pinned; a note when A is the run on screen."""
    a = session.pinned
    if a is None or session.summary is None:
        return {}
    if a.run_id == session.run_id:
        return {"ab_caption": f"**Pinned {a.label}.** Run something else to compare it with.",
                "ab": None, "ab_trees": None}
    b_label = run_label(session.settings, "B")
    v = session.race_vanilla
    # each run against its own vanilla: never A's tokens/s over B's vanilla
    vanillas = (a.vanilla_tokens_per_s, v.summary.tokens_per_s if v else None)
    races = (a.race, session_race(session))
    sizes = tuple(None if s.get("method") == "vanilla" or s.get("adapt") else s.get("total_tokens")
                  for s in (a.settings, session.settings))
    index = len(session.steps) - 1 if index is None else index
    a_step = a.steps[index] if index < len(a.steps) else None
    return {"ab": ab_figure(list(a.steps), a.summary, session.steps, session.summary, labels=(a.label, b_label),
                            vanilla_tokens_per_s=vanillas, races=races),
            "ab_trees": ab_trees_figure(a_step, session.steps[index], labels=(a.label, b_label)),
            "ab_caption": ab_caption(a.summary, session.summary, labels=(a.label, b_label), races=races,
                                     sizes=sizes)}
