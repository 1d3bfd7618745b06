"""What happens when a visitor clicks: plain Python generators, no Gradio.

Each handler takes the app context (engine + server config), the visitor's ``Session`` and
raw widget values, and yields *views*: dicts from a view name ("stream", "tree", "speedup",
...) to a plain value (HTML string, plotly figure, Markdown, ``(maximum, value)`` for the
slider, a file path). ``blocks.py`` maps names to components; tests call handlers directly.
Bad input raises ``ValueError`` with a message for the page.

Speed: the engine decodes on the server's engine thread (``pump.BackgroundRun``; every torch
op runs on that one thread, see ``engine_thread``) and never waits for the page; the handler
draws at most once every ``ctx.update_interval`` seconds from whatever records have arrived,
and only the latest step's tree. The race's clock is the engine's own per-step time.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
import uuid
from dataclasses import dataclass

from app.engine.config import SETTING, TreeConfig, shown
from app.engine.events import StepEvent, decoding_steps
from app.ui import traces
from app.engine.threads import engine_probe
from app.ui.limits import kv_bytes, upload_folder
from app.ui.pump import BackgroundRun
from app.ui.race import VANILLA, interleave
from app.ui.requests import SETTING_NAMES, SWEEP_KNOBS, Request, build_request, setting_of
from app.ui.session import PinnedRun, Session, VanillaRun
from app.ui.settings import AppContext
from app.viz.insights import calibration_figure, depth_figure, explorer_figure, tokens_per_step_figure
from app.viz.compare import ab_caption, ab_figure, ab_trees_figure
from app.viz.glossary import term
from app.viz.phases import decoding_total, phase_account, step_number, tree_shape
from app.viz.race import RaceSpeedup, race_figure, race_speedup
from app.viz.safe import md_code
from app.viz.stream import stream_html
from app.viz.tree import tree_figure
from app.viz.verify_view import kv_caption, kv_figure, mask_caption, mask_figure

# The traces written for download: in the app's own folder, which Gradio serves files from as
# they are (a folder elsewhere is copied to where Gradio refuses to serve it: limits.upload_folder)
TRACE_DIR = os.path.join(upload_folder(), "traces")
TRACE_MAX_AGE_S = 3600
# trace files older than this are deleted, so a busy server's disk cannot fill
RACE_CHUNK_TOKENS = 16   # EAGLE and vanilla alternate every this many tokens (app/ui/race.py)
# The tree plot's figure height: fixed, so the page does not jump while a run streams (a taller
# tree scrolls inside its panel, see static/app.css).
TREE_PX = 440


# --- views: pure functions of the session ----------------------------------------------------

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
    return {"status": status,
            "stream": stream_html(steps),
            **step_view(session, len(steps) - 1 if steps else None, compare=False),
            "speedup": f"**{session.settings.get('method', '')}**: {n} tokens in {forwards} decoding steps, "
                       f"τ = {tau:.2f} tokens/forward, {rate:.1f} tokens/s so far",
            # A plain value, not a (maximum, value) component update: Gradio rebuilds a
            # component's whole config (JSON schema included) on every property update, which
            # cost the engine ~10% of its speed at 4 updates/s. The run's first view sets the
            # slider's range once (``_first_view``), the final view shrinks it to the steps made.
            "slider": max(len(steps) - 1, 0),
            "race": race_figure(steps, vanilla_steps, eagle_label=session.settings.get("method", "EAGLE"))}


def _identical_note(session: Session) -> str:
    """The lossless check: with greedy decoding EAGLE must give vanilla's exact tokens."""
    if session.summary is None or session.race_vanilla is None:
        return ""
    if session.settings.get("temperature", 0.0) != 0.0:
        return ("Sampling (temperature > 0): the outputs are different draws from the *same* "
                "distribution, so they need not match.")
    a, b = session.summary.token_ids, session.race_vanilla.summary.token_ids
    if a == b:
        return "Greedy output **identical** to vanilla decoding ✓ — speculative decoding is lossless."
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    dtype = session.model.get("dtype", "")
    why = ("This should not happen in float32 — please report it with the trace."
           if dtype == "float32" else
           f"In {md_code(dtype) if dtype else 'reduced precision'} a forward over 1 token and over a whole tree round "
           "differently, so after a near-tie the two greedy paths can part; in float32 they match exactly.")
    tie = session.parting
    if tie and tie.get("index") == first and dtype != "float32":
        why += (f" Here the target's two likeliest tokens at token {first} had p = {tie['p1']:.3f} and "
                f"{tie['p2']:.3f} (a gap of {tie['p1'] - tie['p2']:.3f}): a near-tie, tipped by rounding, "
                "not by the method.")
    return f"Greedy outputs **differ from token {first}** on. {why}"


