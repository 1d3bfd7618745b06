"""The page's method comparison: 2-4 drafters decode one prompt on this machine, in turns.

Every method is a policy of the one engine (``app.engine.drafters`` for prompt lookup,
lookahead and Medusa, the EAGLE head for EAGLE-1's static and EAGLE-2's dynamic tree, and any
other shipped head, e.g. EAGLE-3's, as ``dynamic@NAME``), so each
step is verified by the same tree-masked target forward with the same acceptance rule, and
every greedy output must equal vanilla's (the table checks it). All runs draft within the same
node budget: the page's default tree (``AppContext.tree_defaults``, sized for this machine)
with only the method changed.

The runs take turns in chunks of ``RACE_CHUNK_TOKENS`` tokens (``app.ui.race.round_robin``) on
the engine thread, so load that comes and goes falls on all of them, and their tokens/s are
compared within one stretch of time. Greedy decoding only: the comparison is about speed and
acceptance, and greedy output makes losslessness visible token for token.
"""
from __future__ import annotations

import dataclasses
from enum import StrEnum
from typing import Iterator

from app.engine.config import TreeConfig
from app.engine.drafters.registry import DRAFTERS
from app.engine.events import StepEvent
from app.ui.handlers import RACE_CHUNK_TOKENS, _load_average, instructive_step, parse, use_request_threads
from app.ui.pump import BackgroundRun
from app.ui.race import round_robin
from app.ui.session import Session
from app.ui.settings import AppContext
from app.viz.compare import trees_side_by_side
from app.viz.methods import METHOD_NAMES, literature_table, methods_race_figure, methods_table

MIN_METHODS, MAX_METHODS = 2, 4
DEFAULT_TOKENS = 64


class MethodsView(StrEnum):
    """The comparison's views, in the order of its event's outputs (API ``/compare_methods``)."""

    STATUS = "methods_status"
    RACE = "methods_race"
    TREES = "methods_trees"
    TABLE = "methods_table"
    LITERATURE = "methods_literature"


def available_methods(ctx: AppContext) -> list[str]:
    """The methods this server can run, in the page's order: vanilla, the drafters of the
    registry (``app.engine.drafters``; one that needs trained weights only when the engine has
    them loaded), then the EAGLE head's (when a head is loaded)."""
    engine = ctx.engine
    out = ["vanilla"] + [d.method for d in DRAFTERS if not d.weights or getattr(engine, d.weights, None) is not None]
    if ctx.has_head:
        out += ["static", "dynamic"]
        out += [f"dynamic@{name}" for name in ctx.heads]     # EAGLE-2's tree drafted by another shipped head
    return out


def choice_label(method: str) -> str:
    """The method's checkbox label: its name and, when that differs, its API value."""
    name = METHOD_NAMES.get(method, method)
    return method if name == method else f"{name} ({method})"


def engine_for(ctx: AppContext, method: str):
    """The engine that runs ``method``: ``dynamic@NAME`` drafts with the shipped head NAME
    (``AppContext.heads``, same target), every other method with the server's engine."""
    _, at, head = method.partition("@")
    return ctx.heads[head] if at else ctx.engine


def default_methods(ctx: AppContext) -> list[str]:
    """What the view starts with ticked: vanilla, the best method without training, and
    EAGLE-2 when the server has a head."""
    wanted = ["vanilla", "pld", "dynamic"]
    return [m for m in wanted if m in available_methods(ctx)]


def method_tree(ctx: AppContext, method: str) -> TreeConfig:
    """The tree a method drafts in the comparison: the page's default node budget
    (total_tokens, depth, top_k), only the method changed, and no prompt-lookup branch (each
    method as the literature runs it)."""
    return dataclasses.replace(ctx.tree_defaults, method=method.partition("@")[0], lookup=0)


