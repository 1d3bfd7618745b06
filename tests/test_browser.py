"""A real browser (Debian chromium through Playwright) on the page: type, Generate, watch the
tree and the speedup appear, scrub the replay slider, Stop mid-generation and generate again,
download the trace and load it back. A screenshot is saved as a test artefact (not committed)."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

import pytest

from app.engine.engine import Engine
from app.ui.blocks import build_demo, launch_kwargs
from app.ui.settings import AppContext, ServerConfig

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
# Playwright's `expect` waits 5 s by default (page.set_default_timeout does not apply to it);
# on a loaded 2-core CI machine a Stop that waits for the running step can take longer.
EXPECT_TIMEOUT_MS = 60_000
ARTEFACTS = Path(os.environ.get("EAGLE_LENS_ARTEFACTS", Path(__file__).resolve().parents[1] / "out"))


@contextlib.contextmanager
def _serve(ctx: AppContext):
    """The app for ``ctx`` on a free loopback port; yields its URL, closed on exit."""
    demo = build_demo(ctx, demos={})
    _, local_url, _ = demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True,
                                  **launch_kwargs(ctx.config))
    try:
        yield local_url
    finally:
        demo.close()


def _chromium(playwright):
    """Debian's chromium, headless, with the flags this sandbox needs (no Playwright download)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=[
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])


@pytest.fixture(scope="module")
def url(tiny):
    target, head = tiny
    config = ServerConfig(max_new_tokens=200, update_interval_s=0.25)   # the tiny model is ~100x faster than a real one
    # autotune's report for the tab "Tree size for this machine": a synthetic one (CPU-like cost
    # curve, a hand-made calibration); load_context's real choice is tested in test_ui_handlers
    from app.engine.autotune import choose_from
    from tests.test_autotune import CPU, big_tree_calibration

    choice = choose_from(CPU, big_tree_calibration()).to_dict()
    with _serve(AppContext(Engine(target, head), config, "tiny test model", tree_choice=choice)) as local_url:
        yield local_url


def _wait_for_tree(page, title_part: str = "") -> str:
    """Wait until plotly has drawn more than 3 markers in the tree plot (plotly.js loads
    lazily) and its title contains ``title_part``; return the title."""
    page.wait_for_function(
        "([part]) => document.querySelectorAll('#tree-plot .point').length > 3 && "
        "(document.querySelector('#tree-plot .gtitle')?.textContent || '').includes(part)", arg=[title_part])
    return page.locator("#tree-plot .gtitle").text_content()


def _assert_run_still_shown(page, speedup_text: str) -> None:
    """The finished run is still on the page: same speedup text, a drawn tree, and no error
    badge on any of the run's outputs."""
    assert page.locator("#speedup").inner_text() == speedup_text
    assert page.locator("#tree-plot .point").count() > 3
    for output in ("#status", "#token-stream", "#tree-plot", "#speedup", "#race-plot", "#phases"):
        assert page.locator(f"{output} .error").count() == 0, output


@pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM), reason="chromium not installed")
def test_browser_generate_replay_stop_and_traces(url, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)

    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = _chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1800}, accept_downloads=True)
        page.set_default_timeout(120_000)
        page.goto(url)

        # A tree preset moves the knobs (the paper's 60/5/10), and back to the page's default.
        page.get_by_text("Tree knobs").click()
        default_total = page.locator("#total-tokens input[type=number]").input_value()
        assert default_total != "60"
        page.locator("#tree-preset input").click()
        page.get_by_role("option", name="EAGLE-2 paper, GPU (60 / 5 / 10)").click()
        expect(page.locator("#total-tokens input[type=number]")).to_have_value("60")
        expect(page.locator("#top-k input[type=number]")).to_have_value("10")
        # moved by hand, the knobs no longer hold that tree, and the menu says so (and back)
        page.locator("#total-tokens input[type=number]").fill("59")
        page.locator("#total-tokens input[type=number]").press("Enter")
        expect(page.locator("#tree-preset input")).to_have_value("custom (the knobs as you set them)")
        page.locator("#total-tokens input[type=number]").fill("60")
        page.locator("#total-tokens input[type=number]").press("Enter")
        expect(page.locator("#tree-preset input")).to_have_value("EAGLE-2 paper, GPU (60 / 5 / 10)")
        page.locator("#tree-preset input").click()
        page.get_by_role("option", name="the page's default tree").click()
        expect(page.locator("#total-tokens input[type=number]")).to_have_value(default_total)

        # A knob that does not shape the chosen method's tree is disabled, with a note saying why.
        page.locator("#method").get_by_text("chain", exact=True).click()
        expect(page.locator("#top-k input[type=number]")).to_be_disabled()
        expect(page.locator("#top-k")).to_contain_text("top_k applies to the dynamic method only")
        expect(page.locator("#tau-high input[type=number]")).to_be_disabled()
        expect(page.locator("#depth input[type=number]")).to_be_enabled()
        page.locator("#method").get_by_text("threshold", exact=True).click()
        expect(page.locator("#tau-high input[type=number]")).to_be_enabled()
        expect(page.locator("#tau-high")).not_to_contain_text("applies to")
        page.locator("#method").get_by_text("dynamic", exact=True).click()
        expect(page.locator("#top-k input[type=number]")).to_be_enabled()
        expect(page.locator("#tau-high")).to_contain_text("tau_high applies to the threshold method only")

        # Generate: tokens stream, the tree shows nodes, the speedup shows a number.
        page.locator("#prompt textarea").fill("w5 w17 w33 w90")
        page.locator("#max-new-tokens input[type=number]").fill("40")
        page.locator("#max-new-tokens input[type=number]").press("Enter")
        page.locator("#generate-btn").click()
        expect(page.locator("#token-stream .tok").first).to_be_visible()
        expect(page.locator("#speedup")).to_contain_text(re.compile(r"\d\.\d\d×"), timeout=240_000)
        last_title = _wait_for_tree(page)
        expect(page.locator("#token-stream .tok.draft").first).to_be_visible()
        page.screenshot(path=str(ARTEFACTS / "browser-after-generate.png"), full_page=True)

        # Refused clicks leave the run on screen as it was (no error state on the run's outputs,
        # which would blank the plots): a blank prompt gets its message under the prompt box,
        # Step with no paused run a message in a toast.
        speedup_text = page.locator("#speedup").inner_text()
        page.locator("#prompt textarea").fill("   ")
        page.locator("#generate-btn").click()
        expect(page.locator("#prompt")).to_contain_text("prompt must be a non-empty, non-blank string")
        page.locator("#step-btn").click()
        expect(page.locator("[data-testid=toast-body]")).to_contain_text("Nothing to step")
        _assert_run_still_shown(page, speedup_text)
        page.locator("#prompt textarea").fill("w5 w17 w33 w90")

        # Replay: move the slider to step 1 (step 0 is the prompt's prefill, which drafts no
        # tree) and the phase account and tree follow it.
        before = page.locator("#phases").inner_text()
        box = page.locator("#step-slider input[type=number]")
        box.fill("1")
        box.press("Enter")
        expect(page.locator("#phases")).to_contain_text("Step 1")
        assert page.locator("#phases").inner_text() != before
        assert _wait_for_tree(page, "step 1:") != last_title
        expect(page.locator("#token-stream .step.current")).to_have_count(1)

        # Why the default tree has its size: the cost curve and the candidates, drawn.
        page.get_by_role("tab", name="Tree size for this machine").click()
        expect(page.locator("#tree-size-text")).to_contain_text("Chosen here")
        page.wait_for_function("document.querySelectorAll('#tree-size-plot .point').length > 10")

        # Download the trace, load it back.
        page.get_by_role("tab", name="Traces").click()
        with page.expect_download() as info:
            page.locator("#trace-download").click()
        trace = tmp_path / "trace.json"
        info.value.save_as(trace)
        assert trace.stat().st_size > 100
        not_a_trace = tmp_path / "not-a-trace.json"
        not_a_trace.write_text('{"steps": []}')
        page.locator("#trace-upload input[type=file]").set_input_files(str(not_a_trace))
        expect(page.locator("[data-testid=toast-body]")).to_contain_text("not an EAGLE Lens trace")
        _assert_run_still_shown(page, speedup_text)
        page.locator("#trace-upload button[aria-label=Clear]").click()
        page.locator("#trace-upload input[type=file]").set_input_files(str(trace))
        expect(page.locator("#status")).to_contain_text("replaying uploaded trace")

        # Stop mid-generation, then generate again.
        page.locator("#max-new-tokens input[type=number]").fill("200")
        page.locator("#max-new-tokens input[type=number]").press("Enter")
        page.locator("#generate-btn").click()
        expect(page.locator("#status")).to_contain_text("decoding with", timeout=240_000)
        page.locator("#stop-btn").click()
        expect(page.locator("#status")).to_contain_text("stopped after")
        page.locator("#max-new-tokens input[type=number]").fill("12")
        page.locator("#max-new-tokens input[type=number]").press("Enter")
        page.locator("#generate-btn").click()
        expect(page.locator("#status")).to_contain_text("done", timeout=240_000)
        page.screenshot(path=str(ARTEFACTS / "browser-final.png"), full_page=True)
        browser.close()