def _measure_parting(ctx: AppContext, session: Session) -> None:
    """Where greedy EAGLE and vanilla outputs part (reduced precision), the target's top-2
    probabilities there (one forward on the engine thread), for ``_identical_note``."""
    session.parting = None
    if session.summary is None or session.race_vanilla is None or session.settings.get("temperature", 0.0) != 0.0:
        return
    a, b = session.summary.token_ids, session.race_vanilla.summary.token_ids
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None:
        return
    ids = ctx.engine.encode_prompt(session.settings["prompt"])
    (_, p1), (_, p2) = ctx.engine_thread.call(ctx.engine.top2_after, ids, a[:first])
    session.parting = {"index": first, "p1": p1, "p2": p2}


def session_race(session: Session) -> RaceSpeedup | None:
    """The run's speedup over the vanilla run raced with it (``race_speedup``): the one number
    behind the headline, its range, the status line and the A/B comparison."""
    v = session.race_vanilla
    if session.summary is None or v is None or session.summary.method == "vanilla":
        return None
    return race_speedup(session.steps, v.steps, RACE_CHUNK_TOKENS)


def speedup_headline(session: Session) -> str:
    """One short line for the stage (beside the tree): the speedup with its range, τ."""
    s = session.summary
    if s is None:
        return ""
    race = session_race(session)
    if s.method == "vanilla":
        return "vanilla: the baseline (1.00×)"
    speed = f"**{race.text()}** vanilla" if race is not None else "no vanilla raced"
    return (f"Speedup {speed}, {term('τ')} = {s.mean_accepted:.2f} tokens per {term('target forward')} "
            "(details under the answer)")


def speedup_text(session: Session) -> str:
    if session.summary is None:
        return ""
    s = session.summary
    head = (f"**{s.method}**: {s.new_tokens} tokens, {s.target_forwards} target forwards, "
            f"τ = {s.mean_accepted:.2f} tokens/forward, {s.tokens_per_s:.1f} tokens/s")
    if s.method == "vanilla":
        return head + " — vanilla is the baseline (speedup 1.00×)."
    v = session.race_vanilla
    if v is None:
        return head + " — no vanilla run to compare with."
    race = session_race(session)
    ratio_text = race.text() if race is not None else "n/a"
    why = speedup_decomposition(session.steps, v.steps)
    load = getattr(session, "load", None) or [None, None]
    conditions = (f" Machine load average {load[0]:.2f} → {load[1]:.2f} during the run; vanilla ran alongside, "
                  f"in chunks of {RACE_CHUNK_TOKENS} tokens." if None not in load else "")
    return (f"### Speedup {ratio_text}\n{head}; vanilla {v.summary.tokens_per_s:.1f} tokens/s "
            f"({v.summary.new_tokens} tokens).{conditions}\n\n" + (f"{why}\n\n" if why else "") + _identical_note(session))


def speedup_decomposition(eagle_steps, vanilla_steps) -> str:
    """The measured speedup split into its two factors, from the same step records as the race:

        speedup = (tokens per EAGLE step / tokens per vanilla step) × (vanilla step ms / EAGLE step ms)

    This is an identity, not a model: tokens/s = tokens per step / seconds per step for each
    run. It says why a speedup is what it is: a step must add more tokens than it costs
    vanilla steps, and where its time goes (draft, verify, the rest)."""
    eagle_steps, vanilla_steps = decoding_steps(eagle_steps), decoding_steps(vanilla_steps)
    if not eagle_steps or not vanilla_steps:
        return ""
    ms_e = sum(s.step_ms for s in eagle_steps) / len(eagle_steps)
    ms_v = sum(s.step_ms for s in vanilla_steps) / len(vanilla_steps)
    if ms_e <= 0 or ms_v <= 0:
        return ""       # a trace without timings
    tau_e = sum(len(s.new_tokens) for s in eagle_steps) / len(eagle_steps)
    tau_v = sum(len(s.new_tokens) for s in vanilla_steps) / len(vanilla_steps)
    draft = sum(s.draft_ms for s in eagle_steps) / len(eagle_steps)
    verify = sum(s.verify_ms for s in eagle_steps) / len(eagle_steps)
    cost = ms_e / ms_v
    vanilla_tokens = "1 token" if abs(tau_v - 1) < 5e-3 else f"{tau_v:.2f} tokens"
    factor = f"{tau_e:.2f} × {ms_v:.1f} / {ms_e:.1f}" if vanilla_tokens == "1 token" else \
        f"({tau_e:.2f} / {tau_v:.2f}) × ({ms_v:.1f} / {ms_e:.1f})"
    verdict = ("it adds more tokens than it costs vanilla steps, so it wins" if tau_e / tau_v > cost else
               "it costs more vanilla steps than it adds tokens, so vanilla wins: try a smaller tree")
    return (f"**Why**: one step made τ = {tau_e:.2f} tokens in {ms_e:.1f} ms (draft {draft:.1f} + verify "
            f"{verify:.1f} + other {max(0.0, ms_e - draft - verify):.1f}); one vanilla step made {vanilla_tokens} "
            f"in {ms_v:.1f} ms. Speedup = {factor} = **{tau_e / tau_v / cost:.2f}×**. A step costs "
            f"{cost:.2f} vanilla steps; {verdict}.")


