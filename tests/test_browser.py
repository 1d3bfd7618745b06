"""A real browser (Debian chromium through Playwright) on the page: type, Generate, watch the
tree and the speedup appear, scrub the replay slider, Stop mid-generation and generate again,
download the trace and load it back; the classroom screen at 1280x720 (tree, slider and step
account in one viewport), a demo restoring its settings, the mask and KV views agreeing with
the tree, the A/B comparison, the guided tour. One server for the module (the tiny model and
the shipped demos). Screenshots are saved as test artefacts (not committed)."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

import pytest

from app.engine.engine import Engine
from app.ui import traces
from app.ui.blocks import build_demo, demo_traces, launch_kwargs
from app.ui.explain import TOUR_STEPS
from app.ui.settings import AppContext, ServerConfig
from tests.tiny import PacedEngine

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
# Playwright's `expect` waits 5 s by default (page.set_default_timeout does not apply to it);
# on a loaded 2-core CI machine a Stop that waits for the running step can take longer.
EXPECT_TIMEOUT_MS = 60_000
ARTEFACTS = Path(os.environ.get("EAGLE_LENS_ARTEFACTS", Path(__file__).resolve().parents[1] / "out"))


NO_TOUR = "localStorage.setItem('eagle-lens-tour-done', '1')"   # a returning visitor: no guided tour


@contextlib.contextmanager
def _serve(ctx: AppContext, demos: dict | None = None):
    """The app for ``ctx`` on a free loopback port; yields its URL, closed on exit."""
    demo = build_demo(ctx, demos=demos or {})
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
    # paced at 50 steps/s: on the fast forward the tiny model could finish 200 tokens before a
    # click on Stop arrived, so whether "stopped after" showed depended on the machine's load
    with _serve(AppContext(PacedEngine(target, head, pace_s=0.02), config, "tiny test model", tree_choice=choice),
                demos=demo_traces()) as local_url:
        yield local_url


def _new_page(browser, errors: list, tour: bool = False, **kwargs):
    """A page that records every JavaScript error (``pageerror``) in ``errors``; without
    ``tour`` the visitor has seen the guided tour before."""
    page = browser.new_page(**kwargs)
    page.set_default_timeout(120_000)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    if not tour:
        page.add_init_script(NO_TOUR)
    return page


def _open_settings(page) -> None:
    """Open the side panel with the knobs (a closed one is slid off the screen, not hidden)."""
    if page.locator("#settings-panel.open").count() == 0:
        page.locator("#settings-btn").click()
    page.wait_for_function("(() => { const b = document.querySelector('#method')?.getBoundingClientRect();"
                           " return b && b.left >= 0; })")


def _type_tree_knob(page, knob: str, value: str, key: str = "Enter") -> None:
    """Type ``value`` into a tree knob's box, and wait until the page holds it: the preset
    menu follows a knob moved by hand (``name_preset``) from the page's state, not from the
    box. Right after its accordion opens, Gradio can still re-create a box, and text typed
    into the old one is lost (the run then went ahead with the old value); so type again."""
    from playwright.sync_api import expect

    field = page.locator(f"#{knob} input[type=number]")
    menu = page.locator("#tree-preset input")
    for _ in range(5):
        before = menu.input_value()
        field.fill(value)
        field.press(key)
        try:
            # the menu moves off the entry it named (every test value here leaves it)
            expect(menu).not_to_have_value(before, timeout=3000)
            expect(field).to_have_value(value, timeout=1000)
            return
        except AssertionError:
            continue
    raise AssertionError(f"{knob}: the page never took {value!r}")


def _close_settings(page) -> None:
    if page.locator("#settings-panel.open").count():
        page.locator("#settings-panel button[aria-label='Toggle Sidebar']").click()
    page.wait_for_function("!document.querySelector('#settings-panel.open')")


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
        errors: list = []
        page = _new_page(browser, errors, viewport={"width": 1400, "height": 1800}, accept_downloads=True)
        page.goto(url)
        _wait_for_tree(page)        # the first demo is on screen (and in the knobs)

        # A tree preset moves the knobs (the paper's 60/5/10), and back to the page's default.
        _open_settings(page)
        page.get_by_text("Tree knobs").click()
        assert page.locator("#total-tokens input[type=number]").input_value() != "60"
        page.locator("#tree-preset input").click()
        page.get_by_role("option", name="EAGLE-2 paper, GPU (60 / 5 / 10)").click()
        expect(page.locator("#total-tokens input[type=number]")).to_have_value("60")
        expect(page.locator("#top-k input[type=number]")).to_have_value("10")
        # moved by hand, the knobs no longer hold that tree, and the menu says so (and back)
        _type_tree_knob(page, "total-tokens", "59")
        expect(page.locator("#tree-preset input")).to_have_value("custom (the knobs as you set them)")
        _type_tree_knob(page, "total-tokens", "60")
        expect(page.locator("#tree-preset input")).to_have_value("EAGLE-2 paper, GPU (60 / 5 / 10)")
        page.locator("#tree-preset input").click()
        page.get_by_role("option", name="the page's default tree").click()
        expect(page.locator("#total-tokens input[type=number]")).to_have_value("24")   # the tiny engine's default

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
        expect(page.locator("#status")).to_contain_text("done", timeout=240_000)   # the run (and its race) ended
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
        # and it stays: the run's own last update arrives after Stop's reply, and says the same
        page.wait_for_timeout(1500)
        expect(page.locator("#status")).to_contain_text("stopped after", timeout=1)
        # what was produced stays on screen: the text so far and the last step's tree
        expect(page.locator("#token-stream .tok").first).to_be_visible()
        _wait_for_tree(page)
        page.locator("#max-new-tokens input[type=number]").fill("12")
        page.locator("#max-new-tokens input[type=number]").press("Enter")
        page.locator("#generate-btn").click()
        expect(page.locator("#status")).to_contain_text("done", timeout=240_000)
        page.screenshot(path=str(ARTEFACTS / "browser-final.png"), full_page=True)
        browser.close()
    assert errors == []


FIGURE_JS = """(sel) => { const gd = document.querySelector(sel + ' .js-plotly-plot');
    return gd && gd.data ? JSON.parse(JSON.stringify(gd.data)) : null; }"""


def _figure(page, selector: str) -> list[dict]:
    """The plotly traces drawn in ``selector`` on the page, once drawn."""
    page.wait_for_function("(sel) => { const gd = document.querySelector(sel + ' .js-plotly-plot');"
                           " return gd && gd.data && gd.data.length > 0; }", arg=selector)
    return page.evaluate(FIGURE_JS, selector)


def _first_point(page, trace_name: str) -> dict:
    """Where on the page the first point of the tree plot's trace ``trace_name`` is drawn: {x, y}."""
    return page.evaluate("""(name) => { const gd = document.querySelector('#tree-plot .js-plotly-plot');
        const d = gd.data.find(t => t.name === name); const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        const r = gd.getBoundingClientRect();
        return {x: r.left + xa._offset + xa.l2p(d.x[0]), y: r.top + ya._offset + ya.l2p(d.y[0])}; }""", trace_name)


