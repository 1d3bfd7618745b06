"""A draft head's learning curve as a picture: held-out acceptance by depth against training
tokens seen, across every run and machine its ``training.json`` records.

Reads the ``curve`` a trained head carries (``app/train/eagle3.py``'s ``learning_curve``: one
point per held-out measurement, tokens seen and minutes counted on across resumes), draws
acc_d for d = 1..3 on a log axis of tokens seen (the curve has gained about the same per
doubling, so a straight line there is what "more of the same training" predicts), marks
where each run began, and draws reference levels (another head's held-out depth-1
acceptance, a target) as dashed lines. Writes an HTML figure and, through Debian's headless
chromium, a PNG for the model card.

    python scripts/plot_learning_curve.py models/eagle3-smollm2-135m-instruct \\
        --level "EAGLE-2 head, depth 1=0.686" --level "target=0.72" --png models/eagle3-smollm2-135m-instruct/learning-curve.png
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import plotly.graph_objects as go

TICKS = [0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64]      # doublings: equal steps on the log axis
COLOURS = {1: "#1f77b4", 2: "#2ca02c", 3: "#d62728", 4: "#9467bd", 5: "#8c564b"}


def figure(curve: list[dict], levels: list[tuple[str, float]], title: str, depth: int = 3) -> go.Figure:
    """The curve's acc_1..acc_depth against tokens seen (millions, log axis)."""
    fig = go.Figure()
    x = [p["tokens_seen"] / 1e6 for p in curve]
    for d in range(1, depth + 1):
        fig.add_trace(go.Scatter(x=x, y=[p.get(f"acc{d}") for p in curve], mode="lines+markers",
                                 name=f"depth {d}", line={"color": COLOURS[d]}, marker={"size": 5}))
    lo, hi = min(x) / 1.25, max(x) * 1.25
    starts = 0
    for i, p in enumerate(curve):                                  # where each run (resume) began
        if i and p.get("run") != curve[i - 1].get("run"):
            text = f"run {p['run']} (resumed)"
            if p.get("held_out") and p["held_out"] != curve[i - 1].get("held_out"):
                text += "<br>held out from here: " + ", ".join(s.replace("shard_", "").lstrip("0") or "0"
                                                               for s in p["held_out"])
            at = math.log10(p["tokens_seen"] / 1e6)
            right = (at - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) > 0.7   # near the edge: text to the left
            fig.add_vline(x=p["tokens_seen"] / 1e6, line={"dash": "dot", "color": "#888"})
            fig.add_annotation(x=at, y=0.03 + 0.09 * (starts % 3), text=text, showarrow=False,   # three heights in turn
                               xanchor="right" if right else "left")
            starts += 1
    for i, (name, value) in enumerate(levels):
        fig.add_hline(y=value, line={"dash": "dash", "color": "#555"}, annotation_text=f"{name} {value:.3f}",
                      annotation_position="top left" if i % 2 else "bottom left")
    ticks = [t for t in TICKS if lo <= t <= hi]
    fig.update_layout(title=title, width=900, height=480, template="plotly_white",
                      xaxis={"title": "training tokens seen (millions, log scale)", "type": "log",
                             "range": [math.log10(lo), math.log10(hi)], "tickvals": ticks,
                             "ticktext": [f"{t:g}" for t in ticks]},
                      yaxis={"title": "held-out acceptance (share of positions)", "rangemode": "tozero"},
                      legend={"orientation": "h", "y": -0.2})
    return fig


def png(fig: go.Figure, out: Path) -> None:
    """Render ``fig`` to ``out`` in headless chromium (plotly's static export needs kaleido,
    which this project does not install)."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "curve.html"
        fig.write_html(html, include_plotlyjs=True, full_html=True, config={"staticPlot": True})
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                         args=["--headless", "--no-sandbox", "--disable-gpu",
                                               "--disable-background-networking"])
            page = browser.new_page(viewport={"width": 900, "height": 480})
            page.goto(html.as_uri())
            page.wait_for_selector(".main-svg")
            page.screenshot(path=str(out))
            browser.close()


def parse_level(text: str) -> tuple[str, float]:
    name, _, value = text.rpartition("=")
    try:
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--level wants NAME=VALUE, e.g. 'target=0.72', not {text!r}") from None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("head", type=Path, help="a head folder with training.json")
    p.add_argument("--level", type=parse_level, action="append", default=[], help="NAME=VALUE reference line")
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--html", type=Path, help="write the interactive figure here")
    p.add_argument("--png", type=Path, help="write a PNG here (needs /usr/bin/chromium)")
    args = p.parse_args()
    progress = args.head / "training.json"
    if not progress.is_file():
        print(f"error: {progress} not found: the head has no recorded training", file=sys.stderr)
        return 2
    curve = json.loads(progress.read_text()).get("curve", [])
    if not curve:
        print(f"error: {progress} has no learning curve", file=sys.stderr)
        return 2
    fig = figure(curve, args.level, f"{args.head.name}: held-out acceptance by depth", args.depth)
    if args.html:
        fig.write_html(args.html, include_plotlyjs="cdn")
    if args.png:
        png(fig, args.png)
    if not (args.html or args.png):
        print("nothing written: give --html and/or --png", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
