"""Handlers driven directly (no server): streaming, the race, validation, step mode, Stop,
traces from strangers, the threshold explorer. Real tiny-model engine, CPU, a few seconds."""
from __future__ import annotations

import json
import math

import pytest

from app.engine.config import TreeConfig
from app.engine.engine import Engine
from app.ui import handlers, traces
from app.ui.blocks import demo_traces
from app.ui.engine_thread import EngineThread
from app.ui.session import Session
from app.ui.settings import AppContext, ServerConfig

PROMPT = "w5 w17 w33 w90"
BASE = dict(prompt=PROMPT, method="dynamic", max_new_tokens=24, temperature=0.0, depth=4, top_k=4,
            total_tokens=12)


@pytest.fixture(scope="module")
def ctx(tiny):
    target, head = tiny
    return AppContext(Engine(target, head), ServerConfig(max_new_tokens=64, max_prompt_chars=200,
                                                          update_interval_s=0.0), "tiny")


@pytest.fixture(scope="module")
def finished(ctx):
    """One complete run: the session and every view it yielded."""
    session = Session()
    views = list(handlers.generate(ctx, session, **BASE))
    return session, views


def test_generate_streams_then_races(finished):
    session, views = finished
    assert len(views) >= 5
    assert sum("tree" in v for v in views) >= 3           # the tree updates while decoding
    final = views[-1]
    assert "Speedup" in final["speedup"] and "×" in final["speedup"]
    assert "identical" in final["speedup"]                 # greedy, float32: lossless
    assert session.summary.token_ids == session.race_vanilla.summary.token_ids
    assert final["slider"] == (len(session.steps) - 1, len(session.steps) - 1)
    # Only the first view (range 0..max_new_tokens-1) and the final one change the slider's
    # range: a component update on every view made Gradio rebuild its config and slowed decoding.
    assert [i for i, v in enumerate(views) if isinstance(v.get("slider"), tuple)] == [0, len(views) - 1]
    assert views[0]["slider"] == (BASE["max_new_tokens"] - 1, 0)
    # the race and the running numbers name the method as the page does elsewhere, not "dynamic"
    assert [t.name for t in final["race"].data] == ["EAGLE-2 (dynamic tree)", "vanilla"]
    assert views[1]["speedup"].startswith("**EAGLE-2 (dynamic tree)**:")


def test_the_race_never_reuses_a_vanilla_timing(ctx):
    """Every run races a fresh vanilla run, interleaved with it in chunks of tokens, even when
    only tree knobs changed (a timing from an earlier run measured another machine load)."""
    session = Session()
    list(handlers.generate(ctx, session, **BASE))
    first = session.race_vanilla
    views = list(handlers.generate(ctx, session, **{**BASE, "depth": 3, "method": "chain"}))
    assert session.race_vanilla is not first and session.race_vanilla.summary is not first.summary
    assert "vanilla measured alongside" in views[-1]["status"]
    assert session.race_vanilla.summary.token_ids == session.summary.token_ids      # greedy: identical
    speed = views[-1]["speedup"]
    assert "Machine load average" in speed and "chunks of" in speed
    # the two runs alternated: vanilla records arrived while EAGLE was still decoding
    live = [v for v in views if "vanilla racing alongside" in v.get("status", "")]
    assert live, [v.get("status") for v in views]
    # race=False: no vanilla run at all
    views = list(handlers.generate(ctx, session, race=False, **BASE))
    assert session.race_vanilla is None and "no race" in views[-1]["status"]
    with pytest.raises(ValueError, match="race"):
        list(handlers.generate(ctx, session, race="yes", **BASE))


def test_the_race_says_its_threads_and_a_fall_back_to_one(tiny):
    """The speedup's conditions name the threads the run used; when a neighbour arrives
    mid-run (steps 500 ms slower on 2 threads after the 4th verify: tests/tiny.py's
    Crowded) they say the run went on one thread, and why."""
    import torch

    from app.engine import threads
    from tests.tiny import Crowded

    target, head = tiny
    before = torch.get_num_threads()
    try:
        quiet = AppContext(Engine(target, head), ServerConfig(max_new_tokens=64, update_interval_s=0.0), "tiny")
        quiet.threads = threads.ThreadGovernor(fixed=1)
        views = list(handlers.generate(quiet, Session(), **BASE))
        assert "during the run, on 1 thread;" in views[-1]["speedup"]
        engine = Engine(target, head)
        Crowded(engine, after=4)
        crowded = AppContext(engine, ServerConfig(max_new_tokens=64, update_interval_s=0.0), "tiny")
        crowded.threads = threads.ThreadGovernor(options=[1, 2], rounds=1)
        crowded.thread_probe = lambda: __import__("time").sleep(0.002 if torch.get_num_threads() == 2 else 0.02)
        views = list(handlers.generate(crowded, Session(), **{**BASE, "max_new_tokens": 40}))
        assert "on 2 threads, then 1 (a busy neighbour: steps slowed from" in views[-1]["speedup"]
    finally:
        torch.set_num_threads(before)


def test_trace_roundtrip(ctx, finished):
    session, _ = finished
    path = session.trace_path          # the latest run's file (a new run replaces the old one)
    other = Session()
    view = handlers.load_trace_file(ctx, other, path)
    assert [s.to_dict() for s in other.steps] == [s.to_dict() for s in session.steps]
    assert "Speedup" in view["speedup"] and "replaying" in view["status"]


def test_replay_view_scrubs_and_clamps(finished):
    session, _ = finished
    view = handlers.replay_view(session, 1)
    assert 'class="step current" data-step="1"' in view["stream"] and "Step 1" in view["phases"]
    assert "Prefill" in handlers.replay_view(session, -5)["phases"]
    with pytest.raises(ValueError):
        handlers.replay_view(session, float("nan"))