def check_compare(ctx: AppContext, prompt, methods, max_new_tokens) -> tuple:
    """(request, methods) for a valid comparison; ValueError naming what is wrong otherwise.
    The prompt and token count get the Generate button's checks (``handlers.parse``)."""
    if not isinstance(methods, (list, tuple)) or not all(isinstance(m, str) for m in methods):
        raise ValueError("methods must be a list of method names")
    choices = available_methods(ctx)
    unknown = [m for m in methods if m not in choices]
    if unknown:
        raise ValueError(f"methods must be among {', '.join(choices)} on this server, got {', '.join(unknown)}")
    methods = [m for m in choices if m in methods]   # the page's order, each once
    if not MIN_METHODS <= len(methods) <= MAX_METHODS:
        raise ValueError(f"methods must be {MIN_METHODS} to {MAX_METHODS} methods, got {len(methods)}")
    request = parse(ctx, {"prompt": prompt, "method": "vanilla", "max_new_tokens": max_new_tokens,
                          "temperature": 0.0})
    for m in methods:   # every engine shares the server's target, so the ids are each one's
        engine_for(ctx, m).check_request(request.prompt_ids, method_tree(ctx, m), request.max_new_tokens)
    return request, methods


def _shown_step(steps: list[StepEvent], final: bool) -> StepEvent | None:
    """While running the newest step with a tree; at the end the most instructive one."""
    if not steps:
        return None
    if final:
        return steps[instructive_step(steps)]
    drafted = [s for s in steps if s.tree is not None and len(s.tree)]
    return drafted[-1] if drafted else steps[-1]


def _drafter(steps: list[StepEvent]) -> str:
    return next((s.drafter for s in steps if s.drafter), "–")


def methods_view(steps: dict[str, list[StepEvent]], summaries: dict, status: str, final: bool) -> dict:
    drafted = {m: _drafter(s) for m, s in steps.items()}
    panels = [(METHOD_NAMES.get(m, m), _shown_step(s, final)) for m, s in steps.items() if m != "vanilla"]
    return {MethodsView.STATUS: status,
            MethodsView.RACE: methods_race_figure(steps),
            MethodsView.TREES: trees_side_by_side(panels, revision="methods-trees") if panels else None,
            MethodsView.TABLE: methods_table(summaries, drafted, steps),
            MethodsView.LITERATURE: literature_table(summaries, steps)}


def compare_methods(ctx: AppContext, session: Session, prompt, methods, max_new_tokens=DEFAULT_TOKENS,
                    checked: tuple | None = None) -> Iterator[dict]:
    """Run the chosen methods on one prompt in turns and yield the view as they go; Stop
    (``session.stop_requested``) ends it at the next update. ``checked``: ``check_compare``'s
    result when the page's validator already ran it."""
    if checked is None:
        session.submitted()     # not through the page's validator, which does this at the click
    request, methods = checked or check_compare(ctx, prompt, methods, max_new_tokens)
    with session.running():
        runs = {m: engine_for(ctx, m).generate(prompt_ids=request.prompt_ids, tree=method_tree(ctx, m),
                                               sampling=request.sampling, max_new_tokens=request.max_new_tokens)
                for m in methods}
        steps: dict[str, list[StepEvent]] = {m: [] for m in methods}
        summaries: dict = {m: None for m in methods}
        load0 = _load_average()

        def turns():
            use_request_threads(ctx)
            yield from round_robin({m: ctx.threads.guard(r) for m, r in runs.items()}, RACE_CHUNK_TOKENS)

        run = BackgroundRun(turns(), ctx.engine_thread)
        try:
            yield methods_view(steps, summaries, f"prefill of {len(methods)} runs…", final=False)
            for batch in run.batches(ctx.update_interval):
                if session.stop_requested:
                    yield methods_view(steps, summaries, "stopped; what ran so far is above.", final=False)
                    return
                for method, ev in batch:
                    if ev.type == "summary":
                        summaries[method] = ev
                    else:
                        steps[method].append(ev)
                if batch:
                    done = sum(s is not None for s in summaries.values())
                    yield methods_view(steps, summaries, f"decoding in turns of {RACE_CHUNK_TOKENS} tokens: "
                                                         f"{done} of {len(methods)} done…", final=False)
        finally:
            run.close()
        load = (load0, _load_average())
        where = "" if None in load else f"; load average {load[0]:.2f} → {load[1]:.2f}"
        yield methods_view(steps, summaries, f"done: {len(methods)} methods, {request.max_new_tokens} tokens at most, "
                                             f"greedy, in turns of {RACE_CHUNK_TOKENS} tokens{where}.", final=True)