def instructive_step(steps: list[StepEvent]) -> int:
    """The index of a step worth opening a recorded run on: the deepest accepted path among
    the steps where the target also rejected something (a tree that shows both outcomes),
    the earliest of equals; else the deepest accepted path; the last step when none drafted."""
    drafted = [i for i, s in enumerate(steps) if s.tree is not None and len(s.tree)]
    if not drafted:
        return max(len(steps) - 1, 0)
    mixed = [i for i in drafted if "rejected" in steps[i].tree.status] or drafted
    return max(mixed, key=lambda i: (len(steps[i].accepted), len(steps[i].tree), -i))


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
                                eagle_label=session.settings.get("method", "EAGLE")),
            "slider": (last, index),
            "depth": depth_figure(steps), "calibration": calibration_figure(steps),
            "per_step": tokens_per_step_figure(steps)}
    view.update(compare_view(session, index))
    return view


def replay_view(session: Session, index) -> dict:
    """The replay slider: step ``index``'s tree, account, mask and KV views, the text up to it."""
    steps = session.steps
    if not steps:
        return {"phases": phase_account(None)}
    if isinstance(index, bool) or not isinstance(index, (int, float)) or (
            isinstance(index, float) and not math.isfinite(index)):
        raise ValueError(f"step must be a number, got {shown(index)}")
    i = min(max(int(index), 0), len(steps) - 1)
    view = {"stream": stream_html(steps, upto=i, highlight=i), **step_view(session, i, decoding_total(steps))}
    if session.summary is not None and getattr(session, "status_base", None) is not None:
        view["status"] = run_status(session, i)    # the status follows the slider
    return view


def play_step(session: Session, index) -> tuple[dict, bool]:
    """Autoplay's tick: the view of the step after ``index`` and whether more steps follow
    (the page's timer stops when not). At the last step it starts again from step 1."""
    steps = session.steps
    if not steps:
        return {"phases": phase_account(None)}, False
    current = int(index) if isinstance(index, (int, float)) and not isinstance(index, bool) and math.isfinite(index) \
        else 0
    nxt = current + 1 if current + 1 < len(steps) else min(1, len(steps) - 1)
    view = replay_view(session, nxt)
    view["slider"] = nxt
    return view, nxt + 1 < len(steps)


# --- A/B: a pinned run against the run on screen ----------------------------------------------

def run_label(settings: dict, letter: str) -> str:
    """A short name of a run for the comparison: its letter, method and tree (N/d/k)."""
    method = settings.get("method", "?")
    tree = "" if method == "vanilla" else (" adaptive" if settings.get("adapt") else " " + tree_shape(
        {k: settings.get(k) for k in ("method", "total_tokens", "depth", "top_k")}))
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


# --- running the engine ----------------------------------------------------------------------

def _model_info(ctx: AppContext) -> dict:
    t = ctx.engine.target
    return {"target": t.name, "head": "" if ctx.engine.head is None else (ctx.config.draft_model or "shipped head"),
            "device": t.device.type, "dtype": str(t.dtype).replace("torch.", "")}


def parse(ctx: AppContext, raw: dict) -> Request:
    """Validate raw values; refuse EAGLE methods when the server has no head."""
    if ctx.engine is None:
        raise ValueError("This server has no model loaded: load a recorded trace instead.")
    request = build_request(ctx.config.limits, **raw)
    if request.tree.uses_draft and not ctx.has_head:
        raise ValueError(f"Method {request.tree.method} needs a draft head. {ctx.head_missing} "
                         "Choose method vanilla, or load a recorded trace.")
    return request


def _check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {shown(value)}")


def _check_step_mode(step_mode) -> None:
    _check_flag("step_mode", step_mode)


def check_generate(ctx: AppContext, raw: dict, step_mode=False, race=True) -> Request:
    """Every check a Generate click gets before any model work: the settings (``parse``),
    step_mode and race, and the engine's own ``check_request`` (prompt + max_new_tokens must
    fit the model's context). The page's event validator runs this once per click."""
    request = parse(ctx, raw)
    _check_step_mode(step_mode)
    _check_flag("race", race)
    ctx.engine.check_request(ctx.engine.encode_prompt(request.prompt), request.tree, request.max_new_tokens)
    return request