@pytest.mark.parametrize("change, word", [
    ({"prompt": ""}, "prompt"), ({"prompt": "   "}, "prompt"), ({"prompt": "w5 " * 100}, "prompt"),
    ({"prompt": None}, "prompt"), ({"method": "evil"}, "method"), ({"method": ["dynamic"]}, "method"),
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": 10**9}, "max_new_tokens"),
    ({"max_new_tokens": "5"}, "max_new_tokens"), ({"max_new_tokens": 1.5}, "max_new_tokens"),
    ({"temperature": -1}, "temperature"), ({"temperature": math.nan}, "temperature"),
    ({"temperature": "hot"}, "temperature"), ({"temperature": 50.0}, "temperature"),
    ({"depth": 0}, "depth"), ({"depth": 100}, "depth"), ({"top_k": True}, "top_k"),
    ({"total_tokens": 10**6}, "total_tokens"),
    ({"method": "threshold", "tau_low": 0.9, "tau_high": 0.1}, "tau_low"),
    ({"min_confidence": 2.0}, "min_confidence"), ({"top_p": 0.0}, "top_p"), ({"seed": -1}, "seed"),
    ({"seed": None}, "seed"),
])
def test_invalid_inputs_are_refused_with_a_message(ctx, change, word):
    session = Session()
    with pytest.raises(ValueError, match=word) as refused:
        next(handlers.generate(ctx, session, **{**BASE, **change}))
    assert session.steps == []
    # the page's validator finds the same problem before the run, on the setting it names
    assert handlers.request_problems(ctx, {**BASE, **change}) == {word: str(refused.value)}


def test_request_problems_pass_good_requests_and_check_the_context_like_the_engine(tiny):
    """{} for a request that runs; a prompt + max_new_tokens over the model's context is
    max_new_tokens' problem, as the engine's own check says; a problem of no one setting (no
    model on the server) is left to the run."""
    target, head = tiny
    ctx = AppContext(Engine(target, head), ServerConfig(max_new_tokens=1000, update_interval_s=0.0), "tiny")
    assert handlers.request_problems(ctx, BASE) == {}
    assert handlers.request_problems(ctx, {**BASE, "method": "vanilla", "max_new_tokens": 400}) == {}
    long_prompt = {**BASE, "prompt": "w5 " * 200, "max_new_tokens": 400}     # 200 + 400 > 512 positions
    with pytest.raises(ValueError) as refused:
        next(ctx.engine.generate(long_prompt["prompt"], max_new_tokens=400,
                                 tree=TreeConfig(method="dynamic", depth=4, top_k=4, total_tokens=12)))
    assert handlers.request_problems(ctx, long_prompt) == {"max_new_tokens": str(refused.value)}
    no_model = AppContext(None, ServerConfig(update_interval_s=0.0), "replay only")
    assert handlers.request_problems(no_model, BASE) == {}


def test_missing_head_allows_vanilla_only(tiny):
    target, _ = tiny
    ctx = AppContext(Engine(target, None), ServerConfig(update_interval_s=0.0), "tiny",
                     head_missing="No draft head loaded.")
    with pytest.raises(ValueError, match="needs a draft head"):
        next(handlers.generate(ctx, Session(), **BASE))
    assert list(handlers.request_problems(ctx, BASE)) == ["method"]
    views = list(handlers.generate(ctx, Session(), **{**BASE, "method": "vanilla"}))
    assert "baseline" in views[-1]["speedup"]


def test_step_mode_advances_one_step_per_click(ctx):
    session = Session()
    views = list(handlers.generate(ctx, session, step_mode=True, **BASE))
    assert len(session.steps) == 1 and session.stepper is not None
    view = list(handlers.step(ctx, session))[-1]
    assert len(session.steps) == 2 and "step 1 done" in view["status"]
    for _ in range(100):
        if session.stepper is None:
            break
        views = list(handlers.step(ctx, session))
    assert session.summary is not None and "Speedup" in views[-1]["speedup"]
    with pytest.raises(ValueError, match="Nothing to step"):
        list(handlers.step(ctx, session))


def test_stop_ends_step_mode_and_frees_the_run(ctx):
    session = Session()
    list(handlers.generate(ctx, session, step_mode=True, **BASE))
    stepper = session.stepper
    view = handlers.stop(session)
    assert session.stepper is None and stepper.gi_frame is None and \
        "stopped after 0 decoding steps (and the prefill)" in view["status"]


@pytest.mark.parametrize("phase", ["decoding with", "vanilla racing alongside"])
def test_stop_is_the_last_word(ctx, phase):
    """Stop in either phase: once ``stop`` returns, the running handler has ended, and its one
    last update is Stop's own view, so whichever of the two reaches the page last, it says
    "stopped after" (no late "decoding…"). The consumer thread plays Gradio: it pulls views
    and is paused inside the phase."""
    import threading

    session, views = Session(), []
    reached, proceed = threading.Event(), threading.Event()

    def consume():
        for view in handlers.generate(ctx, session, **{**BASE, "max_new_tokens": 60}):
            views.append(view)
            if phase in view.get("status", "") and not reached.is_set():
                reached.set()
                proceed.wait(30)

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert reached.wait(60)
    result = {}
    stopper = threading.Thread(target=lambda: result.update(handlers.stop(session)))
    stopper.start()
    stopper.join(0.3)
    assert stopper.is_alive()          # Stop waits for the handler, which is paused mid-phase
    n = len(views)
    proceed.set()
    stopper.join(30)
    consumer.join(30)
    assert not stopper.is_alive() and not consumer.is_alive() and not session.busy
    assert len(views) == n + 1         # one view after Stop: Stop's own
    assert result["status"].startswith("stopped after")
    assert views[-1]["status"] == result["status"] and views[-1]["stream"] == result["stream"]
    assert session.race_vanilla is None and session.trace_path is None   # the race never finished
    if session.summary is not None:     # EAGLE had finished, vanilla had not
        assert "vanilla race was not finished" in result["status"]
    assert ctx.engine_thread.wait_idle(10)   # the engine thread let go of the model