def _tree_nodes(page) -> list[dict]:
    """The draft nodes the tree plot drew: {node, depth, status, colour} (read from the page)."""
    nodes = next(t for t in _figure(page, "#tree-plot") if t.get("name") == "nodes")
    return [{"node": n, "depth": x, "status": h.split("status: ")[1].split("<")[0], "colour": c}
            for n, x, h, c in zip(nodes["customdata"], nodes["x"], nodes["hovertext"], nodes["marker"]["color"])]


OVERLAP_JS = """(sel) => { const card = document.querySelector('#lens-tour'), t = document.querySelector(sel);
    if (!card || !t) return null;
    const c = card.getBoundingClientRect(), r = t.getBoundingClientRect();
    const top = Math.max(r.top, 0), bottom = Math.min(r.bottom, window.innerHeight);   // what is on screen of it
    const w = Math.max(0, Math.min(c.right, r.right) - Math.max(c.left, r.left));
    const h = Math.max(0, Math.min(c.bottom, bottom) - Math.max(c.top, top));
    return {area: w * h, width: r.width, height: r.height}; }"""


def _assert_tour_uncovered(page, step: int) -> None:
    """Tour step ``step``: its target is drawn (its tab open) and the card covers none of it."""
    selector = TOUR_STEPS[step][0]
    page.wait_for_function("(sel) => { const t = document.querySelector(sel);"
                           " return t && t.getBoundingClientRect().height > 0 && "
                           "t.classList.contains('lens-tour-target'); }", arg=selector)
    page.wait_for_timeout(200)
    seen = page.evaluate(OVERLAP_JS, selector)
    assert seen and seen["area"] == 0, (selector, seen)