def judge(check, names=SETTING_NAMES) -> tuple[object | None, dict[str, str]]:
    """Run ``check()``: (its result, {}) when it passes, (None, {name: message}) when it
    refuses one of ``names`` (the message's first word), (None, {}) when it refuses anything
    else (no model on this server): the event itself reports that, as a page-wide error."""
    try:
        return check(), {}
    except ValueError as exc:
        name = setting_of(exc, names)
        return None, ({name: str(exc)} if name else {})


def request_problems(ctx: AppContext, raw: dict) -> dict[str, str]:
    """{setting: message} for a request that cannot run, {} for one that can (``judge``)."""
    return judge(lambda: check_generate(ctx, raw))[1]


def _run_vanilla(ctx: AppContext, session: Session, request: Request):
    """The other half of the race after a step-mode run (whose steps waited for clicks, so
    nothing could run alongside them): a fresh vanilla run, never one from earlier. Yields views."""
    key = request.vanilla_key()
    events = ctx.engine.generate(request.prompt, tree=TreeConfig(method="vanilla"), sampling=request.sampling,
                                 max_new_tokens=request.max_new_tokens)
    steps = []
    run = BackgroundRun(events, ctx.engine_thread)
    try:
        for batch in run.batches(ctx.update_interval):
            if session.stop_requested:
                return      # before taking the batch: a stopped race is never recorded as finished
            for ev in batch:
                if ev.type == "summary":
                    session.race_vanilla = VanillaRun(key, steps, ev)
                else:
                    steps.append(ev)
            if batch and session.race_vanilla is None:
                yield {"status": f"racing vanilla decoding: {sum(len(s.new_tokens) for s in steps)} tokens…",
                       "race": race_figure(session.steps, steps)}
    finally:
        run.close()


def _finish(ctx: AppContext, session: Session, request: Request, raced: bool = False):
    """After the EAGLE run: the race (unless it ran alongside, or was not asked for), then the
    final page and a trace file."""
    if request.tree.uses_draft and not raced and session.race_requested:
        yield {"status": "EAGLE done; racing vanilla decoding…"}
        if session.stop_requested:
            return          # Stop before the race: do not start it
        yield from _run_vanilla(ctx, session, request)
        if session.stop_requested:
            return          # Stop during the race: Stop's own message says what is on screen
    path = write_trace(session)
    view = final_view(session, _done_status(session))
    view["trace_file"] = path
    yield view


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _done_status(session: Session) -> str:
    page = ""
    if session.app_seconds and session.summary is not None and session.app_seconds > 0:
        page = f"; through this page {session.summary.new_tokens / session.app_seconds:.1f} tokens/s wall-clock"
    return f"done ({'vanilla measured alongside' if session.race_vanilla else 'no race'}{page})."


def tree_plan(ctx: AppContext, request: Request):
    """(the first step's tree, the ``TreeAdapter`` that picks every later one, or None).

    With ``adapt`` (method dynamic) the run adapts its tree while decoding
    (``app.engine.adapt.adapter_for``): among top-1 chains of depth 1-4 and the tree tuned
    for this machine when a kept profile exists, each step runs the one with the best tokens/s
    measured so far. Nothing is measured in the foreground. Otherwise every step uses the
    request's tree."""
    if not (request.adapt and request.tree.method == "dynamic"):
        return request.tree, None
    from app.engine.adapt import adapter_for

    start, adapter, _ = ctx.engine_thread.call(adapter_for, ctx.engine, request.tree, measure=False)
    return start, adapter


def use_request_threads(ctx: AppContext) -> None:
    """Set the thread count for the request about to run (``app.engine.threads``); on the
    engine thread, where the probe forward is built at the first request."""
    if ctx.thread_probe is None:
        ctx.thread_probe = engine_probe(ctx.engine)
    ctx.threads.apply(ctx.thread_probe)


def _raced(ctx: AppContext, eagle, vanilla):
    """The records of both runs, interleaved in chunks (``app.ui.race``), run on the engine
    thread with the thread count chosen for this request."""
    use_request_threads(ctx)
    yield from interleave(eagle, vanilla, RACE_CHUNK_TOKENS)


