"""Load, fuzz, stop and speed checks against a running EAGLE Lens server — loopback only.

    python scripts/loadtest.py load  --visitors 8 --minutes 3   # concurrent valid visitors + memory
    python scripts/loadtest.py fuzz  --examples 200             # invalid inputs (hypothesis)
    python scripts/loadtest.py stop                             # how fast Stop frees the worker
    python scripts/loadtest.py speed                            # app tokens/s vs the engine's own
    python scripts/loadtest.py flood --sessions 200             # new sessions from one script vs visitors' state
    python scripts/loadtest.py burst --joins 40                 # simultaneous joins vs the queue's cap
    python scripts/loadtest.py records --sessions 48            # one crafted trace loaded by many sessions vs memory

By default the script starts the server itself (``python app.py`` in a subprocess on a free
loopback port, with the server's usual environment variables) and measures that process's
resident memory; ``--url`` points it at one already running (``--pid`` for its memory).
Everything is bounded in count and time and stops by itself. Only 127.0.0.1 / localhost URLs
are accepted: this is a tool for your own machine, not for someone else's Space.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from urllib.parse import urlparse

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:          # `python scripts/loadtest.py` puts only scripts/ on the path
    sys.path.insert(0, REPO)
METHODS = ("dynamic", "static", "chain", "threshold", "vanilla")
PROMPTS = ("What is a prime number?", "Write a haiku about autumn.", "Explain recursion to a child.",
           "List three uses of a paperclip.", "What is 12 times 7?")


# --- valid visitors ----------------------------------------------------------------------------

def random_valid_settings(rng: np.random.Generator, max_new_tokens: int = 24, prompts=PROMPTS,
                          methods=METHODS) -> dict:
    """A random but valid request, as a visitor moving the sliders would send."""
    tau_low = float(np.round(rng.uniform(0, 0.5), 2))
    return dict(prompt=str(rng.choice(prompts)), method=str(rng.choice(methods)),
                max_new_tokens=int(rng.integers(4, max_new_tokens + 1)),
                temperature=float(rng.choice([0.0, 0.0, 0.7, 1.0])), top_p=float(rng.choice([1.0, 0.9])),
                seed=int(rng.integers(0, 1000)), depth=int(rng.integers(1, 7)), top_k=int(rng.integers(1, 9)),
                total_tokens=int(rng.integers(4, 33)), tau_high=float(np.round(rng.uniform(tau_low, 1), 2)),
                tau_low=tau_low, min_confidence=float(rng.choice([0.0, 0.0, 0.01])))


def check_loopback(url: str) -> str:
    host = urlparse(url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"refusing {url}: this script only talks to a server on this machine")
    return url


def run_visitors(url: str, visitors: int, seconds: float, max_requests: int = 10_000, seed: int = 0,
                 max_new_tokens: int = 24, prompts=PROMPTS, methods=METHODS, on_tick=None) -> dict:
    """``visitors`` threads, each its own gradio_client session, sending random valid requests
    until ``seconds`` pass or ``max_requests`` are sent in total. Returns counts and latencies."""
    from gradio_client import Client

    check_loopback(url)
    deadline = time.monotonic() + seconds
    lock = threading.Lock()
    stats = {"ok": 0, "failed": 0, "errors": [], "latency": [], "sent": 0}

    def visitor(i: int):
        rng = np.random.default_rng(seed + i)
        # each visitor its own address (X-Forwarded-For, honoured where loopback is a trusted
        # proxy): the server lets one address have only a few runs waiting
        client = Client(url, verbose=False, download_files=False, headers={"X-Forwarded-For": f"10.50.{i // 250}.{i % 250 + 1}"})
        while time.monotonic() < deadline:
            with lock:
                if stats["sent"] >= max_requests:
                    return
                stats["sent"] += 1
            settings = random_valid_settings(rng, max_new_tokens, prompts, methods)
            t0 = time.perf_counter()
            try:
                out = client.predict(**settings, api_name="/generate")
                ok = isinstance(out, (list, tuple)) and str(out[0]).startswith("done")
                err = None if ok else f"unfinished: {str(out[0])[:80]}"
            except Exception as exc:  # noqa: BLE001 — every failure is counted and reported
                ok, err = False, f"{type(exc).__name__}: {exc}"[:200]
            with lock:
                stats["latency"].append(time.perf_counter() - t0)
                stats["ok" if ok else "failed"] += 1
                if err:
                    stats["errors"].append(err)
            if on_tick:
                on_tick()

    threads = [threading.Thread(target=visitor, args=(i,), daemon=True) for i in range(visitors)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 600)
    stats["hung"] = sum(t.is_alive() for t in threads)
    return stats


# --- invalid inputs ------------------------------------------------------------------------------

def invalid_requests():
    """A hypothesis strategy of requests with at least one invalid value."""
    from hypothesis import strategies as st

    # (NaN and infinity cannot travel in JSON at all; the handler tests cover them directly.)
    not_a_number = st.one_of(st.none(), st.text(max_size=5), st.booleans(), st.lists(st.integers(), max_size=2),
                             st.floats(min_value=-1e9, max_value=-0.001))
    bad_number = st.one_of(not_a_number, st.integers(min_value=10**6, max_value=10**12))
    bad = {
        "prompt": st.one_of(st.just(""), st.just("   "), st.none(), st.integers(), st.text(min_size=5001, max_size=6000)),
        "method": st.one_of(st.none(), st.integers(), st.sampled_from(["", "DYNAMIC", "eagle", "../x", "__import__"])),
        "max_new_tokens": st.one_of(bad_number, st.just(0), st.floats(min_value=1.1, max_value=1.9)),
        "temperature": st.one_of(bad_number, st.floats(min_value=2.01, max_value=1e6)),
        "top_p": st.one_of(bad_number, st.just(0.0), st.floats(min_value=1.001, max_value=10)),
        "seed": st.one_of(not_a_number, st.just(-1), st.floats(min_value=0.1, max_value=0.9),
                          st.integers(min_value=2**63, max_value=2**70)),      # any seed in [0, 2^63) is valid
        "depth": st.one_of(bad_number, st.just(0), st.integers(min_value=17, max_value=1000)),
        "top_k": st.one_of(bad_number, st.just(0), st.integers(min_value=33, max_value=1000)),
        "total_tokens": st.one_of(bad_number, st.just(0), st.integers(min_value=257, max_value=10**5)),
        "tau_high": st.one_of(bad_number, st.floats(min_value=1.001, max_value=5)),
        "tau_low": st.one_of(bad_number, st.floats(min_value=1.001, max_value=5)),
        "min_confidence": st.one_of(bad_number, st.floats(min_value=1.001, max_value=5)),
    }
    valid = dict(prompt="What is 2 + 2?", method="dynamic", max_new_tokens=4, temperature=0.0, top_p=1.0, seed=0,
                 depth=3, top_k=4, total_tokens=8, tau_high=0.5, tau_low=0.05, min_confidence=0.0)
    return st.sampled_from(sorted(bad)).flatmap(
        lambda key: bad[key].map(lambda value: {**valid, key: value}))


def fuzz(url: str, examples: int, seed: int = 0, valid_after: dict | None = None) -> dict:
    """Send ``examples`` invalid requests; each must come back as an error message (the event
    validator's ValidationError, or AppError from the run itself), never a result and never a
    transport failure; then a valid request must still succeed."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError, ValidationError
    from hypothesis import HealthCheck, given, settings

    check_loopback(url)
    client = Client(url, verbose=False, download_files=False)
    stats = {"sent": 0, "error_message": 0, "accepted": [], "server_errors": [], "messages": {}}

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(invalid_requests())
    def one(request):
        stats["sent"] += 1
        try:
            client.predict(**request, api_name="/generate")
            stats["accepted"].append({k: repr(v)[:40] for k, v in request.items()})
        except ValidationError as exc:    # "1 parameter(s) failed validation:\n- NAME: message"
            stats["error_message"] += 1
            first = str(exc).splitlines()[1] if "\n" in str(exc) else str(exc)
            stats["messages"].setdefault(first.lstrip("- ").split(":")[0], first[:100])   # one example per parameter
        except AppError as exc:
            stats["error_message"] += 1
            stats["messages"].setdefault(str(exc).split()[0], str(exc)[:100])
        except Exception as exc:  # noqa: BLE001
            stats["server_errors"].append(f"{type(exc).__name__}: {exc}"[:200])

    one()
    after = valid_after or dict(prompt="What is 2 + 2?", method="vanilla", max_new_tokens=4, temperature=0.0)
    out = client.predict(**after, api_name="/generate")
    stats["valid_after_ok"] = str(out[0]).startswith("done")
    return stats


# --- session flood and simultaneous joins ------------------------------------------------------

def endpoint_ids(url: str) -> dict[str, int]:
    """{api name: fn_index} from the server's /config."""
    import httpx

    config = httpx.get(url.rstrip("/") + "/config", timeout=30).json()
    return {d["api_name"]: d["id"] for d in config["dependencies"] if d.get("api_name")}


def raw_join(http, url: str, fn_index: int, data: list, session_hash: str, client: str | None = None,
             answer: list | None = None) -> int:
    """One queue join as any script can send it (no page, no gradio_client): the HTTP status
    (its body's text is appended to ``answer``). ``client`` travels as X-Forwarded-For, which
    the server honours from a trusted proxy (EAGLE_LENS_TRUSTED_PROXIES=127.0.0.1, as the
    servers this script starts have): one machine can play many visitors."""
    headers = {"X-Forwarded-For": client} if client else {}
    r = http.post(url.rstrip("/") + "/gradio_api/queue/join", headers=headers, timeout=60,
                  json={"data": data, "fn_index": fn_index, "session_hash": session_hash,
                        "event_data": None, "trigger_id": None})
    if answer is not None:
        answer.append(r.text)
    return r.status_code


def _visitor_with_a_run(url: str, address: str):
    """A visitor (its own address) who has generated a short run, so that it has state to lose."""
    from gradio_client import Client

    client = Client(url, verbose=False, download_files=False, headers={"X-Forwarded-For": address})
    client.predict(prompt=PROMPTS[0], method="vanilla", max_new_tokens=4, temperature=0.0, api_name="/generate")
    return client


def _still_has_its_run(client) -> bool:
    """The visitor's replay still shows its tokens (an evicted visitor's replay shows nothing)."""
    stream, *_ = client.predict(0, api_name="/replay")
    return 'class="tok' in str(stream)


def session_flood(url: str, flood: int = 200, victims: int = 3, addresses: int = 1, prefix: str = "10.66") -> dict:
    """``victims`` visitors each make a run; then ``flood`` new sessions (one /stop call each,
    the cheapest request) from ``addresses`` client addresses; then each victim replays its
    run. Returns how many flood sessions were accepted / refused, and how many victims kept
    their run."""
    import uuid

    import httpx

    check_loopback(url)
    kept_before = [_visitor_with_a_run(url, f"10.1.0.{i + 1}") for i in range(victims)]
    stop = endpoint_ids(url)["stop"]
    codes: dict[int, int] = {}
    t0 = time.monotonic()
    with httpx.Client() as http:
        for i in range(flood):
            client = f"{prefix}.{(i % addresses) // 250}.{(i % addresses) % 250 + 1}"
            code = raw_join(http, url, stop, [None], uuid.uuid4().hex[:11], client)
            codes[code] = codes.get(code, 0) + 1
    seconds = time.monotonic() - t0
    kept = sum(_still_has_its_run(c) for c in kept_before)
    return {"sent": flood, "accepted": codes.get(200, 0), "refused": flood - codes.get(200, 0), "codes": codes,
            "seconds": seconds, "victims": victims, "victims_kept": kept}


def burst(url: str, n: int = 40, busy_tokens: int = 200, settings: dict | None = None) -> dict:
    """``n`` /generate joins sent at the same instant (threads released by one barrier) while
    the worker is busy with a long run, so nothing leaves the queue meanwhile: how many are
    accepted (at most the queue's size, EAGLE_LENS_QUEUE), how many refused as queue full, and
    how many otherwise (e.g. a server whose sessions are all in use refuses new ones)."""
    import uuid

    import httpx
    from gradio_client import Client

    from app.engine.spec import SETTING
    from app.ui.requests import SETTING_NAMES

    check_loopback(url)
    busy = Client(url, verbose=False, download_files=False)
    job = busy.submit(prompt=PROMPTS[1], method="vanilla", max_new_tokens=busy_tokens, temperature=0.0,
                      api_name="/generate")
    while job.status().code.name not in ("PROCESSING", "ITERATING", "FINISHED"):
        time.sleep(0.05)
    settings = settings or dict(prompt=PROMPTS[0], method="vanilla", max_new_tokens=2, temperature=0.0, top_p=1.0,
                                seed=0, depth=3, top_k=4, total_tokens=8, tau_high=0.5, tau_low=0.05,
                                min_confidence=0.0)
    data = [settings.get(k, SETTING[k].default) for k in SETTING_NAMES] + [False, True, None]   # + step mode, race, state
    generate = endpoint_ids(url)["generate"]
    barrier = threading.Barrier(n)
    codes: list[int] = []
    answers: list[str] = []
    lock = threading.Lock()

    def one(i: int):
        with httpx.Client() as http:
            barrier.wait()
            code = raw_join(http, url, generate, data, uuid.uuid4().hex[:11], f"10.2.{i // 250}.{i % 250 + 1}",
                            answers)
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    running = job.status().code.name != "FINISHED"
    job.cancel()
    with contextlib.suppress(Exception):
        busy.predict(api_name="/stop")
    queue_full = sum("Queue is full" in a for a in answers)
    return {"sent": n, "accepted": codes.count(200), "refused": queue_full,
            "other": len(codes) - codes.count(200) - queue_full, "worker_busy_throughout": running}


def crafted_trace(steps: int = 300, nodes: int = 256) -> dict:
    """A valid trace as large as the schema allows per step: ``steps`` steps of ``nodes``-node
    trees (32 chains of depth nodes / 32), as anyone can write one by hand (~3.7 MB at 300 x 256)."""
    roots = 32
    tree = {"root_token": 5, "tokens": [7 + i % 200 for i in range(nodes)], "texts": ["w"] * nodes,
            "parents": [-1 if i < roots else i - roots for i in range(nodes)],
            "depths": [1 + i // roots for i in range(nodes)], "q": [0.5] * nodes, "confidence": [0.5] * nodes,
            "p": None, "status": ["rejected"] * nodes}
    shape = {"method": "dynamic", "depth": -(-nodes // roots), "top_k": roots, "total_tokens": nodes}
    records = [{"type": "step", "step": 0, "method": "dynamic", "tree": None, "accepted": [], "bonus": 5,
                "new_tokens": [5], "text": "w", "rule": "greedy", "drafter": None, "tree_config": None,
                "prefill": True, "draft_ms": 0.0, "verify_ms": 1.0, "step_ms": 1.0}]
    records += [{"type": "step", "step": i, "method": "dynamic", "tree": tree, "accepted": [], "bonus": 6,
                 "new_tokens": [6], "text": "w", "rule": "greedy", "drafter": "eagle2", "tree_config": shape,
                 "prefill": False, "draft_ms": 1.0, "verify_ms": 1.0, "step_ms": 2.0} for i in range(1, steps)]
    records.append({"type": "summary", "method": "dynamic", "new_tokens": steps, "seconds": 1.0, "tokens_per_s": 1.0,
                    "target_forwards": steps, "mean_accepted": 1.0, "accepted_by_depth": [], "token_ids": [5] + [6] * (steps - 1),
                    "text": "w" * steps})
    return {"format": "eagle-lens-trace", "version": 2, "settings": {"prompt": "w5", "method": "dynamic"},
            "model": {"target": "crafted"}, "records": records, "vanilla": None}


def trace_flood(url: str, sessions: int = 48, addresses: int = 1, steps: int = 300, nodes: int = 256) -> dict:
    """Upload one crafted trace (``crafted_trace``) once, then load it from ``sessions`` new
    sessions of ``addresses`` addresses (in turn): how many loads were taken, how many refused
    with a message. (gradio_client sends the file again with each load, so each address also
    meets the upload rate.)"""
    address = f"10.44.{int(time.time()) % 250}.1"       # a fresh uploader for each run
    import httpx
    from gradio_client import Client

    check_loopback(url)
    body = json.dumps(crafted_trace(steps, nodes)).encode()
    r = httpx.post(url.rstrip("/") + "/gradio_api/upload", files={"files": ("crafted.json", body)},
                   headers={"X-Forwarded-For": address}, timeout=120)
    r.raise_for_status()
    server_path = r.json()[0]
    loaded, refused, other, clients = 0, 0, [], []
    for i in range(sessions):
        try:
            client = Client(url, verbose=False, download_files=False,
                            headers={"X-Forwarded-For": f"10.45.0.{i % addresses + 1}"})
            client.predict({"path": server_path, "meta": {"_type": "gradio.FileData"}}, api_name="/load_trace")
            loaded += 1
            clients.append(client)              # kept: its session stays active
        except Exception as exc:  # noqa: BLE001 — counted: a refusal is the expected answer past the budget
            text = str(exc)
            if "hold" in text or "full" in text or "too many" in text:
                refused += 1
            else:
                other.append(f"{type(exc).__name__}: {text}"[:160])
    return {"sessions": sessions, "trace_bytes": len(body), "loaded": loaded, "refused": refused, "other": other}


# --- stop latency ------------------------------------------------------------------------------

def stop_latency(url: str, settings: dict, wait_updates: int = 2) -> dict:
    """Start a long generation, stop it after a few updates the way the page does (cancel the
    running event, then call /stop), and time until a new one-token request — which needs the
    single engine worker — has finished."""
    from gradio_client import Client

    check_loopback(url)
    client = Client(url, verbose=False, download_files=False)
    job = client.submit(**settings, api_name="/generate")
    deadline = time.monotonic() + 300
    while len(job.outputs()) < wait_updates and not job.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    at_stop = len(job.outputs())
    t0 = time.perf_counter()
    job.cancel()                       # what the Stop button (and a closed tab) does to the event
    out = client.predict(api_name="/stop")
    t_stop = time.perf_counter() - t0
    nxt = client.predict(prompt=settings["prompt"], method="vanilla", max_new_tokens=1, temperature=0.0,
                         api_name="/generate")
    t_free = time.perf_counter() - t0
    return {"stop_call_s": t_stop, "worker_free_s": t_free, "next_ok": str(nxt[0]).startswith("done"),
            "stopped_status": str(out[0]), "updates_before_stop": at_stop}


# --- speed: app vs engine ------------------------------------------------------------------------

def time_app_run(url: str, settings: dict, timeout: float = 600) -> float:
    """Seconds from submitting ``settings`` to /generate until the update saying the EAGLE run
    is done arrives at this client."""
    from gradio_client import Client

    check_loopback(url)
    client = Client(url, verbose=False, download_files=False)
    job = client.submit(**settings, api_name="/generate")
    t0 = time.perf_counter()
    t_done, seen = None, 0
    # Look at the received updates every 20 ms (timing error <= 20 ms of a ~15 s run).
    # Not `for out in job`: gradio_client's iterator polls every 1 ms, and 1,000 wake-ups a
    # second of a second process on this 2-core machine would slow the engine it is timing.
    while t_done is None and time.perf_counter() - t0 < timeout:
        finished = job.done()          # read before the outputs, so none can arrive in between
        outputs = job.outputs()
        if any(str(out[0]).startswith(("EAGLE done", "done")) for out in outputs[seen:]):
            t_done = time.perf_counter()
        elif finished:
            break
        seen = len(outputs)
        time.sleep(0.02)
    if t_done is None:
        raise TimeoutError(f"no 'done' update within {timeout} s")
    job.result()
    return t_done - t0


def _client_process(url: str, settings: dict) -> subprocess.Popen:
    """A client in its own process, as a browser is: its Python must not share the server's
    GIL. It connects at once, then waits for a line on stdin before submitting, so that its
    start-up (importing gradio_client) is not timed."""
    code = ("import json, sys; sys.path.insert(0, %r); from scripts.loadtest import time_app_run; "
            "from gradio_client import Client; sys.stdin.readline(); "
            "print(time_app_run(%r, json.loads(%r)), flush=True)") % (REPO, url, json.dumps(settings))
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def app_vs_engine(url: str, engine, settings: dict, tree, repeats: int = 5, engine_thread=None) -> dict:
    """Wall-clock tokens/s of the EAGLE phase through the page (submit -> the update saying the
    EAGLE run is done, as a client in another process sees it) against the same engine, with
    the same tree (``tree``: what the app decodes with for ``settings``), iterated in a tight
    loop, on ``engine_thread`` when given (the app's own: the thread that loaded the model and
    serves every page run). Both include the prefill. Runs alternate (engine, app, engine, app, ...) so that the
    load of a shared machine hits both alike; the ratio is the median of the per-pair ratios."""
    from app.engine.config import SamplingConfig

    check_loopback(url)
    sampling = SamplingConfig(temperature=settings["temperature"])
    engine_rates, app_rates = [], []
    for _ in range(repeats):
        client = _client_process(url, settings)
        time.sleep(3.0)                                # its imports, before anything is timed
        def timed_run():
            t0 = time.perf_counter()
            summary = list(engine.generate(settings["prompt"], tree=tree, sampling=sampling,
                                           max_new_tokens=settings["max_new_tokens"]))[-1]
            return summary, time.perf_counter() - t0

        summary, seconds = engine_thread.call(timed_run) if engine_thread is not None else timed_run()
        engine_rates.append(summary.new_tokens / seconds)
        out, _ = client.communicate("go\n", timeout=900)
        if client.returncode != 0:
            raise RuntimeError(f"client failed (exit {client.returncode})")
        app_rates.append(summary.new_tokens / float(out.strip().splitlines()[-1]))
    ratios = [a / e for a, e in zip(app_rates, engine_rates)]
    return {"engine_tokens_per_s": float(np.median(engine_rates)), "app_tokens_per_s": float(np.median(app_rates)),
            "ratio": float(np.median(ratios)), "ratios": ratios, "tokens": summary.new_tokens,
            "tau": summary.mean_accepted}


# --- server process ------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def spawned_server(env: dict | None = None, timeout: float = 600):
    """``python app.py`` on a free loopback port; yields (url, pid); terminated on exit."""
    import httpx

    port = free_port()
    # this script plays many visitors through X-Forwarded-For from loopback: trust that proxy only
    full_env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
                "GRADIO_ANALYTICS_ENABLED": "False", "EAGLE_LENS_TRUSTED_PROXIES": "127.0.0.1", **(env or {})}
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "app.py")], cwd=REPO, env=full_env)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"server exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "config", timeout=2).status_code == 200:
                    break
            time.sleep(1)
        else:
            raise SystemExit("server did not start in time")
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def speed_in_process(args) -> dict:
    """The app server and the bare engine share one process, one engine object and one set of
    torch threads, so the only difference between the two numbers is the page."""
    from app.ui.blocks import build_demo, launch_kwargs
    from app.ui.settings import load_context

    ctx = load_context()
    if args.update_interval is not None:
        ctx.config = replace(ctx.config, update_interval_s=args.update_interval)
    demo = build_demo(ctx, demos={})
    _, url, _ = demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True,
                            **launch_kwargs(ctx.config))
    try:
        settings = dict(prompt=args.prompt, method=args.method, max_new_tokens=args.max_new_tokens, temperature=0.0)
        tree = replace(ctx.tree_defaults, method=args.method)   # what the page decodes these settings with
        print(f"tree: {tree}", flush=True)
        return app_vs_engine(url, ctx.engine, settings, tree, repeats=args.repeats, engine_thread=ctx.engine_thread)
    finally:
        demo.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("load", "fuzz", "stop", "speed", "flood", "burst", "records"))
    p.add_argument("--url", help="a running server on this machine (default: start one)")
    p.add_argument("--pid", type=int, help="the running server's process id, for its memory")
    p.add_argument("--visitors", type=int, default=8)
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--warmup-minutes", type=float, default=0.5)
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--method", default="dynamic")
    p.add_argument("--prompt", default="Write a short poem about the sea.")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sessions", type=int, default=200, help="flood: new sessions to open")
    p.add_argument("--addresses", type=int, default=1, help="flood, records: client addresses they come from")
    p.add_argument("--joins", type=int, default=40, help="burst: simultaneous joins")
    p.add_argument("--update-interval", type=float, default=None,
                   help="speed: seconds between page updates (default: the server's)")
    args = p.parse_args(argv)
    if args.visitors > 64 or args.minutes > 30 or args.examples > 5000 or args.sessions > 5000 or args.joins > 200:
        raise SystemExit("bounded: at most 64 visitors, 30 minutes, 5000 examples, 5000 sessions, 200 joins")

    if args.mode == "speed":   # needs the engine itself: the server runs in this process
        r = speed_in_process(args)
        print(f"{args.method}, {r['tokens']} tokens (tau {r['tau']:.2f}): engine {r['engine_tokens_per_s']:.1f} "
              f"tokens/s, through the app {r['app_tokens_per_s']:.1f} tokens/s; app/engine per pair "
              f"{', '.join(f'{x:.2f}' for x in r['ratios'])}; median {100 * r['ratio']:.0f}% (target >= 90%)")
        return 0
    with contextlib.ExitStack() as stack:
        url, pid = (check_loopback(args.url), args.pid) if args.url else stack.enter_context(spawned_server())
        if args.mode == "load":
            warm = run_visitors(url, args.visitors, args.warmup_minutes * 60, seed=1000,
                                max_new_tokens=args.max_new_tokens)
            before = rss_mb(pid) if pid else None
            peak = [before or 0.0]

            def tick():
                if pid:
                    peak[0] = max(peak[0], rss_mb(pid))

            t0 = time.monotonic()
            stats = run_visitors(url, args.visitors, args.minutes * 60, max_new_tokens=args.max_new_tokens,
                                 on_tick=tick)
            after = rss_mb(pid) if pid else None
            lat = np.array(stats["latency"]) if stats["latency"] else np.zeros(1)
            print(f"warm-up: {warm['ok']} ok, {warm['failed']} failed")
            print(f"{args.visitors} visitors x {(time.monotonic() - t0) / 60:.1f} min: {stats['ok']} ok, "
                  f"{stats['failed']} failed, {stats['hung']} hung; latency median {np.median(lat):.1f} s, "
                  f"p95 {np.percentile(lat, 95):.1f} s, max {lat.max():.1f} s")
            if pid:
                print(f"server RSS after warm-up {before:.0f} MiB, peak {peak[0]:.0f} MiB, after {after:.0f} MiB "
                      f"(growth {100 * (after - before) / before:+.1f}%)")
            for e in stats["errors"][:10]:
                print("  error:", e)
            return int(stats["failed"] > 0 or stats["hung"] > 0)
        if args.mode == "fuzz":
            stats = fuzz(url, args.examples)
            print(f"{stats['sent']} invalid requests: {stats['error_message']} answered with an error message, "
                  f"{len(stats['accepted'])} accepted (should be 0), {len(stats['server_errors'])} other failures; "
                  f"valid request afterwards ok: {stats['valid_after_ok']}")
            for m in sorted(stats["messages"].values()):
                print("  message:", m)
            for e in stats["server_errors"][:10] + [str(a) for a in stats["accepted"][:10]]:
                print("  problem:", e)
            return int(bool(stats["accepted"] or stats["server_errors"]) or not stats["valid_after_ok"])
        if args.mode == "stop":
            r = stop_latency(url, dict(prompt=args.prompt, method=args.method, max_new_tokens=200, temperature=0.0))
            print(f"Stop answered in {r['stop_call_s']:.2f} s ({r['stopped_status']}); worker free again "
                  f"(a 1-token request done) {r['worker_free_s']:.2f} s after Stop; next request ok: {r['next_ok']}")
            return int(not r["next_ok"])
        if args.mode == "flood":
            before = rss_mb(pid) if pid else None
            r = session_flood(url, args.sessions, addresses=args.addresses)
            memory = f"; server RSS {before:.0f} -> {rss_mb(pid):.0f} MiB" if pid else ""
            print(f"{r['sent']} new sessions from {args.addresses} address(es) in {r['seconds']:.1f} s: "
                  f"{r['accepted']} accepted, {r['refused']} refused {r['codes']}; visitors who kept their run: "
                  f"{r['victims_kept']}/{r['victims']}{memory}")
            return int(r["victims_kept"] < r["victims"])
        if args.mode == "records":
            before = rss_mb(pid) if pid else None
            r = trace_flood(url, args.sessions, args.addresses)
            memory = ""
            if pid:
                peak = rss_mb(pid)
                time.sleep(5)
                memory = f"; server RSS {before:.0f} -> {peak:.0f} MiB, {rss_mb(pid):.0f} MiB 5 s later"
            print(f"one crafted trace ({r['trace_bytes'] / 2**20:.1f} MB) loaded by {r['sessions']} new sessions of "
                  f"{args.addresses} address(es): {r['loaded']} loaded, {r['refused']} refused with a message, {len(r['other'])} other"
                  f"{memory}")
            for e in r["other"][:5]:
                print("  other:", e)
            return int(bool(r["other"]))
        if args.mode == "burst":
            r = burst(url, args.joins)
            print(f"{r['sent']} simultaneous joins while the worker was busy ({r['worker_busy_throughout']}): "
                  f"{r['accepted']} accepted, {r['refused']} refused (queue full), {r['other']} other")
            return int(r["other"] > 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
