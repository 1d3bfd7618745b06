"""The threshold explorer: the prompt run once per value of one knob (a tree knob or the
temperature), each value ``EXPLORE_REPEATS`` times, and a verdict that names a best value
only when it beats the run-to-run noise."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import StrEnum

from app.engine.spec import SETTING, shown
from app.ui.handlers import common
from app.ui.requests import SWEEP_KNOBS, Request, build_request
from app.ui.session import Session
from app.ui.settings import AppContext
from app.viz.insights import explorer_figure


SWEEP_FIELDS = ("knob", "start", "stop", "count")   # the explorer's own inputs, before the settings


class ExploreView(StrEnum):
    """The explorer's views, in the order of its event's outputs (API ``/explore``)."""

    PLOT = "explorer_plot"
    STATUS = "explorer_status"


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
    request = common.parse(ctx, raw)
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
    runs, skipped = [], []
    for value in values:
        try:
            run = build_request(ctx.config.limits, **{**request.settings(), knob: value, "max_new_tokens": n})
            run = dataclasses.replace(run, prompt_ids=request.prompt_ids)     # the same prompt: encoded once
            ctx.engine.check_request(run.prompt_ids, run.tree, run.max_new_tokens)
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
        session.submitted()     # not through the page's validator, which does this at the click
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
                yield {ExploreView.STATUS: f"stopped after {done} of {total} runs."}
                return
            yield {ExploreView.STATUS: f"run {done + 1}/{total}: {knob} = {value}"
                                       f"{f' (again, round {round_ + 1} of {repeats})' if round_ else ''}, "
                                       f"{run.max_new_tokens} tokens…"}
            events = ctx.engine.generate(prompt_ids=run.prompt_ids, tree=run.tree, sampling=run.sampling,
                                         max_new_tokens=run.max_new_tokens)
            runs[i].append(ctx.engine_thread.call(_run_to_summary, events))
            done += 1
            yield {ExploreView.PLOT: explorer_figure(knob, _sweep_results(sweep, runs), best=None)}
    results = _sweep_results(sweep, runs)
    best, note = verdict(knob, results)
    if sweep.skipped:
        note += " Skipped: " + "; ".join(sweep.skipped)
    yield {ExploreView.PLOT: explorer_figure(knob, results, best=best), ExploreView.STATUS: note}


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