class _PacedEngine(Engine):
    """The tiny engine, paced at 5 steps/s (slower than the embedded model on a CPU), so a run
    lasts long enough for a visitor to leave in the middle of it."""

    def __init__(self, target, head):
        super().__init__(target, head)
        self.runs = []          # per run: [steps yielded, closed early?]

    def generate(self, *args, **kwargs):
        import time

        inner = super().generate(*args, **kwargs)
        record = [0, False]
        self.runs.append(record)

        def paced():
            try:
                for event in inner:
                    time.sleep(0.2)
                    record[0] += 1
                    yield event
            finally:
                record[1] = inner.gi_frame is not None   # still suspended = stopped mid-run
                inner.close()

        return paced()


@pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM), reason="chromium not installed")
def test_closing_the_tab_stops_the_run(tiny):
    """A visitor who closes the tab mid-generation must not keep the model busy: the server
    notices the closed connection, cancels the event and the engine stops within a few steps."""
    import time

    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)

    target, head = tiny
    engine = _PacedEngine(target, head)
    config = ServerConfig(max_new_tokens=200)
    ctx = AppContext(engine, config, "tiny test model")
    with _serve(ctx) as local_url:
        with sync_playwright() as p:
            browser = _chromium(p)
            page = browser.new_page()
            page.set_default_timeout(120_000)
            page.goto(local_url)
            page.locator("#prompt textarea").fill("w5 w17 w33 w90")
            page.locator("#max-new-tokens input[type=number]").fill("200")
            page.locator("#max-new-tokens input[type=number]").press("Enter")
            page.locator("#generate-btn").click()
            expect(page.locator("#status")).to_contain_text("decoding with")
            page.close()
            browser.close()

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not ctx.engine_thread.idle:
            time.sleep(0.1)
        time.sleep(1.0)        # a race run, if one wrongly started, would have begun by now
        # The run going on when the tab closed (EAGLE, or on a slow browser already the vanilla
        # race) was stopped early, and nothing ran after it.
        steps, stopped_early = engine.runs[-1]
        assert stopped_early and steps < 200 and len(engine.runs) <= 2, engine.runs
        assert ctx.engine_thread.idle


