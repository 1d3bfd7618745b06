"""A real Gradio server, launched in this process on 127.0.0.1 with the tiny model, driven by
gradio_client exactly as a script or a stranger would: streaming, errors, Stop, a quick load
and fuzz run (the full-size runs live in scripts/loadtest.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from app.engine.config import TreeConfig
from app.engine.engine import Engine
from app.ui.blocks import build_demo, launch_kwargs
from app.ui.settings import AppContext, ServerConfig
from tests.tiny import PacedEngine

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ("w5 w17 w33 w90", "w7 w7 w100", "w3 w250 w12")
FAST = dict(depth=3, top_k=4, total_tokens=8)


def _loadtest():
    spec = importlib.util.spec_from_file_location("loadtest", REPO / "scripts" / "loadtest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def server(tiny):
    target, head = tiny
    config = ServerConfig(max_new_tokens=128, max_prompt_chars=5000, queue_size=16,
                          update_interval_s=0.05)   # the tiny model decodes ~100x faster than a real one
    # paced at 100 steps/s: unpaced, a 120-token race could end (~0.1 s) while the page's first
    # view was still being sent, and a test saw streaming or a Stop only on a slow machine
    demo = build_demo(AppContext(PacedEngine(target, head, pace_s=0.01), config, "tiny test model"), demos={})
    _, url, _ = demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True,
                            **launch_kwargs(config))
    yield url
    demo.close()


@pytest.fixture
def client(server):
    from gradio_client import Client

    return Client(server, verbose=False, download_files=False)


def test_generate_is_a_named_api(client):
    api = client.view_api(print_info=False, return_format="dict")
    params = [p["parameter_name"] for p in api["named_endpoints"]["/generate"]["parameters"]]
    assert params[:4] == ["prompt", "method", "max_new_tokens", "temperature"]
    assert "session" not in params


def test_streamed_generation_ends_with_a_speedup(client):
    # 120 tokens at the server's pace: the race lasts >= 1.2 s (its vanilla half alone takes
    # 120 paced steps), many times the update interval and the first view's sending
    job = client.submit(prompt=PROMPTS[0], method="dynamic", max_new_tokens=120, temperature=0.0, **FAST,
                        api_name="/generate")
    final = job.result(timeout=300)
    assert len(job.outputs()) >= 3
    assert str(final[0]).startswith("done")
    assert "Speedup" in final[3] and "×" in final[3] and "identical" in final[3]


def test_invalid_input_is_an_error_message_and_the_server_keeps_serving(client):
    """Bad settings are refused by the event's validator, before the run starts, each message
    on the parameter it is about; a knob from a (maybe closed) accordion is named by the
    prompt too, so the page always shows it."""
    from gradio_client.exceptions import ValidationError

    with pytest.raises(ValidationError, match="- max_new_tokens: max_new_tokens must be"):
        client.predict(prompt=PROMPTS[1], method="dynamic", max_new_tokens=10**6, temperature=0.0,
                       api_name="/generate")
    with pytest.raises(ValidationError, match="- prompt: prompt must be a non-empty"):
        client.predict(prompt=" ", method="dynamic", max_new_tokens=4, temperature=0.0, api_name="/generate")
    with pytest.raises(ValidationError) as refused:
        client.predict(prompt=PROMPTS[1], method="threshold", max_new_tokens=4, temperature=0.0, tau_low=0.9,
                       tau_high=0.2, api_name="/generate")
    assert "- tau_low: tau_low must be <= tau_high" in str(refused.value)
    assert "- prompt: Tree knobs: tau_low must be <= tau_high" in str(refused.value)
    with pytest.raises(ValidationError, match="- max_new_tokens: max_new_tokens must be"):   # the sweep's settings too
        client.predict(knob="total_tokens", start=2, stop=4, count=2, prompt=PROMPTS[1], method="dynamic",
                       max_new_tokens=0, temperature=0.0, top_p=1.0, seed=0, depth=2, top_k=2, total_tokens=4,
                       tau_high=0.5, tau_low=0.05, min_confidence=0.0, api_name="/explore")
    out = client.predict(prompt=PROMPTS[1], method="vanilla", max_new_tokens=4, temperature=0.0,
                         api_name="/generate")
    assert str(out[0]).startswith("done")


def test_stop_frees_the_worker(server):
    r = _loadtest().stop_latency(server, dict(prompt=PROMPTS[2], method="dynamic", max_new_tokens=120,
                                              temperature=0.0, **FAST))
    assert r["next_ok"]
    steps = int(r["stopped_status"].split("stopped after ")[1].split()[0])
    assert 0 < steps < 100                        # it really was stopped mid-generation
    assert r["worker_free_s"] < 60                # generous: the machine is shared; see the note for numbers


def test_quick_load_two_visitors(server):
    stats = _loadtest().run_visitors(server, visitors=2, seconds=120, max_requests=4, max_new_tokens=8,
                                     prompts=PROMPTS)
    assert stats["ok"] == 4 and stats["failed"] == 0 and stats["hung"] == 0, stats["errors"]


def test_quick_fuzz(server):
    stats = _loadtest().fuzz(server, examples=25)
    assert stats["sent"] == 25
    assert stats["error_message"] == 25, (stats["accepted"], stats["server_errors"])
    assert stats["valid_after_ok"]


def _voluntary_switches_per_s(seconds: float = 2.0) -> float:
    """Voluntary context switches per second of this whole process (every thread): a thread
    that sleeps and wakes up counts one each time."""
    import os
    import time

    def total():
        n = 0
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/status") as f:
                    n += sum(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
            except FileNotFoundError:   # a thread that ended while we counted
                pass
        return n

    a, t0 = total(), time.perf_counter()
    time.sleep(seconds)
    return (total() - a) / (time.perf_counter() - t0)


def test_the_idle_server_does_not_busy_poll(server):
    # Gradio's queue polls every 1 ms by default (~900 wake-ups/s measured here); each one
    # would preempt an engine thread on a 2-core machine. calm_queue_polling brings it to ~60.
    # The quietest of four 1-second windows: the tail of the earlier tests' requests (closing
    # streams, a last run's OpenMP threads going to sleep) can fill one window (524/s was
    # seen once), a queue that polls every millisecond fills all four.
    assert min(_voluntary_switches_per_s(1.0) for _ in range(4)) < 300


def test_time_app_run_sees_the_done_update(server):
    seconds = _loadtest().time_app_run(server, dict(prompt=PROMPTS[0], method="dynamic", max_new_tokens=16,
                                                    temperature=0.0, **FAST))
    assert 0 < seconds < 120


def test_tree_presets_set_the_knobs_and_refuse_unknown_names(client, tiny):
    from gradio_client.exceptions import AppError

    from app.ui.requests import AUTO_PRESET, TREE_PRESETS

    paper = next(name for name, shape in TREE_PRESETS.items() if shape == (60, 5, 10))
    assert list(client.predict(paper, api_name="/tree_preset")) == [5, 10, 60]      # depth, top_k, total
    default = TreeConfig()                                   # the tiny server starts with the engine's defaults
    assert list(client.predict(AUTO_PRESET, api_name="/tree_preset")) == [default.depth, default.top_k,
                                                                          default.total_tokens]
    for bad in ("the biggest tree", None, 7, ["x"], {"a": 1}, "x" * 100_000):
        with pytest.raises(AppError, match="tree preset must be one of") as refused:
            client.predict(bad, api_name="/tree_preset")
        assert len(str(refused.value)) < 400


def test_a_click_is_validated_once(client, monkeypatch):
    """The event validator parses the request and hands it to the event, which does not
    parse it again; a refused request is parsed once and never reaches the event."""
    from gradio_client.exceptions import ValidationError

    from app.ui.handlers import common   # where parse lives; the events look it up there

    parsed, real = [], common.parse
    monkeypatch.setattr(common, "parse", lambda ctx, raw: parsed.append(raw) or real(ctx, raw))
    out = client.predict(prompt=PROMPTS[1], method="dynamic", max_new_tokens=4, temperature=0.0, **FAST,
                         api_name="/generate")
    assert str(out[0]).startswith("done") and len(parsed) == 1
    with pytest.raises(ValidationError, match="- depth: depth must be"):
        client.predict(prompt=PROMPTS[1], method="dynamic", max_new_tokens=4, temperature=0.0, depth=99,
                       api_name="/generate")
    assert len(parsed) == 2
    out = client.predict(knob="depth", start=1, stop=2, count=2, prompt=PROMPTS[1], method="chain", max_new_tokens=4,
                         temperature=0.0, top_p=1.0, seed=0, depth=2, top_k=2, total_tokens=4, tau_high=0.5,
                         tau_low=0.05, min_confidence=0.0, api_name="/explore")
    assert str(out[1]).startswith(("best: depth", "tie: depth")) and len(parsed) == 3
    with pytest.raises(ValidationError, match="- knob: knob top_k does nothing under method chain"):
        client.predict(knob="top_k", start=1, stop=2, count=2, prompt=PROMPTS[1], method="chain", max_new_tokens=4,
                       temperature=0.0, top_p=1.0, seed=0, depth=2, top_k=2, total_tokens=4, tau_high=0.5,
                       tau_low=0.05, min_confidence=0.0, api_name="/explore")
    with pytest.raises(ValidationError, match="- start: start and stop give no depth value that can run"):
        client.predict(knob="depth", start=1e308, stop=-1e308, count=2, prompt=PROMPTS[1], method="chain",
                       max_new_tokens=4, temperature=0.0, top_p=1.0, seed=0, depth=2, top_k=2, total_tokens=4,
                       tau_high=0.5, tau_low=0.05, min_confidence=0.0, api_name="/explore")


@pytest.mark.parametrize("chosen", [["vanilla"], "five"])
def test_compare_methods_counts_are_refused_by_the_validator(client, server, tiny, chosen):
    """One method, or one more than the most: a message under the methods control
    (ValidationError), not a page-wide error from the event."""
    from gradio_client.exceptions import ValidationError

    from app.ui import methods

    choices = methods.available_methods(AppContext(Engine(*tiny), ServerConfig(), "tiny"))
    if chosen == "five":
        chosen = list(choices)[:methods.MAX_METHODS + 1]
        assert len(chosen) == methods.MAX_METHODS + 1, choices
    with pytest.raises(ValidationError, match="- methods_list: methods must be"):
        client.predict(PROMPTS[0], chosen, 8, api_name="/compare_methods")


def test_a_hostile_trace_never_breaks_the_session(client, tmp_path):
    """A trace with a lone surrogate in a text is refused in one short line; the visitor's run
    on screen stays and replays (a loaded surrogate made every later update fail)."""
    import json

    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    client.predict(prompt=PROMPTS[1], method="vanilla", max_new_tokens=4, temperature=0.0, api_name="/generate")
    before = client.predict(0, api_name="/replay")[0]
    assert 'class="tok' in str(before)
    r = client.predict(prompt=PROMPTS[1], method="dynamic", max_new_tokens=6, temperature=0.0, **FAST,
                       api_name="/generate")
    trace_path = r[10]["value"] if isinstance(r[10], dict) and "value" in r[10] else r[10]
    trace_path = trace_path.get("path") if isinstance(trace_path, dict) else trace_path
    with open(trace_path, encoding="utf-8") as f:
        trace = json.load(f)
    trace["records"][1]["text"] = "\ud800"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(trace))
    with pytest.raises(AppError, match="(?i)unicode") as refused:
        client.predict(handle_file(str(bad)), api_name="/load_trace")
    assert len(str(refused.value)) < 300
    after = client.predict(0, api_name="/replay")[0]
    assert 'class="tok' in str(after)
    assert str(client.predict(prompt=PROMPTS[1], method="vanilla", max_new_tokens=2, temperature=0.0,
                              api_name="/generate")[0]).startswith("done")


def test_a_downloaded_trace_is_served_and_loads_back(client, server, tmp_path):
    """The trace a run offers for download is served, byte for byte the file written (a file
    Gradio refused to serve canceled the page's download), and loads back as it is."""
    import httpx
    from gradio_client import handle_file

    r = client.predict(prompt=PROMPTS[0], method="dynamic", max_new_tokens=8, temperature=0.0, **FAST,
                       api_name="/generate")
    file = r[10]["value"] if isinstance(r[10], dict) and "value" in r[10] else r[10]
    url = file.get("url") or f"{server.rstrip('/')}/gradio_api/file={file['path']}"
    served = httpx.get(url, timeout=30)
    assert served.status_code == 200, (served.status_code, served.text[:200])
    with open(file["path"], "rb") as f:
        assert served.content == f.read()
    again = tmp_path / "downloaded.json"
    again.write_bytes(served.content)
    status = client.predict(handle_file(str(again)), api_name="/load_trace")[0]
    assert "replaying `uploaded trace`" in str(status)
