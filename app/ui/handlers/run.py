"""Generate, the race and step mode: a run of the engine streamed to the page, with a fresh
vanilla run interleaved in chunks (the race), or paused after every step until Step; Stop.

Speed: the engine decodes on the server's engine thread (``pump.BackgroundRun``; every torch
op runs on that one thread, see ``engine_thread``) and never waits for the page; the handler
draws at most once every ``ctx.update_interval`` seconds from whatever records have arrived,
and only the latest step's tree. The race's clock is the engine's own per-step time.
"""
from __future__ import annotations

import time

from app.engine.adapt import adapter_for
from app.engine.config import TreeConfig
from app.engine.events import StepEvent
from app.ui.handlers import common
from app.ui.handlers.common import (RACE_CHUNK_TOKENS, _check_flag, _check_step_mode, _load_average, _model_info,
                                    judge, use_request_threads)
from app.ui.handlers.replay import write_trace
from app.ui.handlers.speedup import _measure_parting
from app.ui.handlers.views import final_view, live_view, step_view
from app.ui.limits import kv_bytes
from app.ui.pump import BackgroundRun
from app.ui.race import VANILLA, interleave
from app.ui.requests import Request
from app.ui.session import Session, VanillaRun
from app.ui.settings import AppContext
from app.viz.insights import calibration_figure, depth_figure, tokens_per_step_figure
from app.viz.phases import decoding_total
from app.viz.race import race_figure
from app.viz.stream import stream_html


def check_generate(ctx: AppContext, raw: dict, step_mode=False, race=True) -> Request:
    """Every check a Generate click gets before any model work: the settings (``parse``),
    step_mode and race, and the engine's own ``check_request`` (prompt + max_new_tokens must
    fit the model's context). The page's event validator runs this once per click; the request
    it returns carries the encoded prompt, which the run then takes as is."""
    request = common.parse(ctx, raw)
    _check_step_mode(step_mode)
    _check_flag("race", race)
    ctx.engine.check_request(request.prompt_ids, request.tree, request.max_new_tokens)
    return request


def request_problems(ctx: AppContext, raw: dict) -> dict[str, str]:
    """{setting: message} for a request that cannot run, {} for one that can (``judge``)."""
    return judge(lambda: check_generate(ctx, raw))[1]


def _run_vanilla(ctx: AppContext, session: Session, request: Request):
    """The other half of the race after a step-mode run (whose steps waited for clicks, so
    nothing could run alongside them): a fresh vanilla run, never one from earlier. Yields views."""
    key = request.vanilla_key()
    events = ctx.engine.generate(prompt_ids=request.prompt_ids, tree=TreeConfig(method="vanilla"),
                                 sampling=request.sampling, max_new_tokens=request.max_new_tokens)
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


def _done_status(session: Session) -> str:
    page = ""
    if session.app_seconds and session.summary is not None and session.app_seconds > 0:
        page = f"; through this page {session.summary.new_tokens / session.app_seconds:.1f} tokens/s wall-clock"
    return f"done ({'vanilla measured alongside' if session.race_vanilla else 'no race'}{page})."


def tree_plan(ctx: AppContext, request: Request):
    """(the first step's tree, the ``TreeAdapter`` that picks every later one, or None).

    With ``adapt`` (method dynamic) the run adapts its tree while decoding
    (``app.engine.adapt.adapter_for``): among top-1 chains of depth 1-2, the small trees that fit the forward's free rows and
    the tree tuned for this machine when a kept profile exists, each with a prompt-lookup
    branch, each step runs the one with the best tokens/s measured so far. Nothing is
    measured in the foreground. Otherwise every step uses the request's tree."""
    if not (request.adapt and request.tree.method == "dynamic"):
        return request.tree, None
    # a profile kept for any thread count serves, scaled by the last thread probe (autotune.kept_cost_curve)
    start, adapter, _ = ctx.engine_thread.call(adapter_for, ctx.engine, request.tree, measure=False,
                                               lookup=request.tree.lookup,     # the page's lookup knob
                                               probe_ms=ctx.threads.probe_ms())
    return start, adapter