def test_a_run_stopped_while_queued_never_starts(ctx):
    """Stop pressed while the visitor's Generate waits in the queue (another visitor holds the
    engine): when its turn comes, it ends at once, the run on screen stays, and the next
    Generate runs as usual."""
    session = Session()
    list(handlers.generate(ctx, session, **{**BASE, "max_new_tokens": 8}))
    shown = list(session.steps)
    request = handlers.check_generate(ctx, {**BASE, "max_new_tokens": 8})
    session.submitted()                 # the click (the page's validator)...
    handlers.stop(session)              # ...then Stop, before the event started
    views = list(handlers.generate(ctx, session, request=request, **BASE))
    assert views == [{"status": "stopped before it started (it was waiting for the engine)."}]
    assert session.steps == shown and not session.busy
    views = list(handlers.generate(ctx, session, **{**BASE, "max_new_tokens": 8}))
    assert views[-1]["status"].startswith("done") and session.steps != shown


def test_stop_is_noticed_while_the_engine_is_silent(ctx):
    """Stop during a run that yields nothing for a long time (a long prefill, or the run queued
    behind another visitor's on the engine thread): the handler notices Stop at its next
    update interval instead of waiting for the engine's first record."""
    import threading
    import time

    from dataclasses import replace

    real = ctx.engine.generate

    def silent_then_real(*args, **kwargs):
        inner = real(*args, **kwargs)

        def gen():
            time.sleep(5.0)             # the engine is busy elsewhere for 5 s
            yield from inner
        return gen()

    ctx = replace(ctx, config=replace(ctx.config, update_interval_s=0.1))
    session = Session()
    ctx.engine.generate = silent_then_real
    try:
        views = []
        consumer = threading.Thread(target=lambda: views.extend(handlers.generate(ctx, session, **BASE)))
        consumer.start()
        while not views:
            time.sleep(0.01)            # the first view (prefill…) is on the page
        t0 = time.monotonic()
        view = handlers.stop(session)
        waited = time.monotonic() - t0
        consumer.join(10)
    finally:
        ctx.engine.generate = real
    assert waited < 2.0, waited         # not the 5 s until the engine's first record
    assert view["status"] == "stopped before the prefill." and not consumer.is_alive()
    assert ctx.engine_thread.wait_idle(10)


def test_closing_generate_closes_the_engine_within_one_step(ctx):
    """What Gradio does on Stop or a closed tab: close the handler generator."""
    seen = []
    real = ctx.engine.generate

    def spy(*args, **kwargs):
        it = real(*args, **kwargs)
        seen.append(it)
        return it

    session = Session()
    ctx.engine.generate = spy
    try:
        gen = handlers.generate(ctx, session, **{**BASE, "max_new_tokens": 60})
        for _ in range(4):
            next(gen)
        n = len(session.steps)
        gen.close()
        assert ctx.engine_thread.wait_idle(10)   # the engine thread lets go of the model within one step
        assert seen[0].gi_frame is None          # ... having closed the engine's iterator
    finally:
        ctx.engine.generate = real
    assert len(session.steps) == n < 60


def test_background_run_coalesces_stops_and_reports_errors():
    import threading
    import time

    from app.ui.pump import BackgroundRun

    def slow(n, fail_at=None):
        for i in range(n):
            time.sleep(0.01)
            if i == fail_at:
                raise ValueError("engine broke")
            yield i

    worker = EngineThread()
    batches = list(BackgroundRun(slow(20), worker).batches(0.05))
    assert [x for b in batches for x in b] == list(range(20)) and len(batches) < 20
    # interval 0: a list for each record, even when they all arrived before the first was taken
    # (a run's views then never depend on how fast the machine is)
    done = BackgroundRun((i for i in range(6)), worker)
    done.join(5)
    assert list(done.batches(0)) == [[0], [1], [2], [3], [4], [5], []]     # [] : the end
    it = slow(1000)
    run = BackgroundRun(it, worker)
    next(run.batches(0.02))
    run.close()
    run.join(5)
    assert it.gi_frame is None and worker.wait_idle(5)
    with pytest.raises(ValueError, match="engine broke"):
        list(BackgroundRun(slow(5, fail_at=2), worker).batches(0.01))
    # a run closed while still queued behind another never starts its engine
    first, second = slow(1000), slow(1000)
    a, b = BackgroundRun(first, worker), BackgroundRun(second, worker)
    b.close()
    a.close()
    assert worker.wait_idle(5) and second.gi_frame is None and list(b.batches(0.01)) == [[]]


def test_every_target_forward_of_the_app_runs_on_the_one_engine_thread(ctx):
    """Generate (EAGLE + vanilla race), step mode and the explorer all run the model on the
    server's engine thread, never on a handler thread: on a CPU a second thread running torch
    means a second OpenMP team, which slowed decoding 15-25% on the 2-core dev machine."""
    import threading

    from app.engine import kernels

    threads = set()
    hooks = [m.register_forward_pre_hook(lambda *_: threads.add(threading.get_ident()))
             for m in (ctx.engine.target.model, ctx.engine.head)]   # the target and the draft head (eager)
    fast_linear = kernels.linear                                     # the fast forward's products

    def linear(*args, **kwargs):
        threads.add(threading.get_ident())
        return fast_linear(*args, **kwargs)

    kernels.linear = linear
    try:
        session = Session()
        list(handlers.generate(ctx, session, **{**BASE, "max_new_tokens": 12}))
        assert session.race_vanilla is not None          # both halves of the race ran
        list(handlers.generate(ctx, session, step_mode=True, **{**BASE, "max_new_tokens": 6}))
        while session.stepper is not None:
            list(handlers.step(ctx, session))
        list(handlers.explore(ctx, session, "depth", 2, 3, 2, **{**BASE, "max_new_tokens": 6}))
    finally:
        kernels.linear = fast_linear
        for hook in hooks:
            hook.remove()
    engine_ident = ctx.engine_thread.call(threading.get_ident)
    assert threads == {engine_ident} and engine_ident != threading.get_ident()


def test_engine_thread_runs_jobs_in_order_on_one_thread_and_allows_nested_calls():
    import threading

    worker = EngineThread()
    seen = []
    futures = [worker.submit(lambda i=i: seen.append((i, threading.get_ident()))) for i in range(5)]
    for f in futures:
        f.result(5)
    assert [i for i, _ in seen] == list(range(5)) and len({t for _, t in seen}) == 1
    assert seen[0][1] != threading.get_ident() and worker.idle
    # a job that itself calls the engine thread runs inline instead of waiting for itself
    assert worker.call(lambda: worker.call(lambda: 7), timeout=5) == 7
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0, timeout=5)
    assert worker.idle