def generate(ctx: AppContext, session: Session, step_mode: bool = False, race: bool = True,
             request: Request | None = None, **raw):
    """Generate: stream the EAGLE run with a fresh vanilla run interleaved in chunks (the race;
    ``race=False`` skips it). Stop sets ``session.stop_requested``, which ends this generator
    at its next update; closing it (Gradio's cancel, a closed tab) does the same. Either way
    the engine's thread ends generation after the current step.

    ``request``: these raw values as already validated (by the page's event validator,
    ``check_generate``); without it they are validated here."""
    if request is None:
        request = parse(ctx, raw)
        _check_step_mode(step_mode)
    _check_flag("race", race)
    with session.running():
        start_tree, adapter = tree_plan(ctx, request)
        events = ctx.engine.generate(request.prompt, tree=start_tree, sampling=request.sampling,
                                     max_new_tokens=request.max_new_tokens, adapt=adapter)
        racing = race and request.tree.uses_draft and not step_mode
        vanilla_events = ctx.engine.generate(request.prompt, tree=TreeConfig(method="vanilla"),
                                             sampling=request.sampling,
                                             max_new_tokens=request.max_new_tokens) if racing else None
        session.start(request.settings(), _model_info(ctx))
        session.race_requested, session.adapter = race, adapter
        vanilla_steps: list[StepEvent] = []
        cached = vanilla_steps if racing else None

        def first_view() -> dict:
            """The run's first page: empty stream and tree, the slider's range set once for
            the whole run (no run has more steps than tokens), the last run's insights cleared."""
            return {**live_view(session, "prefill…", cached), "trace_file": None,
                    "slider": (max(request.max_new_tokens - 1, 1), 0),
                    "depth": None, "calibration": None, "per_step": None,
                    "ab": None, "ab_trees": None,
                    "ab_caption": (f"_{session.pinned.label} is pinned: this run becomes B when it finishes._"
                                   if session.pinned else "_Nothing pinned yet._")}

        if step_mode:
            yield first_view()
            session.stepper, session.stepper_request = events, request
            ctx.paused.hold(session, paused_run_bytes(ctx, request))   # bounded in time and memory
            yield from _step(ctx, session)
            return
        t0 = time.perf_counter()
        session.load = [_load_average(), None]
        run = BackgroundRun(_raced(ctx, events, vanilla_events), ctx.engine_thread)   # starts on its thread now
        try:
            yield first_view()   # drawn meanwhile
            for batch in run.batches(ctx.update_interval):
                if session.stop_requested:
                    return      # before taking the batch: what ran after Stop is never recorded as finished
                for side, ev in batch:
                    if side == VANILLA:
                        if ev.type == "summary":
                            session.race_vanilla = VanillaRun(request.vanilla_key(), list(vanilla_steps), ev)
                        else:
                            vanilla_steps.append(ev)
                    elif ev.type == "summary":
                        session.summary = ev
                        session.app_seconds = time.perf_counter() - t0
                    else:
                        session.steps.append(ev)
                if batch and (session.summary is None or (racing and session.race_vanilla is None)):
                    status = (f"decoding with {request.tree.method}"
                              + (f", vanilla racing alongside ({sum(len(s.new_tokens) for s in vanilla_steps)} tokens)"
                                 if racing else "") + "…")
                    yield live_view(session, status, cached)
        finally:
            run.close()
        session.load[1] = _load_average()
        if racing:
            _measure_parting(ctx, session)
        if session.app_seconds is None:
            session.app_seconds = time.perf_counter() - t0
        yield from _finish(ctx, session, request, raced=racing)


def step(ctx: AppContext, session: Session):
    """Step mode: advance the paused generation by exactly one target forward. Between clicks
    nothing holds the worker: the paused generation is just an iterator in the session."""
    with session.running():
        yield from _step(ctx, session)


def paused_run_bytes(ctx: AppContext, request: Request) -> int:
    """The KV caches a paused step-mode run holds (``limits.kv_bytes``)."""
    prompt_tokens = len(ctx.engine.encode_prompt(request.prompt))
    tree_tokens = request.tree.total_tokens if request.tree.uses_draft else 0
    return kv_bytes(ctx.engine, prompt_tokens, request.max_new_tokens, tree_tokens)


def check_step(session: Session) -> None:
    """Raise the message a Step click gets when no step-mode run is paused."""
    if session.stepper is None:
        raise ValueError(session.expired or "Nothing to step: tick 'step mode' and press Generate first.")


def _step(ctx: AppContext, session: Session):
    check_step(session)
    request = session.stepper_request
    ctx.paused.touch(session)
    ev = ctx.engine_thread.call(next, session.stepper, None)   # one target forward, on the engine thread
    if ev is not None and ev.type == "step":
        session.steps.append(ev)
        yield live_view(session, f"step mode: step {ev.step} done — press Step for the next one")
        return
    session.summary = ev
    session.stepper.close()
    session.stepper, session.stepper_request = None, None
    yield from _finish(ctx, session, request)