def _raced(ctx: AppContext, session: Session, eagle, vanilla):
    """The records of both runs, interleaved in chunks (``app.ui.race``), run on the engine
    thread with the thread count chosen for this request (noted in ``session.threads``)."""
    count = use_request_threads(ctx)
    session.threads = f"{count} thread{'s' if count > 1 else ''}"
    guard = ctx.threads.guard       # a neighbour arriving mid-run puts the rest on one thread
    yield from interleave(guard(eagle), None if vanilla is None else guard(vanilla), RACE_CHUNK_TOKENS)
    if ctx.threads.fell_back:
        session.threads += f", then 1 (a busy neighbour: {ctx.threads.fell_back})"


def generate(ctx: AppContext, session: Session, step_mode: bool = False, race: bool = True,
             request: Request | None = None, **raw):
    """Generate: stream the EAGLE run with a fresh vanilla run interleaved in chunks (the race;
    ``race=False`` skips it). Stop sets ``session.stop_requested``, which ends this generator
    at its next update with Stop's own view as its last (``stopped_view``); closing it (a
    closed tab) ends it too. Either way the engine's thread ends generation after the
    current step.

    ``request``: these raw values as already validated (by the page's event validator,
    ``check_generate``); without it they are validated here."""
    if request is None:
        request = common.parse(ctx, raw)
        _check_step_mode(step_mode)
        session.submitted()     # not through the page's validator, which does this at the click
    _check_flag("race", race)
    yield from _ends_stopped(session, _generate(ctx, session, step_mode, race, request))


def _ends_stopped(session: Session, handler):
    """Run an engine handler; if Stop ended it, its last update is Stop's own view.

    Stop's reply and the handler's last update reach the page in either order, and the
    page keeps whichever came last, so both must say the same. (Stop does not cancel the
    event through Gradio: a cancelled event's completion could redraw its last live update,
    "decoding…", over Stop's message.)"""
    queued_stop = session.stopped_while_queued      # read as the event starts, before running() does
    yield from handler
    if queued_stop:
        yield {"status": "stopped before it started (it was waiting for the engine)."}
    elif session.stop_requested:
        yield stopped_view(session)


def _generate(ctx: AppContext, session: Session, step_mode: bool, race: bool, request: Request):
    with session.running():
        if session.stop_requested:
            return          # Stop was pressed while this run waited in the queue: it never starts
        start_tree, adapter = tree_plan(ctx, request)
        events = ctx.engine.generate(prompt_ids=request.prompt_ids, tree=start_tree, sampling=request.sampling,
                                     max_new_tokens=request.max_new_tokens, adapt=adapter)
        racing = race and request.tree.uses_draft and not step_mode
        vanilla_events = ctx.engine.generate(prompt_ids=request.prompt_ids, tree=TreeConfig(method="vanilla"),
                                             sampling=request.sampling,
                                             max_new_tokens=request.max_new_tokens) if racing else None
        session.start(request.settings(), _model_info(ctx), prompt_ids=request.prompt_ids)
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
        run = BackgroundRun(_raced(ctx, session, events, vanilla_events), ctx.engine_thread)   # starts on its thread now
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
    yield from _ends_stopped(session, _step_running(ctx, session))


def _step_running(ctx: AppContext, session: Session):
    with session.running():
        if not session.stop_requested:
            yield from _step(ctx, session)


def paused_run_bytes(ctx: AppContext, request: Request) -> int:
    """The KV caches a paused step-mode run holds (``limits.kv_bytes``)."""
    prompt_tokens = len(request.prompt_ids)
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
    """Stop: ask the running handler to end (and one still queued not to start), wait until it
    has, end a paused step-mode run, and show what was produced (``stopped_view``)."""
    session.request_stop()
    session.wait_idle(STOP_WAIT_S)
    session.close()
    return stopped_view(session)


def stopped_view(session: Session) -> dict:
    """What the page shows once a run is stopped: the text so far and the last step's tree,
    account, mask and KV views (the live updates may not have drawn the latest steps yet)."""
    steps = session.steps
    tail = "; the vanilla race was not finished" if session.summary is not None and session.race_vanilla is None \
        and session.settings.get("method") != "vanilla" else ""
    done = decoding_total(steps)
    view = {"status": f"stopped after {done} decoding step{'s' if done != 1 else ''} (and the prefill){tail}."
            if steps else "stopped before the prefill."}
    if steps:
        last = len(steps) - 1
        view.update(stream=stream_html(steps), **step_view(session, last, done), slider=(last, last),
                    depth=depth_figure(steps), calibration=calibration_figure(steps),
                    per_step=tokens_per_step_figure(steps))
    return view