def test_engine_thread_starts_afresh_in_a_forked_child():
    """ZeroGPU runs handlers in a process forked from the server, which has no engine thread."""
    import os
    import threading

    worker = EngineThread()
    parent_ident = worker.call(threading.get_ident)
    pid = os.fork()
    if pid == 0:                                   # the child: exit 0 only if a job ran there
        try:
            ok = worker.call(lambda: 6 * 7, timeout=10) == 42 and worker.on_engine_thread() is False
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert worker.call(threading.get_ident) == parent_ident   # the parent's thread is untouched


def test_a_slow_page_never_makes_the_engine_wait():
    """The consumer takes 0.3 s per update; the 'engine' (20 steps of 10 ms) is not slowed to
    the page's pace (drawing every step in the same thread would take 20 x 0.3 = 6 s)."""
    import threading
    import time

    from app.ui.pump import BackgroundRun

    finished = []

    def engine():
        for i in range(20):
            time.sleep(0.01)
            yield i
        finished.append(time.monotonic())

    t0 = time.monotonic()
    drawn = 0
    for batch in BackgroundRun(engine(), EngineThread()).batches(0.05):
        drawn += 1
        time.sleep(0.3)                  # a very slow page update
    assert finished and finished[0] - t0 < 3.0
    assert drawn < 10                    # updates were coalesced


def _sweep_runs(fig) -> list[tuple]:
    """Each value's (slowest, fastest) tokens/s, from the explorer figure's spread bars."""
    t = fig.data[0]
    return [(y - lo, y + hi) for y, lo, hi in zip(t.y, t.error_y.arrayminus, t.error_y.array)]


def test_explorer_names_a_best_value_only_beyond_the_measured_noise():
    """The verdict: a value is "best" when its lead over the runner-up is larger than the
    largest spread between two runs of one value; otherwise the values within that noise tie."""
    def result(value, *runs):
        return {"value": value, "mean_accepted": 2.0, "tokens_per_s": sum(runs) / len(runs), "runs": list(runs)}

    best, text = handlers.verdict("depth", [result(2, 10.0, 11.0), result(3, 14.0, 15.0), result(4, 9.0, 9.5)])
    assert best["value"] == 3 and text.startswith("best: depth = 3") and "ahead of depth = 2 by 4.0" in text
    # the same means, but one value's two runs differ by 5 tokens/s: a 4 tokens/s lead is noise
    best, text = handlers.verdict("depth", [result(2, 8.0, 13.0), result(3, 14.0, 15.0), result(4, 9.0, 9.5)])
    assert best is None and text.startswith("tie: depth = 3, 2") and "noise up to 5.0" in text
    best, text = handlers.verdict("depth", [result(2, 10.0), result(3, 14.0)])   # one run each: no noise known
    assert best is None and "no noise was measured" in text


def test_explorer_sweeps_a_knob(ctx):
    views = list(handlers.explore(ctx, Session(), "depth", 1, 3, 3, **{**BASE, "max_new_tokens": 12}))
    fig = views[-1]["explorer_plot"]
    # every value ran twice (a tiny model's tokens/s is noisy: a tie is a fair verdict here)
    status = views[-1]["explorer_status"]
    assert list(fig.data[0].x) == [1, 2, 3] and status.startswith(("best: depth", "tie: depth"))
    assert "each value ran 2 times" in status and all(len(r) == 2 for r in _sweep_runs(fig))
    skipped = list(handlers.explore(ctx, Session(), "tau_low", 0.2, 0.9, 2, **{**BASE, "max_new_tokens": 8,
                                                                               "method": "threshold"}))
    assert "Skipped" in skipped[-1]["explorer_status"]     # tau_low 0.9 > tau_high 0.5
    # the temperature sweeps too: greedy at 0 (tau above 1 with this head), then sampled runs;
    # a value above the page's cap is skipped with its reason
    temps = list(handlers.explore(ctx, Session(), "temperature", 0.0, 3.0, 3, **{**BASE, "max_new_tokens": 12}))
    fig = temps[-1]["explorer_plot"]
    assert list(fig.data[0].x) == [0.0, 1.5] and "Skipped: temperature=3.0" in temps[-1]["explorer_status"]
    with pytest.raises(ValueError, match="knob"):
        next(handlers.explore(ctx, Session(), "__class__", 1, 2, 2, **BASE))
    with pytest.raises(ValueError, match="count"):
        next(handlers.explore(ctx, Session(), "depth", 1, 2, 50, **BASE))


# --- traces from strangers ------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_trace(finished):
    session, _ = finished
    v = session.race_vanilla
    return traces.trace_dict(session.settings, session.model, session.steps, session.summary, v.steps, v.summary)


def _mutate(trace, path, value):
    t = json.loads(json.dumps(trace))
    obj = t
    for key in path[:-1]:
        obj = obj[key]
    if value is KeyError:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return json.dumps(t)


@pytest.mark.parametrize("path, value", [
    (("format",), "something-else"), (("version",), 99), (("records",), []),
    (("records", 0, "step"), 5), (("records", 0, "type"), "summary"), (("records", 0, "bonus"), -1),
    (("records", 0, "bonus"), True), (("records", 0, "extra"), 1), (("records", 0, "text"), KeyError),
    (("records", 1, "tree", "parents", 0), 3), (("records", 1, "tree", "depths", 0), 2),
    (("records", 1, "tree", "status", 0), "eval"), (("records", 1, "tree", "q", 0), 1.5),
    (("records", 1, "tree", "texts"), ["x"]), (("records", 1, "tree", "tokens"), list(range(300))),
    (("records", 0, "step_ms"), -1), (("records", 0, "method"), "__import__('os')"),
    (("records", 1, "rule"), "always"), (("records", 1, "drafter"), "<img>"), (("records", 0, "prefill"), 1),
    (("records", 1, "tree_config"), {"method": "dynamic", "depth": 0}), (("records", 1, "tree_config"), {"x": 1}),
    (("records", -1, "tokens_per_s"), "fast"), (("settings",), {"prompt": "x", "evil": 1}),
    (("model",), {"k": {"nested": 1}}), (("vanilla",), [{"type": "step"}]),
])
def test_malformed_traces_are_refused(good_trace, path, value):
    with pytest.raises(traces.TraceError, match="trace"):
        traces.parse_trace(_mutate(good_trace, path, value))


