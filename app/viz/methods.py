"""The page's method comparison: several drafters on one prompt, on this machine, beside the
numbers the literature reports for them.

- ``methods_race_figure``: tokens against decoding time, one line per method (the engine's own
  step times, as in ``race.py``);
- ``methods_table``: per method, the drafter, τ, tokens/s, the ratio to vanilla and whether the
  greedy output equals vanilla's;
- ``literature_table``: published speedups (papers and Spec-Bench) with this run's measured
  ratio beside them.

All take step records and summaries only, so a recorded comparison draws the same.
"""
from __future__ import annotations

from app.engine.drafters.registry import METHODS, SPEC_BENCH, Published   # noqa: F401  (Published: the literature's record)
from app.engine.events import RunSummary, StepEvent
from app.viz import style
from app.viz.race import RaceSpeedup, curve, race_speedup, turns_ahead

# Every method's facts (its name, colour and published numbers) are its entry in the registry
# (``app.engine.drafters.registry.METHODS``: vanilla, the drafters, the EAGLE heads' trees);
# these are this view's lookups over them.
METHOD_COLOURS = {method: facts.colour for method, facts in METHODS.items()}
METHOD_NAMES = {method: facts.name for method, facts in METHODS.items()}
LITERATURE = {method: facts.published for method, facts in METHODS.items() if facts.published is not None}


def method_name(method: str, steps: list[StepEvent] = ()) -> str:
    """The page's name for a run's method: "EAGLE-2 (dynamic tree)", not "dynamic"; a tree that
    an EAGLE-3 head drafted (the steps' ``drafter``) is "EAGLE-3 (dynamic tree)"."""
    drafter = next((s.drafter for s in steps if s.drafter), None)
    return METHOD_NAMES.get(f"{method}@{drafter}", METHOD_NAMES.get(method, method))


def methods_race_figure(runs: dict[str, list[StepEvent]], height: int = 320):
    """Tokens against decoding seconds, one line per method (``runs``: method -> its steps)."""
    data = []
    for method, steps in runs.items():
        if not steps:
            continue
        x, y = curve(steps)
        dash = "dot" if method == "vanilla" else None
        data.append(dict(type="scatter", x=x, y=y, mode="lines", name=METHOD_NAMES.get(method, method),
                         line=dict(color=METHOD_COLOURS.get(method, style.EDGE), width=2 if dash else 3, dash=dash)))
    layout = dict(style.BASE_LAYOUT, height=height, uirevision="methods-race",
                  title=dict(text="tokens vs decoding time, every method on the same prompt", x=0.01),
                  xaxis=dict(title=dict(text="seconds (decoding, after prefill)"), rangemode="tozero"),
                  yaxis=dict(title=dict(text="tokens"), rangemode="tozero"),
                  legend=dict(x=0.01, y=0.99))
    return style.fast_figure(data, layout)


CHUNK_TOKENS = 16   # the turns the methods take (app/ui/race.py), the windows of the ranges


def _ratio(summary: RunSummary | None, vanilla: RunSummary | None) -> float | None:
    if summary is None or vanilla is None or not vanilla.tokens_per_s:
        return None
    return summary.tokens_per_s / vanilla.tokens_per_s


def method_races(steps: dict[str, list[StepEvent]] | None, summaries: dict) -> dict[str, RaceSpeedup]:
    """Each finished method's speedup over vanilla with its chunk range (``race_speedup``, the
    computation behind the page's headline), from the step records; {} without vanilla."""
    if not steps or summaries.get("vanilla") is None or not steps.get("vanilla"):
        return {}
    out = {}
    for method, s in summaries.items():
        if method != "vanilla" and s is not None and steps.get(method):
            race = race_speedup(steps[method], steps["vanilla"], CHUNK_TOKENS)
            if race is not None:
                out[method] = race
    return out