WORDS_BROKEN_JS = """(sel) => { const broken = [];
    for (const cell of document.querySelectorAll(sel)) {
      const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
      for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const re = /[A-Za-z0-9.×]{4,}/g; let m;
        while ((m = re.exec(node.textContent))) {
          const range = document.createRange(); range.setStart(node, m.index); range.setEnd(node, m.index + m[0].length);
          const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
          if (tops.size > 1) broken.push(m[0]);
        }
      }
    }
    return broken; }"""


# both plots' titles name the same step ("step N: ...")
STEP_SHOWN_JS = """([a, b]) => { const step = sel => ((document.querySelector(sel + ' .gtitle') || {}).textContent
                                                     || '').match(/^step (\\d+):/);
    const x = step(a), y = step(b); return x !== null && y !== null && x[1] === y[1]; }"""


def _check_mask_and_kv(page, label: str) -> None:
    """The verify views of the step shown agree with its tree, as drawn on the page: the mask's
    lit cells among the root and node columns are the sum over nodes of (depth + 1) (each node
    sees the root, its ancestors and itself), and the KV view keeps 1 + the accepted path's
    length slots (the root and the accepted nodes)."""
    page.get_by_role("tab", name="Attention mask").click()
    _figure(page, "#mask-plot")
    # the two plots are one update of the page, but drawn one after the other: on a busy
    # machine the tree could still show an earlier step of a live run for a moment
    page.wait_for_function(STEP_SHOWN_JS, arg=["#tree-plot", "#mask-plot"])
    nodes = _tree_nodes(page)
    depth = {n["node"]: n["depth"] for n in nodes}
    mask = _figure(page, "#mask-plot")[0]
    rows = mask["meta"]["rows"][1:]
    assert set(rows) == set(depth), label               # a tree of <= 24 nodes: every node has a row
    lit = sum(1 for row in mask["z"][1:] for kind in row[3:] if kind != 0)   # 3 context slots first
    assert lit == sum(depth[n] + 1 for n in rows), label
    page.get_by_role("tab", name="KV cache").click()
    kv = _figure(page, "#kv-plot")
    kept = sum(len(t["x"]) for t in kv if t.get("name") in ("root (after)", "kept (after)"))
    assert kept == 1 + sum(n["status"] == "accepted" for n in nodes), label
    page.get_by_role("tab", name="What happened").click()


@pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM), reason="chromium not installed")
def test_classroom_screen_demo_settings_views_and_ab(url):
    """A first visit at 1280x720: the guided tour; the first demo's tree, step slider and step
    account on one screen; its prompt and knobs in the controls; the mask and KV views agree
    with the tree (demo and live run); hovering a node lights its row in the mask; rejected
    nodes keep their confidence colour; a pinned run compared with the next one."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    demos = demo_traces()
    first = next(iter(demos))
    trace = traces.parse_trace(Path(demos[first]).read_bytes())
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = _chromium(p)
        errors: list = []
        page = _new_page(browser, errors, tour=True, viewport={"width": 1280, "height": 720})
        page.goto(url)

        # The guided tour, on a first visit only: Next moves on (and opens the tab it explains),
        # Skip ends it, and a reload does not show it again.
        tour = page.locator("#lens-tour")
        expect(tour).to_contain_text("Draft")
        _assert_tour_uncovered(page, 0)
        page.locator("#lens-tour .lens-tour-next").click()
        expect(tour).to_contain_text("Verify in one forward")
        expect(page.locator("#mask-plot")).to_be_visible()
        for step in range(1, len(TOUR_STEPS)):        # the card never covers what it points at
            _assert_tour_uncovered(page, step)
            if step + 1 < len(TOUR_STEPS):
                page.locator("#lens-tour .lens-tour-next").click()
        page.locator("#lens-tour .lens-tour-skip").click()
        expect(tour).to_have_count(0)
        page.reload()
        _wait_for_tree(page)
        page.wait_for_timeout(1500)         # the tour would have started 0.3 s after the tree
        expect(tour).to_have_count(0)

        # One screen: the tree, the step slider and the step account, with nothing scrolled.
        page.evaluate("window.scrollTo(0, 0)")
        expect(page.locator("#status")).to_contain_text("Speedup")       # the headline, on the stage
        for selector in ("#tree-plot", "#step-slider", "#phases", "#status"):
            box = page.locator(selector).bounding_box()
            assert box["y"] >= 0 and box["y"] + box["height"] <= 720 and box["x"] + box["width"] <= 1280, \
                (selector, box)
        page.screenshot(path=str(ARTEFACTS / "browser-classroom.png"))

        # The demo's prompt and max_new_tokens are in the controls, but its tree is not: the
        # first Generate runs the page's tree (the tiny engine's 24 nodes), not the demo's 16.
        # A knob the method ignores is disabled.
        assert trace.settings["total_tokens"] != 24
        expect(page.locator("#prompt textarea")).to_have_value(trace.settings["prompt"])
        _open_settings(page)
        expect(page.locator("#method input[value=dynamic]")).to_be_checked()
        expect(page.locator("#max-new-tokens input[type=number]")).to_have_value(str(trace.settings["max_new_tokens"]))
        page.get_by_text("Tree knobs").click()
        expect(page.locator("#total-tokens input[type=number]")).to_have_value("24")
        expect(page.locator("#tree-preset input")).to_have_value("the page's default tree")
        expect(page.locator("#tau-high input[type=number]")).to_be_disabled()
        _close_settings(page)

        # The step shown is an instructive one; every node, rejected ones too, is filled with
        # its own q on the log scale (the path product left deep nodes one dark colour).
        from app.viz.tree import q_colour

        index = int(page.locator("#step-slider input[type=number]").input_value())
        step = trace.steps[index]
        nodes = _tree_nodes(page)
        rejected = [n for n in nodes if n["status"] == "rejected"]
        assert rejected, "the demo opens on a step with a rejection"
        for n in nodes:
            assert n["colour"] == pytest.approx(q_colour(step.tree.q[n["node"]])), n
        _check_mask_and_kv(page, "demo")

        # Hovering a tree node lights its row and column in the mask.
        page.get_by_role("tab", name="Attention mask").click()
        _figure(page, "#mask-plot")
        _hover_lights_the_mask(page, "nodes")
        page.screenshot(path=str(ARTEFACTS / "browser-mask-hover.png"))
        page.mouse.move(5, 5)
        page.get_by_role("tab", name="What happened").click()

        # Autoplay moves the slider on by itself, and pauses.
        page.locator("#play-btn").click()
        expect(page.locator("#step-slider input[type=number]")).not_to_have_value(str(index))
        page.locator("#play-btn").click()
        expect(page.locator("#play-btn")).to_have_text("▶ Play")

        # A/B: pin the demo as A, load another demo (B), compare.
        a_headline = re.search(r"Speedup ([\d.]+×)", page.locator("#speedup").inner_text()).group(1)
        page.locator("#pin-btn").click()
        page.get_by_role("tab", name="Compare A/B").click()
        expect(page.locator("#ab-caption")).to_contain_text("Pinned A:")
        other = list(demos)[-1]
        page.get_by_role("tab", name="Traces").click()
        page.locator("#demo-choice input").click()
        page.get_by_role("option", name=other, exact=True).click()
        page.locator("#demo-btn").click()
        expect(page.locator("#status")).to_contain_text(f"replaying {other}")
        # the Load-demo button restores every knob, the tree's too
        other_settings = traces.parse_trace(Path(demos[other]).read_bytes()).settings
        _open_settings(page)
        expect(page.locator("#total-tokens input[type=number]")).to_have_value(str(other_settings["total_tokens"]))
        expect(page.locator("#depth input[type=number]")).to_have_value(str(other_settings["depth"]))
        _close_settings(page)
        page.get_by_role("tab", name="Compare A/B").click()
        page.wait_for_function("document.querySelectorAll('#ab-plot .js-plotly-plot').length > 0")
        names = {t.get("name") for t in _figure(page, "#ab-plot") if t.get("name")}
        assert len(names) == 2 and {n[:2] for n in names} == {"A:", "B:"}, names
        trees = _figure(page, "#ab-trees-plot")
        assert sum(t.get("name") == "nodes" for t in trees) >= 1
        expect(page.locator("#ab-caption")).to_contain_text("tokens/s")
        # each run against its own vanilla: A's ratio is A's own headline, B's is B's
        b_headline = re.search(r"Speedup ([\d.]+×)", page.locator("#speedup").inner_text()).group(1)
        caption = page.locator("#ab-caption").inner_text()
        assert f"{a_headline} (" in caption and f"{b_headline} (" in caption and "own vanilla" in caption, caption
        page.locator("#ab-plot").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTEFACTS / "browser-ab.png"), full_page=True)

        # A live run: the same agreement between the tree, the mask and the KV views.
        page.locator("#prompt textarea").fill("w5 w17 w33 w90")
        _open_settings(page)
        page.locator("#method").get_by_text("dynamic", exact=True).click()
        for knob, value in (("depth", "4"), ("top-k", "4"), ("total-tokens", "16"), ("max-new-tokens", "30")):
            page.locator(f"#{knob} input[type=number]").fill(value)
            page.locator(f"#{knob} input[type=number]").press("Enter")
        page.locator("#generate-btn").click()
        expect(page.locator("#speedup")).to_contain_text(re.compile(r"\d\.\d\d×"), timeout=240_000)
        # the run has ended (the speedup can show while it still streams: the tree and the mask
        # would then be read from different steps)
        expect(page.locator("#status")).to_contain_text("done", timeout=240_000)
        _close_settings(page)
        page.evaluate("window.scrollTo(0, 0)")
        _wait_for_tree(page)
        _check_mask_and_kv(page, "live run")
        browser.close()
    assert errors == []


@pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM), reason="chromium not installed")
def test_closing_the_tab_stops_the_run(tiny):
    """A visitor who closes the tab mid-generation must not keep the model busy: the server
    notices the closed connection, cancels the event and the engine stops within a few steps."""
    import time

    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)

    target, head = tiny
    engine = PacedEngine(target, head)
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
    # "outputs differ" (the note that names the trace's dtype): vanilla's second token changed
    # in the step that emitted it and in the summary alike (a summary must sum up its steps)
    vanilla = data["vanilla"]
    record, i = [(r, i) for r in vanilla[:-1] for i in range(len(r["new_tokens"]))][1]
    record["new_tokens"][i] += 1
    vanilla[-1]["token_ids"][1] += 1
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
        # refused: the message names its stray key (its only fault: a trace with other faults
        # would be refused for its first, in the schema's order, and name the key nowhere)
        broken = tmp_path / "hostile-keys.json"
        broken.write_text(json.dumps({**_hostile_trace(tiny, port), f'<img src="http://127.0.0.1:{port}/t.png">': 1}))
        with sync_playwright() as p:
            browser = _chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            page.set_default_timeout(120_000)
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url) if f":{port}" in r.url else None)
            page.goto(url)
            page.get_by_role("tab", name="Traces").click()
            page.locator("#trace-upload input[type=file]").set_input_files(str(broken))
            expect(page.locator("[data-testid=toast-body]")).to_contain_text("not permitted")
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


@pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM), reason="chromium not installed")
def test_copied_nodes_are_drawn_apart_and_light_the_mask(url, tiny, tmp_path):
    """A trace whose trees carry a prompt-lookup branch: its copied nodes are drawn orange, in a
    trace of their own with a hover that says so, and hovering one lights its row in the
    attention mask as hovering one of the head's nodes does."""
    import json

    from playwright.sync_api import expect, sync_playwright

    from app.engine.config import TreeConfig
    from tests.tiny import random_head

    from app.viz.style import LOOKUP_FILL

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    target, _ = tiny
    engine = Engine(target, random_head(target))     # an untrained head: the branch brings nodes of its own
    start = [5, 17, 33, 90, 4, 5, 17, 33]
    loop = start + [t for t in engine.generate(prompt_ids=start, tree=TreeConfig(method="vanilla"), max_new_tokens=24)
                    ][-1].token_ids                   # ends in the target's own greedy loop: n-grams to copy
    *steps, summary = engine.generate(prompt_ids=loop, tree=TreeConfig(depth=1, top_k=1, total_tokens=1, lookup=3),
                                      max_new_tokens=12)
    assert all("pld" in (s.tree.source or []) for s in steps[1:])   # whichever step the page opens on has some
    trace = tmp_path / "copied.json"
    trace.write_text(json.dumps(traces.trace_dict(dict(prompt="a loop", method="dynamic", temperature=0.0,
                                                       max_new_tokens=12), {"target": "tiny"}, steps, summary)))
    with sync_playwright() as p:
        browser = _chromium(p)
        errors: list = []
        page = _new_page(browser, errors, viewport={"width": 1400, "height": 1200})
        page.goto(url)
        page.get_by_role("tab", name="Traces").click()
        page.locator("#trace-upload input[type=file]").set_input_files(str(trace))
        expect(page.locator("#status")).to_contain_text("replaying")
        page.get_by_role("tab", name="Attention mask").click()
        _figure(page, "#mask-plot")
        page.wait_for_function("""() => { const gd = document.querySelector('#tree-plot .js-plotly-plot');
            return gd && gd.data && gd.data.some(t => t.name === 'copied nodes'); }""")
        copied = next(t for t in _figure(page, "#tree-plot") if t.get("name") == "copied nodes")
        assert copied["customdata"] and set(copied["marker"]["color"]) == {LOOKUP_FILL}
        assert all("copied by prompt lookup" in h for h in copied["hovertext"])
        _hover_lights_the_mask(page, "copied nodes")
        assert errors == [], errors
        browser.close()


@pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM), reason="chromium not installed")
def test_compare_methods_view(url):
    """The tab *Compare methods*: the server's methods offered (no Medusa without heads), the
    default choice run on the prompt, a tree per drafting method, a race line per method, every
    output equal to vanilla's, and the literature table with this machine's ratios beside it."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with sync_playwright() as p:
        browser = _chromium(p)
        errors: list = []
        page = _new_page(browser, errors, viewport={"width": 1400, "height": 1600})
        page.goto(url)
        page.get_by_role("tab", name="Compare methods").click()
        boxes = page.locator("#compare-methods input[type=checkbox]")
        expect(boxes).to_have_count(5)                  # vanilla, pld, lookahead, static, dynamic: no Medusa heads
        assert [boxes.nth(i).is_checked() for i in range(5)] == [True, True, False, False, True]
        page.locator("#compare-methods label", has_text="lookahead").click()     # four methods now
        page.locator("#prompt textarea").fill("w5 w17 w33 w90 w5 w17 w33")
        page.locator("#compare-methods-btn").click()
        expect(page.locator("#methods-status")).to_contain_text("done: 4 methods", timeout=120_000)
        table = page.locator("#methods-table table")
        expect(table.locator("tbody tr")).to_have_count(4)
        assert table.locator("tbody tr td:last-child").all_inner_texts().count("yes") == 3
        page.wait_for_function("document.querySelectorAll('#methods-trees-plot .point').length > 3")
        titles = page.evaluate("[...document.querySelectorAll('#methods-trees-plot .annotation-text')]"
                               ".map(e => e.textContent)")
        assert sum("step" in t for t in titles) == 3, titles
        page.wait_for_function("document.querySelectorAll('#methods-race-plot .scatterlayer .trace').length == 4")
        expect(page.locator("#methods-literature")).to_contain_text("Spec-Bench")
        expect(page.locator("#methods-literature")).to_contain_text("not run")
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTEFACTS / "compare-methods.png"), full_page=True)
        assert errors == []
        browser.close()


def _hover_lights_the_mask(page, trace: str) -> None:
    """Hover the first point of the tree's ``trace``: its row and column light up in the mask
    (two bands). The page hooks a newly drawn tree every 0.5 s (static/app.js), later on a
    busy machine, and a hover before the hook shows nothing; so hover again until it does."""
    from playwright.sync_api import expect

    bands = page.locator("#mask-plot .lens-mask-band")
    for _ in range(40):
        where = _first_point(page, trace)
        page.mouse.move(5, 5)
        page.mouse.move(where["x"], where["y"])
        try:
            expect(bands).to_have_count(2, timeout=500)
            return
        except AssertionError:
            continue
    expect(bands).to_have_count(2)


def _title_unclipped(page, selector: str) -> None:
    """The figure's title is inside its plot's box and under no toolbar (shown while hovered)."""
    box = page.locator(selector).bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + min(box["height"] / 2, 200))
    page.wait_for_timeout(300)
    seen = page.evaluate("""(sel) => { const plot = document.querySelector(sel);
        const title = plot.querySelector('.gtitle'); if (!title) return null;
        const t = title.getBoundingClientRect(), p = plot.getBoundingClientRect();
        const bars = [...plot.querySelectorAll('.modebar')]
            .filter(m => getComputedStyle(m).visibility !== 'hidden' && getComputedStyle(m).opacity !== '0')
            .map(m => m.getBoundingClientRect()).filter(m => m.width > 0);
        const under = bars.some(m => m.left < t.right && t.left < m.right && m.top < t.bottom && t.top < m.bottom);
        return {inside: t.top >= p.top - 1 && t.left >= p.left - 1 && t.right <= p.right + 1, under}; }""", selector)
    assert seen and seen["inside"] and not seen["under"], (selector, seen)


@pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM), reason="chromium not installed")
def test_phone_view(url):
    """A visitor on a phone (390x844): every tour step reaches what it names (no tab hidden
    behind the overflow menu), "(why)" opens its tab, wide tables scroll in their own box
    instead of breaking words, the tree's title is not under the chart toolbar, and after
    Generate the answer is on screen."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with sync_playwright() as p:
        browser = _chromium(p)
        errors: list = []
        page = _new_page(browser, errors, tour=True, viewport={"width": 390, "height": 844})
        page.goto(url)
        tour = page.locator("#lens-tour")
        expect(tour).to_contain_text("Draft")
        for step, (selector, tab, title, _) in enumerate(TOUR_STEPS):
            expect(tour).to_contain_text(title)
            if tab:
                expect(page.get_by_role("tab", name=tab, exact=True)).to_have_attribute("aria-selected", "true")
            page.wait_for_function("(sel) => { const t = document.querySelector(sel);"
                                   " return t && t.getBoundingClientRect().height > 0; }", arg=selector)
            page.locator("#lens-tour .lens-tour-next").click()
        expect(tour).to_have_count(0)
        # the step tabs fit: none behind the overflow menu
        expect(page.locator("#step-tabs [role=tab]")).to_have_count(3)
        _wait_for_tree(page)
        _title_unclipped(page, "#tree-plot")

        # "(why)" opens the tab it names, though that tab sits in the overflow menu
        page.evaluate("window.scrollTo(0, 0)")
        page.locator("#header a[href='#tree-size']").click()
        expect(page.locator("#tree-size-text")).to_be_visible()
        expect(page.locator("#tree-size-text")).to_be_in_viewport()

        # the literature table scrolls in its own box, no word broken across lines
        page.evaluate("""() => [...document.querySelectorAll('.overflow-dropdown button, [role=tab]')]
            .find(b => b.textContent.trim() === 'Compare methods').click()""")
        table = page.locator("#methods-literature table")
        expect(table).to_be_visible()
        box = table.bounding_box()
        assert box["width"] <= 390 and box["height"] < 1200, box
        assert page.evaluate(WORDS_BROKEN_JS, "#methods-literature td, #methods-literature th") == []

        # after Generate the answer streams where the visitor looks
        page.evaluate("window.scrollTo(0, 0)")
        page.locator("#prompt textarea").fill("w5 w17 w33 w90")
        page.locator("#generate-btn").click()
        expect(page.locator("#token-stream .tok").first).to_be_visible()
        page.wait_for_timeout(800)
        stream = page.locator("#token-stream").bounding_box()
        assert 0 <= stream["y"] < 844 - 100, stream
        expect(page.locator("#status")).to_contain_text("done", timeout=240_000)
        page.screenshot(path=str(ARTEFACTS / "browser-phone.png"))
        browser.close()
    assert errors == []


@pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM), reason="chromium not installed")
def test_projector_words_titles_and_refusals(url):
    """At 1280x720: the status follows the slider; the tree and mask titles are not clipped;
    'How it works' tables break no word; the glossary hovers on the stage; a value typed
    outside a control's range is refused with the range, and nothing runs; top_p and seed are
    disabled at temperature 0, with a note."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with sync_playwright() as p:
        browser = _chromium(p)
        errors: list = []
        page = _new_page(browser, errors, viewport={"width": 1280, "height": 720})
        page.goto(url)
        _wait_for_tree(page)
        _title_unclipped(page, "#tree-plot")

        # the status follows the slider
        box = page.locator("#step-slider input[type=number]")
        box.fill("1")
        box.press("Enter")
        expect(page.locator("#status")).to_contain_text("Showing step 1 of")
        _wait_for_tree(page, "step 1:")
        box.fill("2")
        box.press("Enter")
        expect(page.locator("#status")).to_contain_text("Showing step 2 of")
        page.get_by_role("tab", name="Attention mask").click()
        _figure(page, "#mask-plot")
        _title_unclipped(page, "#mask-plot")
        page.get_by_role("tab", name="What happened").click()

        # plain words: the first tau, q, p, target forward and bonus token hover their meaning
        for where, word in (("#status", "τ"), ("#status", "target forward"), ("#tree-caption", "q"),
                            ("#tree-caption", "p"), ("#tree-caption", "bonus token")):
            term = page.locator(f"{where} abbr.lens-term", has_text=word).first
            expect(term).to_have_attribute("title", re.compile(".{20,}"))

        # How it works: its tables break no word
        page.get_by_role("tab", name="How it works").click()
        assert page.evaluate(WORDS_BROKEN_JS, "#how-tab td, #how-tab th") == []

        # refusal, not clamping: 500 nodes is refused with the page's range, nothing runs
        status = page.locator("#status").inner_text()
        _open_settings(page)
        page.get_by_text("Tree knobs").click()
        field = page.locator("#total-tokens input[type=number]")
        _type_tree_knob(page, "total-tokens", "500", key="Tab")
        page.locator("#generate-btn").click()
        # the refusal names the page's range, under the field and/or by the prompt
        expect(page.locator("#total-tokens, #prompt").filter(has_text="[1, 128]").first).to_be_visible()
        assert field.input_value() == "500"
        page.wait_for_timeout(500)
        assert page.locator("#status").inner_text() == status
        field.fill("16")
        field.press("Tab")

        # sampling-only knobs: disabled at temperature 0, with the note
        page.get_by_text("Sampling", exact=True).click()
        expect(page.locator("#top-p input[type=number]")).to_be_disabled()
        expect(page.locator("#top-p")).to_contain_text("temperature 0")
        expect(page.locator("#seed input")).to_be_disabled()
        temperature = page.locator("#temperature input[type=number]")
        temperature.fill("0.7")
        temperature.press("Enter")
        expect(page.locator("#top-p input[type=number]")).to_be_enabled()
        expect(page.locator("#seed input")).to_be_enabled()
        _close_settings(page)

        # the explorer's refusal sits under the knob it names, in full, covering no field
        page.get_by_role("tab", name="Threshold explorer").click()
        page.locator("#explore-knob input").click()
        page.get_by_role("option", name="tau_high", exact=True).click()
        page.locator("#explore-btn").click()
        message = page.locator("#explore-knob .validation-error")
        expect(message).to_contain_text("choose a method it shapes, or another knob")
        expect(page.locator("#prompt")).not_to_contain_text("tau_high")     # not a side-panel setting
        seen = page.evaluate("""() => { const m = document.querySelector('#explore-knob .validation-error');
            const r = m.getBoundingClientRect(), cut = [];
            for (let e = m; e && e.id !== 'explore-knob'; e = e.parentElement) {
              const b = e.getBoundingClientRect();
              if (b.top > r.top + 1 || b.bottom < r.bottom - 1) cut.push(e.className); }
            const fields = ['#explore-knob input', '#explore-start input', '#explore-stop input',
                            '#explore-count input[type=number]', '#explore-btn'];
            const covered = fields.filter(s => { const b = document.querySelector(s).getBoundingClientRect();
              return Math.min(b.right, r.right) > Math.max(b.left, r.left) && Math.min(b.bottom, r.bottom) > Math.max(b.top, r.top); });
            return {cut, covered, scrolled: m.scrollHeight > m.clientHeight + 1}; }""")
        assert seen == {"cut": [], "covered": [], "scrolled": False}, seen
        page.screenshot(path=str(ARTEFACTS / "browser-explorer-refusal.png"))
        browser.close()
    assert errors == []