@pytest.mark.parametrize("data", [b"", b"not json", b"[1, 2]", b'{"format": "eagle-lens-trace"}',
                                  b"[" * 100_000 + b"]" * 100_000, b'{"a": NaN}', b"\xff\xfe\x00",
                                  b'{"format": "eagle-lens-trace", "version": Infinity}'])
def test_hostile_json_is_refused(data):
    with pytest.raises(traces.TraceError):
        traces.parse_trace(data)


def test_oversized_trace_is_refused_before_parsing(ctx, tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (ctx.config.trace_max_bytes + 1))
    with pytest.raises(ValueError, match="limit"):
        handlers.load_trace_file(ctx, Session(), str(big))


def test_nan_in_a_trace_is_refused(good_trace):
    text = json.dumps(good_trace).replace('"step_ms":', '"step_ms": NaN, "x":', 1)
    with pytest.raises(traces.TraceError):
        traces.parse_trace(text)


def test_demo_names_are_looked_up_never_used_as_paths(ctx):
    with pytest.raises(ValueError, match="unknown demo"):
        handlers.load_demo(ctx, Session(), {"demo": "/nonexistent"}, "../../etc/passwd")


@pytest.mark.parametrize("name, path", sorted(demo_traces().items()))
def test_shipped_traces_are_valid(ctx, name, path):
    session = Session()
    view = handlers.load_demo(ctx, session, {name: path}, name)
    assert session.steps and session.summary and "replaying" in view["status"]


# --- server configuration ---------------------------------------------------------------------

def test_server_config_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("EAGLE_LENS_MAX_NEW_TOKENS", "64")
    monkeypatch.setenv("EAGLE_LENS_DRAFT_MODEL", "/somewhere/head")
    cfg = ServerConfig.from_env()
    assert cfg.max_new_tokens == 64 and cfg.draft_model == "/somewhere/head"
    monkeypatch.setenv("EAGLE_LENS_QUEUE", "lots")
    with pytest.raises(ValueError, match="EAGLE_LENS_QUEUE"):
        ServerConfig.from_env()
    monkeypatch.delenv("EAGLE_LENS_QUEUE")
    monkeypatch.setenv("EAGLE_LENS_UPDATE_S", "0.5")
    assert ServerConfig.from_env().update_interval_s == 0.5
    monkeypatch.setenv("EAGLE_LENS_UPDATE_S", "-1")
    with pytest.raises(ValueError, match="EAGLE_LENS_UPDATE_S"):
        ServerConfig.from_env()


def test_update_interval_follows_the_machine(tiny, monkeypatch):
    """Fewer page updates on a small CPU, where every update stalls the engine's threads."""
    import os

    engine = Engine(*tiny)
    assert AppContext(engine, ServerConfig(update_interval_s=0.1)).update_interval == 0.1
    for cores, interval in ((2, 1.0), (4, 0.5), (16, 0.25)):
        monkeypatch.setattr(os, "cpu_count", lambda: cores)
        assert AppContext(engine, ServerConfig()).update_interval == interval


def test_missing_head_is_reported_never_replaced(tiny, monkeypatch):
    from app.engine import loading
    from app.ui import settings

    target, _ = tiny

    def no_head(name, target):
        raise FileNotFoundError("no trained draft head at models/x")

    monkeypatch.setattr(loading, "load_target", lambda *a, **k: target)
    monkeypatch.setattr(loading, "load_draft_head", no_head)
    ctx = settings.load_context(ServerConfig())          # auto_tree on: skipped without a head
    assert not ctx.has_head and ctx.engine.head is None and "no trained draft head" in ctx.head_missing
    # the tab "Tree size for this machine" says why it has nothing to show
    from app.ui.blocks import TREE_SIZE_NOT_MEASURED, build_demo

    assert ctx.tree_choice is None
    blocks = {getattr(c, "elem_id", None): c for c in build_demo(ctx, demos={}).blocks.values()}
    assert blocks["tree-size-text"].value == TREE_SIZE_NOT_MEASURED and "tree-size-plot" not in blocks


def test_gpu_decorator_is_a_no_op_off_zerogpu(monkeypatch):
    from app.ui.settings import gpu

    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)

    def f():
        return 1

    assert gpu(f) is f


def test_load_context_uses_the_heads_draft_vocabulary(tiny, tmp_path, monkeypatch):
    """The app's engine drafts from the vocabulary shipped beside the head, like the CLI's."""
    import json

    from app.engine import loading
    from app.ui import settings
    from app.ui.settings import ServerConfig

    target, head = tiny
    head.save(tmp_path)
    (tmp_path / "draft_vocab.json").write_text(json.dumps({"token_ids": list(range(3, 100))}))
    monkeypatch.setattr(loading, "load_target", lambda *a, **k: target)
    ctx = settings.load_context(ServerConfig(draft_model=str(tmp_path), auto_tree=False))
    assert ctx.has_head and ctx.engine.draft_vocab.tolist() == list(range(3, 100))


