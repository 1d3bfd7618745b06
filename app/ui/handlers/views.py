"""What a run looks like on the page: the views of one step (tree, phase account, mask, KV,
the A/B trees), of a run while it streams (``live_view``) and of a finished run
(``final_view``), with its status line. Pure functions of the session."""
from __future__ import annotations

from enum import StrEnum

from app.engine.events import StepEvent, decoding_steps
from app.ui.handlers.ab import compare_view, run_label
from app.ui.handlers.speedup import speedup_headline, speedup_text
from app.ui.session import Session
from app.viz.compare import ab_trees_figure
from app.viz.insights import calibration_figure, depth_figure, tokens_per_step_figure
from app.viz.methods import method_name
from app.viz.phases import decoding_total, phase_account, step_number
from app.viz.race import race_figure
from app.viz.stream import stream_html
from app.viz.tree import tree_figure
from app.viz.verify_view import kv_caption, kv_figure, mask_caption, mask_figure


class RunView(StrEnum):
    """The views of a run on the page, each a component (``blocks/layout.py``) and a key of the
    handlers' view dicts (a member equals its string, so either spelling finds it). The
    members' order is the order of outputs of the main events (Generate, Step, Stop, a
    loaded trace), so of the public API: the first release's keep their places, a new view
    is appended at the end."""

    STATUS = "status"
    STREAM = "stream"
    TREE = "tree"
    SPEEDUP = "speedup"
    RACE = "race"
    SLIDER = "slider"
    PHASES = "phases"
    DEPTH = "depth"
    CALIBRATION = "calibration"
    PER_STEP = "per_step"
    TRACE_FILE = "trace_file"
    MASK = "mask"
    MASK_CAPTION = "mask_caption"
    KV = "kv"
    KV_CAPTION = "kv_caption"
    AB_TREES = "ab_trees"
    AB = "ab"
    AB_CAPTION = "ab_caption"


# The tree plot's figure height: fixed, so the page does not jump while a run streams (a taller
# tree scrolls inside its panel, see static/app.css).
TREE_PX = 440


def _rate(steps: list[StepEvent]) -> tuple[int, float, float]:
    """(tokens, engine seconds, tokens/s) of a list of steps, after the prefill."""
    steps = decoding_steps(steps)
    n = sum(len(s.new_tokens) for s in steps)
    t = sum(s.step_ms for s in steps) / 1000.0
    return n, t, (n / t if t > 0 else 0.0)


def _switch_reasons(session: Session) -> dict[int, str]:
    """{record step: why the adaptive run changed its tree there} (``TreeAdapter.switches``
    counts the decoding steps it had seen before choosing, so record step = that + 1)."""
    adapter = session.adapter
    return {seen + 1: why for seen, _, why in getattr(adapter, "switches", [])} if adapter else {}


def step_view(session: Session, index: int | None, total: int | None = None, compare: bool = True) -> dict:
    """What the page shows for one step of the run on screen: its tree (fixed height), the
    account of its three phases (numbered as a person reads them: the prefill, then step 1, 2,
    ...), the verify forward's attention mask and the KV cache, each with its caption, and the
    A/B trees at this step index when a run is pinned (and ``compare``: not while a run
    streams, whose B is not finished). ``index`` None: no step yet."""
    steps = session.steps
    step = steps[index] if steps and index is not None else None
    previous = steps[index - 1] if step is not None and index > 0 else None
    number = step_number(steps, index) if step is not None else None
    view = {"tree": tree_figure(step, height=TREE_PX, number=number),
            "phases": phase_account(step, total, number, previous,
                                    _switch_reasons(session).get(step.step) if step is not None else None),
            "mask": mask_figure(step, number=number), "mask_caption": mask_caption(step),
            "kv": kv_figure(step, number=number), "kv_caption": kv_caption(step)}
    pinned = session.pinned
    if compare and pinned is not None and pinned.run_id != session.run_id and step is not None:
        a_step = pinned.steps[index] if index < len(pinned.steps) else None
        view["ab_trees"] = ab_trees_figure(a_step, step, labels=(pinned.label, run_label(session.settings, "B")))
    return view


def live_view(session: Session, status: str, vanilla_steps: list[StepEvent] | None = None) -> dict:
    """The page while the EAGLE run streams: text, latest step (tree, account, mask, KV), the
    race so far (against the vanilla run interleaved with it, when there is one), running numbers."""
    steps = session.steps
    n, _, rate = _rate(steps)
    forwards = max(len(steps) - 1, 0)
    tau = n / forwards if forwards else 0.0
    name = method_name(session.settings.get("method", "EAGLE"), steps)
    return {"status": status,
            "stream": stream_html(steps),
            **step_view(session, len(steps) - 1 if steps else None, compare=False),
            "speedup": f"**{name}**: {n} tokens in {forwards} decoding steps, "
                       f"τ = {tau:.2f} tokens/forward, {rate:.1f} tokens/s so far",
            # A plain value, not a (maximum, value) component update: Gradio rebuilds a
            # component's whole config (JSON schema included) on every property update, which
            # cost the engine ~10% of its speed at 4 updates/s. The run's first view sets the
            # slider's range once (``_first_view``), the final view shrinks it to the steps made.
            "slider": max(len(steps) - 1, 0),
            "race": race_figure(steps, vanilla_steps, eagle_label=name)}


def run_status(session: Session, index: int | None) -> str:
    """The status line of a finished run showing step ``index``: what the run is
    (``session.status_base``, set by ``final_view``), the step shown, and the speedup headline
    (``speedup_headline``). The slider's moves redraw it, so it never names another step."""
    base = getattr(session, "status_base", "")
    steps = session.steps
    if not steps or index is None:
        return base
    shown = "the prefill" if steps[index].prefill else \
        f"step {step_number(steps, index)} of {decoding_total(steps)}"
    headline = speedup_headline(session)
    return f"{base} Showing {shown}." + (f"\n\n{headline}" if headline else "")


def final_view(session: Session, status: str, index: int | None = None) -> dict:
    """Everything about a finished run (live or loaded from a trace), showing step ``index``
    (default: the last)."""
    steps = session.steps
    last = max(len(steps) - 1, 0)
    index = last if index is None else min(max(index, 0), last)
    session.status_base = status
    view = {"status": run_status(session, index if steps else None),
            "stream": stream_html(steps, highlight=index if index != last else None),
            **step_view(session, index if steps else None, decoding_total(steps)),
            "speedup": speedup_text(session),
            "race": race_figure(steps, session.race_vanilla.steps if session.race_vanilla else None,
                                eagle_label=method_name(session.settings.get("method", "EAGLE"), steps)),
            "slider": (last, index),
            "depth": depth_figure(steps), "calibration": calibration_figure(steps),
            "per_step": tokens_per_step_figure(steps)}
    view.update(compare_view(session, index))
    return view