def noise_note(races: dict[str, RaceSpeedup]) -> str:
    """Which differences in the table the run cannot tell from chance: methods whose turn
    ranges include 1 (slower than vanilla in some turns), and pairs of methods where each was
    ahead in some turns. A range's spread is mostly the text (a list drafts well, free prose
    does not), so two methods are judged turn by turn, never by whether their ranges overlap:
    one ahead in every turn is ahead, however wide both ranges are."""
    if not races:
        return ""
    name = lambda m: METHOD_NAMES.get(m, m)   # noqa: E731
    tied_vanilla = [name(m) for m, r in races.items() if len(r.chunks) > 1 and r.low <= 1.0 <= r.high]
    methods = [m for m in races if len(races[m].chunks) > 1]
    pairs = []
    for i, a in enumerate(methods):
        for b in methods[i + 1:]:
            ahead, turns = turns_ahead(races[a], races[b])
            if turns > 1 and 0 < ahead < turns:
                pairs.append(f"{name(a)} and {name(b)} ({name(a)} ahead in {ahead} of {turns} turns)")
    lines = [f"Ranges: the lowest and highest ratio over the turns of {CHUNK_TOKENS} tokens; they spread "
             "with the text (some stretches draft better) and with the machine's load. The methods ran in "
             "turns, so a turn covers the same tokens for each at about the same time."]
    if tied_vanilla:
        lines.append(f"Within noise of vanilla (the range includes 1×): {', '.join(tied_vanilla)}.")
    if pairs:
        lines.append(f"Within noise of each other (each ahead in some turns): {'; '.join(pairs)}.")
    if any(len(r.chunks) < 2 for r in races.values()):
        lines.append("A run of one turn has no range: its ratio cannot be judged against the noise.")
    return "\n\n" + " ".join(lines)


def _ratio_text(method: str, s: RunSummary, vanilla: RunSummary | None, races: dict) -> str:
    race = races.get(method)
    if race is not None:
        text = f"{race.total:.2f}×"
        if len(race.chunks) > 1:
            text += f" ({race.low:.2f}–{race.high:.2f})"
            if race.low <= 1.0 <= race.high:
                text += " ≈ vanilla"
        return text
    ratio = _ratio(s, vanilla)
    return "–" if ratio is None else f"{ratio:.2f}×"


def methods_table(summaries: dict[str, RunSummary | None], drafted: dict[str, str],
                  steps: dict[str, list[StepEvent]] | None = None) -> str:
    """A markdown table: one row per method (``summaries``: method -> its summary, None while
    it runs; ``drafted``: method -> what proposed its nodes; ``steps``: method -> its step
    records, for each ratio's range and the note on noise, ``noise_note``)."""
    vanilla = summaries.get("vanilla")
    races = method_races(steps, summaries)
    rows = ["| method | drafter | τ (tokens per forward) | tokens/s | × vanilla (range) | output = vanilla |",
            "|---|---|---|---|---|---|"]
    for method, s in summaries.items():
        name = METHOD_NAMES.get(method, method)
        if s is None:
            rows.append(f"| {name} | {drafted.get(method, '–')} | … | … | … | … |")
            continue
        same = "–" if vanilla is None or method == "vanilla" else ("yes" if s.token_ids == vanilla.token_ids else
                                                                   "**no**")
        ratio = "1×" if method == "vanilla" else _ratio_text(method, s, vanilla, races)
        rows.append(f"| {name} | {drafted.get(method, '–')} | {s.mean_accepted:.2f} | {s.tokens_per_s:.1f} | "
                    f"{ratio} | {same} |")
    done = all(v is not None for v in summaries.values())
    return "\n".join(rows) + (noise_note(races) if done else "")


def literature_table(summaries: dict[str, RunSummary | None], steps: dict[str, list[StepEvent]] | None = None) -> str:
    """The literature's numbers per method with this run's measured ratio to vanilla beside them
    (every method of ``LITERATURE``; "not run" where this comparison did not include it); the
    same ratio as ``methods_table``'s."""
    vanilla = summaries.get("vanilla")
    races = method_races(steps, summaries)
    rows = [f"| method | from | paper's speedup | [Spec-Bench]({SPEC_BENCH}) | lossless | training | here, × vanilla |",
            "|---|---|---|---|---|---|---|"]
    for method, pub in LITERATURE.items():
        s = summaries.get(method)
        ratio = _ratio(s, vanilla)
        here = ("not run" if method not in summaries else "…" if s is None
                else "run without vanilla" if ratio is None else "**1×**" if method == "vanilla"
                else f"**{_ratio_text(method, s, vanilla, races)}**")
        source = f"[{pub.paper}]({pub.citation})" if pub.citation else pub.paper
        rows.append(f"| {METHOD_NAMES[method]} | {source} | {pub.paper_speedup} | {pub.spec_bench} | "
                    f"{pub.lossless} | {pub.training} | {here} |")
    return "\n".join(rows)
