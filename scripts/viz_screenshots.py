"""Render the teaching views (app/viz) to PNG screenshots under docs/viz/, from real step records.

    python scripts/viz_screenshots.py [--out docs/viz] [--width 900]

Records: the shipped traces (traces/2-code.json: a 5-node chain; traces/1-chat.json: 16-node
trees) and one fresh greedy float32 run of the embedded SmolLM2 target
with the shipped head and EAGLE-2's paper tree (depth 6, top_k 10, 60 nodes; ~10 s on a CPU).
Each figure is drawn by plotly.js (bundled with the plotly package, no network) in a headless
chromium (Debian's, through Playwright) and screenshotted at its own height.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
PROMPT = "Write a Python function that checks whether a string is a palindrome."


def paper_tree_run():
    """Steps of a greedy run with EAGLE-2's 60-node tree on the embedded target."""
    import torch

    from app.engine.config import TreeConfig
    from app.engine.factory import load_engine

    torch.manual_seed(0)
    engine, _ = load_engine(device="cpu", dtype="float32")
    *steps, summary = engine.generate(PROMPT, tree=TreeConfig(method="dynamic", depth=6, top_k=10, total_tokens=60),
                                      max_new_tokens=24)
    return steps, summary


def render(figures: list[tuple[Path, object]], width: int) -> None:
    import plotly.offline
    from playwright.sync_api import sync_playwright

    plotly_js = plotly.offline.get_plotlyjs()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        for path, fig in figures:
            height = fig.layout.height or 450
            page = browser.new_page(viewport=dict(width=width, height=800))   # a fresh page: no state between figures
            page.set_content(
                f"<html><head><script>{plotly_js}</script></head><body style='margin:0;background:white'>"
                f"<div id='fig' style='width:{width}px;height:{height}px'></div><script>"
                f"const f = {fig.to_json()}; Plotly.newPlot('fig', f.data, f.layout, {{displayModeBar: false}});"
                f"</script></body></html>")
            page.wait_for_selector("#fig .main-svg")
            page.locator("#fig").screenshot(path=str(path))
            print(f"{path}: {path.stat().st_size // 1024} kB")
            page.close()
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "viz"))
    ap.add_argument("--width", type=int, default=900)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from app.ui.traces import parse_trace
    from app.viz.compare import ab_figure, ab_trees_figure
    from app.viz.tree import tree_figure
    from app.viz.verify_view import kv_figure, mask_figure

    small = parse_trace((ROOT / "traces" / "2-code.json").read_bytes())
    big = parse_trace((ROOT / "traces" / "1-chat.json").read_bytes())
    steps, _ = paper_tree_run()
    paper = max(steps[1:], key=lambda s: (len(s.tree), len(s.accepted)))     # a 60-node tree, longest path
    medium = max(big.steps[1:], key=lambda s: (len(s.accepted), "rejected" in s.tree.status))
    labels = ("5-node chain", "16-node tree")
    render([
        (out / "tree-16.png", tree_figure(medium)),
        (out / "tree-60-folded.png", tree_figure(paper)),
        (out / "tree-60-full.png", tree_figure(paper, fold=False)),
        (out / "mask-16.png", mask_figure(medium)),
        (out / "mask-60.png", mask_figure(paper)),
        (out / "kv-60.png", kv_figure(paper)),
        (out / "kv-16.png", kv_figure(medium)),
        (out / "ab.png", ab_figure(small.steps, small.summary, big.steps, big.summary, labels,
                                   small.vanilla_summary.tokens_per_s if small.vanilla_summary else None)),
        (out / "ab-trees.png", ab_trees_figure(small.steps[3], big.steps[3], labels)),
    ], args.width)


if __name__ == "__main__":
    main()