STOP_WAIT_S = 30.0   # a run ends within one engine step of Stop; this only bounds a stuck one


def stop(session: Session) -> dict:
    """Stop: ask the running handler to end, wait until it has (so no late "decoding…" update
    lands after this message), end a paused step-mode run, and show what was produced."""
    session.stop_requested = True
    session.wait_idle(STOP_WAIT_S)
    session.close()
    steps = session.steps
    tail = "; the vanilla race was not finished" if session.summary is not None and session.race_vanilla is None \
        and session.settings.get("method") != "vanilla" else ""
    done = decoding_total(steps)
    view = {"status": f"stopped after {done} decoding step{'s' if done != 1 else ''} (and the prefill){tail}."
            if steps else "stopped before the prefill."}
    if steps:
        # what was produced stays on screen: the text so far and the last step's tree, account,
        # mask and KV views (the live updates may not have drawn the latest steps yet)
        last = len(steps) - 1
        view.update(stream=stream_html(steps), **step_view(session, last, done), slider=(last, last),
                    depth=depth_figure(steps), calibration=calibration_figure(steps),
                    per_step=tokens_per_step_figure(steps))
    return view


# --- traces --------------------------------------------------------------------------------

def prune_traces(max_age_s: float = TRACE_MAX_AGE_S) -> None:
    """Delete trace files written more than ``max_age_s`` ago (Gradio serves them from where
    they are written, with no copy of its own; the upload budget may prune them sooner)."""
    cutoff = time.time() - max_age_s
    for entry in os.scandir(TRACE_DIR):
        try:
            if entry.name.startswith("eagle-lens-trace-") and entry.stat().st_mtime < cutoff:
                os.remove(entry.path)
        except FileNotFoundError:
            pass   # another request (or the upload budget) removed it first