def _hostile_trace(tiny, port: int) -> dict:
    """A valid trace of a real tiny run whose every free text carries markup aimed at the
    address ``127.0.0.1:port``: HTML tags, a Markdown link and image, a bare URL, a script."""
    from app.engine.config import SamplingConfig, TreeConfig
    from app.ui import traces

    target, head = tiny
    engine = Engine(target, head)
    *steps, summary = engine.generate(prompt_ids=[5, 17, 33, 90], tree=TreeConfig(method="dynamic", depth=3, top_k=4,
                                                                                 total_tokens=8),
                                      sampling=SamplingConfig(), max_new_tokens=12)
    *vsteps, vsummary = engine.generate(prompt_ids=[5, 17, 33, 90], tree=TreeConfig(method="vanilla"),
                                        sampling=SamplingConfig(), max_new_tokens=12)
    base = f"http://127.0.0.1:{port}"
    markup = (f'<img src="{base}/img.png"><a href="{base}/a">a</a>[link]({base}/md) ![i]({base}/mdimg.png) '
              f'{base}/bare <script>fetch("{base}/script")</script>')
    data = traces.trace_dict(dict(prompt=markup, method="dynamic", temperature=0.0, max_new_tokens=12),
                             {"target": markup[:200], "head": f"[click]({base}/head)", "dtype": markup[:200],
                              "<img src=x>": f"<img src={base}/key.png>"},
                             steps, summary, vsteps, vsummary)
    vanilla_summary = data["vanilla"][-1]
    vanilla_summary["token_ids"][1] += 1    # "outputs differ": the note that names the trace's dtype
    for record in data["records"][:-1]:
        record["text"] = markup
        if record["tree"]:
            record["tree"]["texts"] = [markup[:200]] * len(record["tree"]["texts"])
    data["records"][-1]["text"] = markup
    return data


@pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM), reason="chromium not installed")
def test_markup_in_an_uploaded_trace_stays_text(url, tiny, tmp_path):
    """A stranger's trace is shown, never rendered: its markup creates no element on the page and
    the browser makes no request to the address it names (a listening server counts them too).
    The texts are still there, verbatim."""
    import http.server
    import json
    import socketserver
    import threading

    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    with socketserver.TCPServer(("127.0.0.1", 0), Handler) as lure:
        port = lure.server_address[1]
        threading.Thread(target=lure.serve_forever, daemon=True).start()
        trace = tmp_path / "hostile.json"
        trace.write_text(json.dumps(_hostile_trace(tiny, port)))
        broken = tmp_path / "hostile-keys.json"     # refused: the message names its stray key
        broken.write_text(json.dumps({"format": "eagle-lens-trace", "version": 2, "settings": {}, "model": {},
                                      "records": [], "vanilla": None,
                                      f'<img src="http://127.0.0.1:{port}/toast.png">': 1}))
        with sync_playwright() as p:
            browser = _chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.set_default_timeout(120_000)
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url) if f":{port}" in r.url else None)
            page.goto(url)
            page.get_by_role("tab", name="Traces").click()
            page.locator("#trace-upload input[type=file]").set_input_files(str(broken))
            expect(page.locator("[data-testid=toast-body]")).to_contain_text("unexpected")
            expect(page.locator("[data-testid=toast-body]")).to_contain_text("<img")
            page.locator("#trace-upload button[aria-label=Clear]").click()
            page.locator("#trace-upload input[type=file]").set_input_files(str(trace))
            expect(page.locator("#status")).to_contain_text("replaying")
            expect(page.locator("#speedup")).to_contain_text("differ from token 1")
            _wait_for_tree(page)
            box = page.locator("#tree-plot .point").nth(1).bounding_box()   # plotly's hover label: the node's text
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            expect(page.locator("#tree-plot .hoverlayer")).to_contain_text("status")
            # the markup made nothing: no element, no link, no request ...
            made = page.evaluate("""(port) => [...document.querySelectorAll('img, a, script, iframe, image')]
                .map(e => e.getAttribute('src') || e.getAttribute('href') || e.getAttribute('xlink:href') || '')
                .filter(u => u.includes(':' + port) || u === 'x')""", port)
            assert made == [] and requests == [], (made, requests)
            # ... and is on the page as text
            assert "<img" in page.locator("#status").inner_text()
            assert "[link](" in page.locator("#speedup").inner_text()
            assert "<script>" in page.locator("#token-stream").inner_text()
            browser.close()
        assert requests == [] and hits == [], (requests, hits)
