"""Screenshots of the page for the README: `python scripts/page_screenshots.py [--out docs/screenshots]`.

Starts the app with the embedded model (no tree sizing in the foreground: the machine's kept
profile is used when there is one), opens it in a headless chromium (Debian's, through
Playwright) at a projector's 1280x720, and saves:

    classroom.png    the first demo as it opens: tree, step slider and step account on one screen
    mask.png         the tree attention mask of that step, a tree node hovered (its row and column lit)
    kv.png           the KV cache of that step: written, kept, dropped
    tree-60.png      the EAGLE-2 paper's 60-node tree (demo 5-code-big-tree), folded around its path
    ab.png           the A/B comparison: the first demo pinned as A, the 60-node demo as B

Everything shown is a recorded demo (traces/), so the pictures do not depend on this machine's
speed; the header names the model this machine would run.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MAX_BYTES = 300_000


def context():
    """The app's context with the embedded model; the default tree from the kept profile, if any."""
    from app.engine.autotune import choose_tree
    from app.ui.settings import ServerConfig, load_context

    ctx = load_context(replace(ServerConfig.from_env(), auto_tree=False), log=lambda m: None)
    if ctx.has_head:
        tree, choice = ctx.engine_thread.call(choose_tree, ctx.engine, measure=False)
        if choice is not None:
            ctx.tree_defaults, ctx.tree_choice = tree, choice.to_dict()
    return ctx


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from playwright.sync_api import sync_playwright

    from app.ui.blocks import build_demo, demo_traces, launch_kwargs

    ctx = context()
    demos = demo_traces()
    demo = build_demo(ctx, demos)
    _, url, _ = demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True,
                            **launch_kwargs(ctx.config))
    errors: list[str] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                         args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.set_default_timeout(120_000)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.add_init_script("localStorage.setItem('eagle-lens-tour-done', '1')")
            page.goto(url)
            page.wait_for_function("document.querySelectorAll('#tree-plot .point').length > 3")
            page.wait_for_timeout(800)
            shots = {}
            shots["classroom.png"] = lambda path: page.screenshot(path=path)

            def mask(path):
                page.get_by_role("tab", name="Attention mask").click()
                page.wait_for_function("document.querySelector('#mask-plot .js-plotly-plot')")
                page.wait_for_timeout(500)
                where = page.evaluate("""() => { const gd = document.querySelector('#tree-plot .js-plotly-plot');
                    const d = gd.data.find(t => t.name === 'nodes'); const xa = gd._fullLayout.xaxis;
                    const ya = gd._fullLayout.yaxis; const r = gd.getBoundingClientRect();
                    const i = d.hovertext.findIndex(h => h.includes('status: rejected'));
                    return {x: r.left + xa._offset + xa.l2p(d.x[i]), y: r.top + ya._offset + ya.l2p(d.y[i])}; }""")
                page.mouse.move(where["x"], where["y"])
                page.wait_for_timeout(500)
                page.screenshot(path=path)
                page.mouse.move(5, 5)

            def kv(path):
                page.get_by_role("tab", name="KV cache").click()
                page.wait_for_function("document.querySelector('#kv-plot .js-plotly-plot')")
                page.wait_for_timeout(500)
                page.screenshot(path=path)
                page.get_by_role("tab", name="What happened").click()

            def load(name):
                page.get_by_role("tab", name="Traces").click()
                page.locator("#demo-choice input").click()
                page.get_by_role("option", name=name, exact=True).click()
                page.locator("#demo-btn").click()
                page.locator("#status").filter(has_text=f"replaying {name}").wait_for()
                page.wait_for_timeout(800)

            def tree60(path):
                page.locator("#pin-btn").click()          # the first demo becomes A
                load("5-code-big-tree")
                page.evaluate("window.scrollTo(0, 0)")
                page.wait_for_timeout(300)
                page.screenshot(path=path)

            def ab(path):
                page.get_by_role("tab", name="Compare A/B").click()
                page.wait_for_function("document.querySelectorAll('#ab-trees-plot .js-plotly-plot').length > 0")
                page.wait_for_timeout(800)
                page.set_viewport_size({"width": 1280, "height": 1400})
                page.locator("#ab-caption").scroll_into_view_if_needed()
                page.evaluate("document.querySelector('#ab-caption').scrollIntoView({block: 'start'})")
                page.wait_for_timeout(500)
                page.screenshot(path=path)

            shots.update({"mask.png": mask, "kv.png": kv, "tree-60.png": tree60, "ab.png": ab})
            for name, take in shots.items():
                path = out / name
                take(str(path))
                size = path.stat().st_size
                print(f"{path}: {size // 1000} kB")
                if size > MAX_BYTES:
                    print(f"  over {MAX_BYTES // 1000} kB: make the view smaller", file=sys.stderr)
            browser.close()
    finally:
        demo.close()
    if errors:
        print("JavaScript errors:", *errors, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