def write_trace(session: Session) -> str | None:
    """Write the run on screen as JSON for the download button; replaces the visitor's last file."""
    if session.summary is None:
        return None
    os.makedirs(TRACE_DIR, exist_ok=True)
    prune_traces()
    if session.trace_path:
        with contextlib.suppress(FileNotFoundError):
            os.remove(session.trace_path)
    v = session.race_vanilla
    data = traces.trace_dict(session.settings, session.model, session.steps, session.summary,
                             v.steps if v else None, v.summary if v else None)
    path = os.path.join(TRACE_DIR, f"eagle-lens-trace-{uuid.uuid4().hex[:12]}.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(traces.dumps(data))
    session.trace_path = path
    return path


def recorded_where(model: dict, live: dict | None) -> str:
    """Where and how a trace was recorded, against what this server runs (a demo's speeds are
    the recording machine's, not this one's)."""
    device = {"cpu": "a CPU", "cuda": "a GPU", "mps": "an Apple GPU"}.get(str(model.get("device", "")), "")
    parts = [p for p in (md_code(model["target"], 60) if model.get("target") else "",
                         f"on {device}" if device else "",
                         f"in {md_code(model['dtype'], 20)}" if model.get("dtype") else "") if p]
    text = "recorded " + " ".join(parts) if parts else "recorded elsewhere"
    if live and live.get("dtype") and (live.get("dtype") != model.get("dtype") or live.get("device") != model.get("device")):
        text += (f"; this server runs {live.get('dtype')} on its {str(live.get('device', '')).upper()}: "
                 "its speeds are the recording machine's")
    return text


def show_trace(session: Session, trace: traces.Trace, name: str, live: dict | None = None) -> dict:
    """Put a validated trace on screen as if it had just run, opened on an instructive step
    (``instructive_step``). The view's "settings" are the trace's settings and "race" whether
    it raced vanilla, for the page to restore into its controls (Generate then reproduces it)."""
    session.start(trace.settings, trace.model, source=f"trace: {name}")
    session.steps, session.summary = list(trace.steps), trace.summary
    if trace.vanilla_steps is not None:
        session.race_vanilla = VanillaRun(("trace", name), list(trace.vanilla_steps), trace.vanilla_summary)
    # the trace's model note is the uploader's text: shown as code, never as Markdown
    known = {"target", "device", "dtype", "head"}
    extra = ", ".join(f"{md_code(k, 40)} {md_code(v)}" for k, v in trace.model.items() if v and k not in known)
    where = recorded_where(trace.model, live) + (f"; {extra}" if extra else "")
    index = instructive_step(session.steps)
    view = final_view(session, f"replaying {md_code(name)} ({where}) — no model involved; drag the slider or "
                               "press ▶ to play.", index=index)
    return {**view, "settings": dict(trace.settings), "race_on": trace.vanilla_steps is not None}


def read_trace_file(ctx: AppContext, path) -> traces.Trace:
    """An uploaded trace, checked and parsed: Gradio saved it to a temporary file; its size is
    checked before it is read."""
    if not path:
        raise ValueError("Choose a trace file (.json) to load.")
    size = os.path.getsize(path)
    if size > ctx.config.trace_max_bytes:
        raise ValueError(f"trace is {size} bytes; the limit is {ctx.config.trace_max_bytes} bytes")
    with open(path, "rb") as f:
        return traces.parse_trace(f.read(), ctx.config.trace_max_bytes)


def load_trace_file(ctx: AppContext, session: Session, path) -> dict:
    return show_trace(session, read_trace_file(ctx, path), "uploaded trace", _live_model(ctx))


def load_demo(ctx: AppContext, session: Session, demos: dict, name) -> dict:
    """A shipped trace, chosen by name from the server's own list (never a path from the page)."""
    if not isinstance(name, str) or name not in demos:
        raise ValueError(f"unknown demo trace {shown(name)}")
    trace = traces.load_shipped(demos[name], ctx.config.trace_max_bytes)   # parsed once, shared by every session
    return show_trace(session, trace, name, _live_model(ctx))


def _live_model(ctx: AppContext) -> dict | None:
    return _model_info(ctx) if getattr(ctx, "engine", None) is not None else None


# --- threshold explorer ----------------------------------------------------------------------

SWEEP_FIELDS = ("knob", "start", "stop", "count")   # the explorer's own inputs, before the settings


def _finite(name: str, value) -> float:
    try:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(float(value))
    except OverflowError:   # an int past float's range
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a finite number, got {shown(value)}")
    return float(value)


def sweep_values(knob: str, start, stop, count, max_values: int) -> list:
    """The values to try: ``count`` evenly spaced in [start, stop], integers for integer knobs."""
    if not isinstance(knob, str) or knob not in SWEEP_KNOBS:
        raise ValueError(f"knob must be one of {', '.join(SWEEP_KNOBS)}, got {shown(knob)}")
    start, stop = _finite("start", start), _finite("stop", stop)
    if isinstance(count, float) and count.is_integer():
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or not 2 <= count <= max_values:
        raise ValueError(f"count must be an integer in [2, {max_values}], got {shown(count)}")
    # (1 - t) * start + t * stop stays finite for finite ends; start + t * (stop - start) does
    # not (1e308 - -1e308 = inf, and 0 * inf = nan)
    values = [(1 - i / (count - 1)) * start + i / (count - 1) * stop for i in range(count)]
    values = [v for v in values if math.isfinite(v)]
    if SETTING[knob].kind == "int":
        return sorted({round(v) for v in values})
    return [round(v, 4) for v in values]


@dataclass(frozen=True)
class Sweep:
    """A validated explorer run: one full request per value of the knob, each checked like
    a Generate click, and the values that cannot run with the reason."""

    knob: str
    runs: list[tuple[object, Request]]
    skipped: list[str]


def check_explore(ctx: AppContext, knob, start, stop, count, raw: dict) -> Sweep:
    """Every check an explorer click gets before any model work (the page's event validator
    runs this once per click). Messages name the field: knob, start, stop, count or a setting."""
    request = parse(ctx, raw)
    if not request.tree.uses_draft:
        raise ValueError("method vanilla drafts no tree: choose an EAGLE method to explore its knobs")
    if request.adapt:
        raise ValueError("adapt must be off to explore a knob: an adaptive run picks its own tree, so the "
                         "knob would change nothing")
    values = sweep_values(knob, start, stop, count, ctx.config.explore_max_values)
    method = request.tree.method
    if not SETTING[knob].applies_to(method):
        raise ValueError(f"knob {knob} does nothing under method {method} ({SETTING[knob].why_not(method)}): "
                         "choose a method it shapes, or another knob")
    n = min(request.max_new_tokens, ctx.config.explore_max_new_tokens)
    prompt_ids = ctx.engine.encode_prompt(request.prompt)
    runs, skipped = [], []
    for value in values:
        try:
            run = build_request(ctx.config.limits, **{**request.settings(), knob: value, "max_new_tokens": n})
            ctx.engine.check_request(prompt_ids, run.tree, run.max_new_tokens)
        except ValueError as exc:
            skipped.append(f"{knob}={shown(value)}: {exc}")
            continue
        runs.append((value, run))
    if not runs:
        raise ValueError(f"start and stop give no {knob} value that can run: {skipped[0] if skipped else ''}")
    return Sweep(knob, runs, skipped)


def explore(ctx: AppContext, session: Session, knob, start, stop, count, sweep: Sweep | None = None, **raw):
    """Run the prompt once per value of one knob (a tree knob or the temperature); plot τ and
    tokens/s against it. ``sweep``: these inputs as already validated (``check_explore``)."""
    if sweep is None:
        sweep = check_explore(ctx, knob, start, stop, count, raw)
    with session.running():
        yield from _explore(ctx, session, sweep)


def _run_to_summary(events):
    """A whole run, for the explorer (on the engine thread): its summary only."""
    try:
        return [ev for ev in events if ev.type == "summary"][0]
    finally:
        events.close()


EXPLORE_REPEATS = 2   # runs per value: the spread between them is the noise a difference must beat


def verdict(knob: str, results: list[dict]) -> tuple[dict | None, str]:
    """Which value of ``knob`` was fastest, said only when it was faster by more than the
    run-to-run noise the sweep measured; otherwise that the values tie.

    ``results``: per value {"value", "mean_accepted", "tokens_per_s" (the mean of its runs),
    "runs" (each run's tokens/s)}. The noise is the largest spread (max - min) between two
    runs of one value, over all values: on a shared machine every run sees the same
    neighbours, so one value's spread says what any gap may be made of. The best value is
    named when its lead over the runner-up is larger than that noise.

    Returns (the best result, or None for a tie, and the sentence for the page)."""
    if not results:
        return None, "no runs."
    ranked = sorted(results, key=lambda r: -r["tokens_per_s"])
    best = ranked[0]
    noise = max((max(r["runs"]) - min(r["runs"]) for r in results if len(r["runs"]) > 1), default=None)
    head = f"{knob} = {best['value']}: {best['tokens_per_s']:.1f} tokens/s (τ = {best['mean_accepted']:.2f})"
    if len(ranked) == 1:
        return best, f"only {head} could run."
    second = ranked[1]
    gap = best["tokens_per_s"] - second["tokens_per_s"]
    if noise is None:
        return None, (f"fastest: {head}; one run per value, so no noise was measured to judge its lead of "
                      f"{gap:.1f} tokens/s.")
    spread = f"run-to-run noise up to {noise:.1f} tokens/s (each value ran {len(best['runs'])} times)"
    if gap > noise:
        return best, (f"best: {head}, ahead of {knob} = {second['value']} by {gap:.1f} tokens/s — more than the "
                f"{spread}.")
    ties = [r for r in ranked if best["tokens_per_s"] - r["tokens_per_s"] <= noise]
    return None, (f"tie: {knob} = {', '.join(str(r['value']) for r in ties)} "
            f"are within the {spread}; the fastest here ({head}) may not be the fastest next time.")


def _explore(ctx: AppContext, session: Session, sweep: Sweep, repeats: int = EXPLORE_REPEATS):
    """Every value ``repeats`` times, in rounds (value 1, 2, ..., then again), so a change in the
    machine's load hits every value alike; the verdict weighs the gaps against the spread."""
    knob, total = sweep.knob, len(sweep.runs) * repeats
    runs: dict[int, list] = {i: [] for i in range(len(sweep.runs))}
    done = 0
    for round_ in range(repeats):
        for i, (value, run) in enumerate(sweep.runs):
            if session.stop_requested:
                yield {"explorer_status": f"stopped after {done} of {total} runs."}
                return
            yield {"explorer_status": f"run {done + 1}/{total}: {knob} = {value}"
                                      f"{f' (again, round {round_ + 1} of {repeats})' if round_ else ''}, "
                                      f"{run.max_new_tokens} tokens…"}
            events = ctx.engine.generate(run.prompt, tree=run.tree, sampling=run.sampling,
                                         max_new_tokens=run.max_new_tokens)
            runs[i].append(ctx.engine_thread.call(_run_to_summary, events))
            done += 1
            yield {"explorer_plot": explorer_figure(knob, _sweep_results(sweep, runs), best=None)}
    results = _sweep_results(sweep, runs)
    best, note = verdict(knob, results)
    if sweep.skipped:
        note += " Skipped: " + "; ".join(sweep.skipped)
    yield {"explorer_plot": explorer_figure(knob, results, best=best), "explorer_status": note}


def _sweep_results(sweep: Sweep, runs: dict[int, list]) -> list[dict]:
    """Per value that has run: its mean tau and tokens/s, and each run's tokens/s."""
    out = []
    for i, (value, _) in enumerate(sweep.runs):
        summaries = runs[i]
        if summaries:
            out.append({"value": value,
                        "mean_accepted": sum(s.mean_accepted for s in summaries) / len(summaries),
                        "tokens_per_s": sum(s.tokens_per_s for s in summaries) / len(summaries),
                        "runs": [s.tokens_per_s for s in summaries]})
    return out