def test_load_context_sizes_the_default_tree_for_this_machine(tiny, tmp_path, monkeypatch):
    """With auto_tree (the default) the page's tree knobs start at autotune's choice, the
    model line says so, and the choice is cached: a restart does not measure again."""
    from app.engine import autotune, loading
    from app.ui import settings
    from app.ui.blocks import build_demo
    from app.ui.settings import ServerConfig

    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(autotune, "_load_average", lambda: 0.3)
    target, head = tiny
    head.save(tmp_path / "head")
    monkeypatch.setattr(loading, "load_target", lambda *a, **k: target)
    lines = []
    ctx = settings.load_context(ServerConfig(draft_model=str(tmp_path / "head")), log=lines.append)
    tree = ctx.tree_defaults
    assert any("auto tree: depth" in line for line in lines) and "sized for this machine" in ctx.model_note
    assert f"depth {tree.depth}" in ctx.model_note and f"total_tokens {tree.total_tokens}" in ctx.model_note
    blocks = {getattr(c, "elem_id", None): c for c in build_demo(ctx, demos={}).blocks.values()}
    assert blocks["depth"].value == tree.depth
    # beside it a prompt-lookup branch, as the CLI's auto tree has: in the lookup knob and the header
    from app.engine.adapt import auto_lookup
    lookup = auto_lookup(ctx.engine)           # 3, or more where the verify forward has 8 free rows or more
    assert tree.lookup == lookup and blocks["lookup"].value == lookup
    assert f"prompt-lookup branch** beside it (up to {lookup} tokens" in blocks["header"].value
    # the tab "Tree size for this machine" shows the report behind the choice
    assert ctx.tree_choice["tree"]["total_tokens"] == tree.total_tokens
    assert f"total_tokens {tree.total_tokens}, depth {tree.depth}, top_k {tree.top_k}" in blocks["tree-size-text"].value
    assert "tree-size-plot" in blocks
    calls = []
    real = autotune.calibrate
    monkeypatch.setattr(autotune, "calibrate", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    again = settings.load_context(ServerConfig(draft_model=str(tmp_path / "head")), log=lines.append)
    assert again.tree_defaults == tree and calls == []
    assert again.tree_choice == ctx.tree_choice


def test_streamed_updates_resend_instead_of_skipping(ctx):
    """Gradio rebuilds a component's config for every skipped output (gr.skip() is a property
    update), which slowed decoding; the stream wrapper resends the last value instead, so once
    every output has had a value no update skips or updates a property."""
    import gradio as gr

    from app.ui.blocks import RUN_VIEWS, _stream

    outs = list(_stream(handlers.generate(ctx, Session(), **BASE), RUN_VIEWS))
    skip = gr.skip()
    assert skip not in outs[0][:10]                       # the first view sets every output but ...
    for out in outs[1:-1]:                                # ... then nothing is skipped or rebuilt
        assert not any(o == skip or isinstance(o, gr.components.Component) for o in out)
    assert isinstance(outs[-1][RUN_VIEWS.index("trace_file")], gr.DownloadButton)   # the final one
    assert isinstance(outs[0][RUN_VIEWS.index("slider")], gr.Slider)


def test_speedup_is_explained_by_its_two_factors(ctx):
    """The page's "Why" line splits the measured speedup into tokens per step and the cost of a
    step in vanilla steps, from the run's own step records: the product is the race's ratio."""
    import re

    from app.viz.race import speedup

    session = Session()
    text = list(handlers.generate(ctx, session, **BASE))[-1]["speedup"]
    why = re.search(r"Speedup = ([\d.]+) × ([\d.]+) / ([\d.]+) = \*\*([\d.]+)×\*\*", text)
    assert why, text
    tau, ms_v, ms_e, product = map(float, why.groups())
    steps = [s for s in session.steps if not s.prefill]
    assert tau == pytest.approx(sum(len(s.new_tokens) for s in steps) / len(steps), abs=0.006)
    assert ms_e == pytest.approx(sum(s.step_ms for s in steps) / len(steps), abs=0.06)
    assert product == pytest.approx(speedup(steps, session.race_vanilla.steps), abs=0.006)
    # the title is the ratio, or, where a busy machine drowned the race, says so (test_numbers.py)
    drowned = handlers.session_race(session).drowned
    assert text.startswith("### Speedup drowned by the machine's load" if drowned
                           else f"### Speedup {speedup(steps, session.race_vanilla.steps):.2f}×"), text
    assert ("so it wins" in text) == (product > 1.0)
    assert handlers.speedup_decomposition([], session.race_vanilla.steps) == ""


def test_the_preset_menu_names_the_tree_the_knobs_hold():
    """After a knob is moved by hand the menu shows the preset the knobs now match (the page's
    default first, also when a named preset has the same shape), else the custom entry; the
    custom entry leaves the knobs alone, and every named preset maps back to itself."""
    from app.ui.requests import AUTO_PRESET, CUSTOM_PRESET, TREE_PRESETS, preset_of, tree_preset

    default = TreeConfig(depth=2, top_k=1, total_tokens=2)
    assert preset_of(2, 1, 2, default) == AUTO_PRESET
    assert preset_of(2.0, 1.0, 2.0, default) == AUTO_PRESET            # sliders send floats
    paper = next(name for name, shape in TREE_PRESETS.items() if shape == (60, 5, 10))
    assert preset_of(5, 10, 60, default) == paper
    assert preset_of(5, 10, 59, default) == CUSTOM_PRESET
    assert preset_of(None, "x", 60, default) == CUSTOM_PRESET
    for name in TREE_PRESETS:
        assert preset_of(*tree_preset(name, default), default) == name
    chain5 = TreeConfig(depth=5, top_k=1, total_tokens=5)                 # default = the chain-of-5 preset
    assert preset_of(5, 1, 5, chain5) == AUTO_PRESET
    assert tree_preset(CUSTOM_PRESET, default) is None


def test_record_writes_the_chosen_demo_with_its_sampling(tiny, tmp_path, monkeypatch):
    """`python -m app.ui.record --only chat --temperature 0.8 --name ...` (how the sampled demo
    was made): one valid trace, named as asked, whose settings say it sampled."""
    from app.engine import loading
    from app.ui import record

    target, head = tiny
    head.save(tmp_path / "head")
    monkeypatch.setattr(loading, "load_target", lambda *a, **k: target)
    monkeypatch.setenv("EAGLE_LENS_DRAFT_MODEL", str(tmp_path / "head"))
    out = tmp_path / "traces"
    assert record.main(["--out", str(out), "--only", "chat", "--temperature", "0.8", "--seed", "1", "--name",
                        "6-chat-sampled", "--max-new-tokens", "8", "--depth", "2", "--top-k", "1",
                        "--total-tokens", "2"]) == 0
    assert [p.name for p in out.iterdir()] == ["6-chat-sampled.json"]
    trace = traces.parse_trace((out / "6-chat-sampled.json").read_bytes(), 10**7)
    assert trace.settings["temperature"] == 0.8 and trace.settings["top_k"] == 1 and trace.steps


def test_a_parting_in_reduced_precision_is_explained_by_the_targets_top2(ctx):
    """Where greedy EAGLE and vanilla part (possible in bf16), the note gives the token and
    the target's two probabilities there, from one forward: a near-tie, not the method."""
    import torch
    from dataclasses import replace

    from app.engine.precision import top2_after

    session = Session()
    list(handlers.generate(ctx, session, **BASE))
    assert session.parting is None                                  # float32: identical, nothing measured
    ids = ctx.engine.encode_prompt(PROMPT)
    (t1, p1), (t2, p2) = top2_after(ctx.engine.target, ids, session.summary.token_ids[:3])
    with torch.no_grad():
        ref = torch.softmax(ctx.engine.target.model(torch.tensor([ids + session.summary.token_ids[:3]])).logits[0, -1], -1)
    assert (t1, t2) == tuple(torch.topk(ref, 2).indices.tolist()) and p1 == pytest.approx(float(ref[t1]), rel=1e-4)
    assert t1 == session.summary.token_ids[3] and p1 >= p2          # greedy took the top token
    # a run that parted at token 3 (as bf16 can), shown as a bf16 run
    tokens = list(session.race_vanilla.summary.token_ids)
    tokens[3] = t2
    session.race_vanilla = replace(session.race_vanilla, summary=replace(session.race_vanilla.summary, token_ids=tokens))
    handlers._measure_parting(ctx, session)
    session.model = {**session.model, "dtype": "bfloat16"}
    note = handlers._identical_note(session)
    assert "differ from token 3" in note and f"p = {p1:.3f} and {p2:.3f}" in note and "near-tie" in note


# --- the page's teaching views: steps, demos, A/B, adapt ------------------------------------

def test_an_adaptive_run_changes_its_tree_and_the_step_account_says_so(ctx):
    """adapt=True (method dynamic): the engine gets a TreeAdapter, the steps' tree_config
    changes during the run, and the account of a step whose tree changed names both trees and
    why; the output is still plain decoding's (greedy, float32)."""
    session = Session()
    views = list(handlers.generate(ctx, session, **{**BASE, "max_new_tokens": 40, "adapt": True}))
    assert session.adapter is not None and session.settings["adapt"] is True
    steps = session.steps
    changed = [i for i in range(2, len(steps)) if steps[i].tree_config != steps[i - 1].tree_config]
    assert changed, [s.tree_config for s in steps]
    i = changed[0]
    text = handlers.step_view(session, i)["phases"]
    from app.viz.phases import tree_shape
    assert f"Tree changed: {tree_shape(steps[i].tree_config)}, was {tree_shape(steps[i - 1].tree_config)}" in text
    assert "measure" in text                     # the adapter's reason: a first try measures a candidate
    assert session.summary.token_ids == session.race_vanilla.summary.token_ids
    assert "identical" in views[-1]["speedup"]
    # the lookup knob reaches every tree the run adapts over
    list(handlers.generate(ctx, session, **{**BASE, "max_new_tokens": 8, "adapt": True, "lookup": 1}))
    assert {t.lookup for t in session.adapter.candidates if t.uses_draft} == {1}
    # a step that kept its tree says nothing of a change: the adapter picks by measured speed,
    # so on some machines every step of this run changes; a fixed tree's steps never do
    fixed = Session()
    list(handlers.generate(ctx, fixed, **{**BASE, "max_new_tokens": 8}))
    assert fixed.adapter is None
    for i in range(1, len(fixed.steps)):
        assert ", was " not in handlers.step_view(fixed, i)["phases"]


def test_steps_are_numbered_from_one_after_the_prefill(finished):
    session, _ = finished
    total = len(session.steps) - 1
    assert session.steps[0].prefill
    assert handlers.replay_view(session, 0)["phases"].startswith(f"**Prefill** (step 0, before the {total} decoding")
    view = handlers.replay_view(session, 1)
    assert view["phases"].startswith(f"**Step 1 of {total}**")
    assert view["tree"].layout.title.text.startswith("step 1:") and view["mask"].layout.title.text.startswith("step 1:")
    assert "drafted by the EAGLE head" in view["tree"].layout.annotations[0].text     # the tree names its drafter


def test_a_demo_restores_its_settings_and_opens_on_an_instructive_step(ctx):
    """Loading a shipped trace hands its settings to the page (every control) and shows the
    step with the deepest accepted path among those with a rejection."""
    demos = demo_traces()
    name = next(iter(demos))
    session = Session()
    view = handlers.load_demo(ctx, session, demos, name)
    trace = traces.parse_trace(open(demos[name], "rb").read())
    assert view["settings"] == trace.settings and view["race_on"] == (trace.vanilla_steps is not None)
    last, shown_index = view["slider"]
    steps = session.steps
    assert last == len(steps) - 1 and shown_index == handlers.instructive_step(steps)
    mixed = [s for s in steps if s.tree is not None and "rejected" in s.tree.status]
    if mixed:
        assert "rejected" in steps[shown_index].tree.status
        assert len(steps[shown_index].accepted) == max(len(s.accepted) for s in mixed)


def test_instructive_step_prefers_a_deep_path_with_rejections(finished):
    session, _ = finished
    steps = session.steps
    i = handlers.instructive_step(steps)
    drafted = [s for s in steps if s.tree is not None and len(s.tree)]
    with_rejection = [s for s in drafted if "rejected" in s.tree.status] or drafted
    assert steps[i] in with_rejection and len(steps[i].accepted) == max(len(s.accepted) for s in with_rejection)
    assert handlers.instructive_step(steps[:1]) == 0        # only the prefill: nothing drafted


def test_stop_keeps_the_text_and_the_last_tree_on_screen(ctx):
    session = Session()
    list(handlers.generate(ctx, session, step_mode=True, **BASE))
    list(handlers.step(ctx, session))                       # the prefill, then one decoding step
    view = handlers.stop(session)
    assert view["status"].startswith("stopped after 1 decoding step")
    assert 'class="tok' in view["stream"]
    assert len(view["tree"].data) > 0 and view["tree"].layout.title.text.startswith("step 1:")
    assert view["slider"] == (1, 1)


def test_pinned_run_is_compared_with_the_next(ctx):
    """Pin A, run B: the comparison shows both runs (acceptance by depth, tau, tokens/s), their
    trees at the slider's step, and one pinned run at most."""
    session = Session()
    with pytest.raises(ValueError, match="Nothing to pin"):
        handlers.pin(session)
    list(handlers.generate(ctx, session, **BASE))
    pinned = handlers.pin(session)
    assert "Pinned A: dynamic 12/4/4" in pinned["ab_caption"]
    same = handlers.compare_view(session)
    assert same["ab"] is None and "Run something else" in same["ab_caption"]
    final = list(handlers.generate(ctx, session, **{**BASE, "method": "chain", "depth": 3}))[-1]
    names = {t.name for t in final["ab"].data if t.name}
    assert names == {"A: dynamic 12/4/4", "B: chain 12/3/4"}, names
    assert "A: τ =" in final["ab_caption"] or "A: dynamic 12/4/4: τ" in final["ab_caption"]
    assert len([a for a in final["ab_trees"].layout.annotations if "step" in (a.text or "")]) == 2
    replay = handlers.replay_view(session, 1)
    assert "ab_trees" in replay
    handlers.pin(session)                                   # pinning again replaces A
    assert session.pinned.label.startswith("A: chain")


def test_autoplay_moves_one_step_and_stops_at_the_end(finished):
    session, _ = finished
    view, more = handlers.play_step(session, 0)
    assert view["slider"] == 1 and more and "Step 1 of" in view["phases"]
    last = len(session.steps) - 1
    view, more = handlers.play_step(session, last - 1)
    assert view["slider"] == last and not more


def test_the_page_load_shows_the_first_demo_but_keeps_the_pages_tree(ctx):
    """On page load the first demo is shown with its prompt (and its other settings) in the
    controls, but the method, the tree knobs, adapt and the preset menu stay the page's: the
    first Generate runs the tree the header names for this machine, not the demo's. The
    Load-demo button restores every knob."""
    from app.engine.spec import SETTING
    from app.ui.blocks import TREE_SETTINGS, build_demo, control_value, page_defaults
    from app.ui.requests import AUTO_PRESET

    demos = demo_traces()
    name = next(iter(demos))
    demo_settings = traces.parse_trace(open(demos[name], "rb").read()).settings
    page = dict(page_defaults(ctx.tree_defaults), method=SETTING["method"].default)
    assert any(demo_settings.get(k, page[k]) != page[k] for k in TREE_SETTINGS), "the demo's tree is the page's"
    fns = {f.name: f for f in build_demo(ctx, demos=demos).fns.values()}

    def event(fn_name, *args) -> dict:
        """What the event sets, by element id; a control it leaves alone (gr.skip()) is None."""
        f = fns[fn_name]
        out = f.fn(Session(), *args)
        return {b.elem_id: None if isinstance(v, dict) and v.get("__type__") == "update" and "value" not in v else v
                for b, v in zip(f.outputs, out) if getattr(b, "elem_id", None)}

    def control(setting: str) -> str:
        return setting.replace("_", "-")

    loaded = event("first_demo")
    assert loaded["prompt"] == demo_settings["prompt"]
    assert loaded["max-new-tokens"] == control_value("max_new_tokens", demo_settings["max_new_tokens"], ctx.config)
    for k in TREE_SETTINGS:       # left alone: the page starts at its defaults
        assert loaded[control(k)] in (None, page[k]), k
    assert loaded["tree-preset"] in (None, AUTO_PRESET)
    clicked = event("load_demo", name)
    for k in TREE_SETTINGS:
        assert clicked[control(k)] == control_value(k, demo_settings.get(k, page[k]), ctx.config), k


def test_every_view_is_named_by_its_enum_and_has_one_component(ctx, finished):
    """The views' names are enums (``RunView``, ``ExploreView``, ``MethodsView``) whose values
    are the names the page always used: every key a run yields is a member, every member has
    exactly one component, and the main events' outputs keep their first-release order."""
    import gradio as gr

    from app.ui.blocks import RUN_VIEWS
    from app.ui.blocks.layout import build_layout
    from app.ui.methods import MethodsView

    _, views = finished
    assert set().union(*views) <= set(handlers.RunView)
    with gr.Blocks():
        c = build_layout(ctx, {})
    assert set(c.outputs) == set(handlers.RunView) | set(handlers.ExploreView) | set(MethodsView)
    assert list(RUN_VIEWS)[:11] == ["status", "stream", "tree", "speedup", "race", "slider", "phases", "depth",
                                    "calibration", "per_step", "trace_file"]
    assert c.outputs["tree"] is c.outputs[handlers.RunView.TREE]            # a member finds a name's entry


def test_the_header_names_the_default_tree_in_words():
    """The header's tree in a visitor's words: one guess is 'guess', the lookup branch is
    named when the tree has one, and a replay-only server says it runs no model."""
    from app.ui.explain import header_markdown

    model = {"target": "SmolLM2-135M-Instruct", "head": "h", "device": "cpu", "dtype": "bfloat16"}
    one = header_markdown(model, {"total_tokens": 1, "depth": 1, "top_k": 8, "lookup": 3}, True)
    assert "**1 guess, 1 deep**" in one and "measured fastest here" in one
    assert "prompt-lookup branch** beside it (up to 3 tokens" in one
    many = header_markdown(model, {"total_tokens": 24, "depth": 5, "top_k": 8, "lookup": 0}, False)
    assert "**24 guesses, 5 deep**" in many and "not measured here" in many and "lookup" not in many
    assert "No model is loaded" in header_markdown(None, None, False)
