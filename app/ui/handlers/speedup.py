"""The race's result: the speedup over the vanilla run raced alongside, with its range, the
factors it is made of (``speedup_decomposition``) and the lossless check (greedy EAGLE must
give vanilla's exact tokens)."""
from __future__ import annotations

from app.engine.events import decoding_steps
from app.engine.precision import top2_after
from app.ui.handlers.common import RACE_CHUNK_TOKENS
from app.ui.session import Session
from app.ui.settings import AppContext
from app.viz.glossary import term
from app.viz.race import RaceSpeedup, race_speedup
from app.viz.safe import md_code


def _identical_note(session: Session) -> str:
    """The lossless check: with greedy decoding EAGLE must give vanilla's exact tokens."""
    if session.summary is None or session.race_vanilla is None:
        return ""
    if session.settings.get("temperature", 0.0) != 0.0:
        return ("Sampling (temperature > 0): the outputs are different draws from the *same* "
                "distribution, so they need not match.")
    a, b = session.summary.token_ids, session.race_vanilla.summary.token_ids
    if a == b:
        return "Greedy output **identical** to vanilla decoding ✓ — speculative decoding is lossless."
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    dtype = session.model.get("dtype", "")
    why = ("This should not happen in float32 — please report it with the trace."
           if dtype == "float32" else
           f"In {md_code(dtype) if dtype else 'reduced precision'} a forward over 1 token and over a whole tree round "
           "differently, so after a near-tie the two greedy paths can part; in float32 they match exactly.")
    tie = session.parting
    if tie and tie.get("index") == first and dtype != "float32":
        why += (f" Here the target's two likeliest tokens at token {first} had p = {tie['p1']:.3f} and "
                f"{tie['p2']:.3f} (a gap of {tie['p1'] - tie['p2']:.3f}): a near-tie, tipped by rounding, "
                "not by the method.")
    return f"Greedy outputs **differ from token {first}** on. {why}"


def _measure_parting(ctx: AppContext, session: Session) -> None:
    """Where greedy EAGLE and vanilla outputs part (reduced precision), the target's top-2
    probabilities there (one forward on the engine thread), for ``_identical_note``."""
    session.parting = None
    if session.summary is None or session.race_vanilla is None or session.settings.get("temperature", 0.0) != 0.0:
        return
    a, b = session.summary.token_ids, session.race_vanilla.summary.token_ids
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None:
        return
    ids = list(session.prompt_ids) or ctx.engine.encode_prompt(session.settings["prompt"])
    (_, p1), (_, p2) = ctx.engine_thread.call(top2_after, ctx.engine.target, ids, a[:first])
    session.parting = {"index": first, "p1": p1, "p2": p2}


def session_race(session: Session) -> RaceSpeedup | None:
    """The run's speedup over the vanilla run raced with it (``race_speedup``): the one number
    behind the headline, its range, the status line and the A/B comparison."""
    v = session.race_vanilla
    if session.summary is None or v is None or session.summary.method == "vanilla":
        return None
    return race_speedup(session.steps, v.steps, RACE_CHUNK_TOKENS)


def speedup_headline(session: Session) -> str:
    """One short line for the stage (beside the tree): the speedup with its range, τ."""
    s = session.summary
    if s is None:
        return ""
    race = session_race(session)
    if s.method == "vanilla":
        return "vanilla: the baseline (1.00×)"
    if race is not None and race.drowned:
        return (f"Speedup **drowned by the machine's load** ({race.low:.2f}–{race.high:.2f}× over "
                f"{len(race.chunks)} chunks); counted in forwards, which load cannot distort: "
                f"{term('τ')} = {s.mean_accepted:.2f}, {forwards_saved(s):.0%} fewer {term('target forward')}s "
                "(details under the answer)")
    speed = f"**{race.text()}** vanilla" if race is not None else "no vanilla raced"
    return (f"Speedup {speed}, {term('τ')} = {s.mean_accepted:.2f} tokens per {term('target forward')} "
            "(details under the answer)")


def forwards_saved(summary) -> float:
    """The share of target forwards EAGLE did not need: vanilla makes one token per forward,
    EAGLE τ, so ``1 - 1/τ`` (over the decoding steps; the prefill's token is the same for both)."""
    return 1.0 - 1.0 / summary.mean_accepted if summary.mean_accepted > 0 else 0.0


def drowned_text(race: RaceSpeedup, summary) -> str:
    """The race's words when the neighbours drowned it (``RaceSpeedup.drowned``): the wall
    clock's spread, and the step count, which load cannot distort."""
    decoded = round(summary.mean_accepted * summary.target_forwards)    # the decoding steps' tokens
    return (f"### Speedup drowned by the machine's load\n"
            f"The wall-clock race ran {race.low:.2f}–{race.high:.2f}× over {len(race.chunks)} chunks "
            f"({race.total:.2f}× overall): other work on this machine slowed some chunks of one side and not "
            "the other, by more than the method changes, so the clock cannot say which is faster right now. "
            f"**Counted in forwards**, which load cannot distort: after the prompt's first token, "
            f"{decoded} tokens in {summary.target_forwards} target forwards (τ = {summary.mean_accepted:.2f}) "
            f"where vanilla needs {decoded}: **{forwards_saved(summary):.0%} fewer target forwards**. What that is worth "
            "in time is τ over a step's cost in vanilla steps (the **Why** line below); run again when the machine "
            "is quieter to see it on the clock.")


def speedup_text(session: Session) -> str:
    if session.summary is None:
        return ""
    s = session.summary
    head = (f"**{s.method}**: {s.new_tokens} tokens, {s.target_forwards} target forwards, "
            f"τ = {s.mean_accepted:.2f} tokens/forward, {s.tokens_per_s:.1f} tokens/s")
    if s.method == "vanilla":
        return head + " — vanilla is the baseline (speedup 1.00×)."
    v = session.race_vanilla
    if v is None:
        return head + " — no vanilla run to compare with."
    race = session_race(session)
    ratio_text = race.text() if race is not None else "n/a"
    title = drowned_text(race, s) if race is not None and race.drowned else f"### Speedup {ratio_text}"
    why = speedup_decomposition(session.steps, v.steps)
    load = getattr(session, "load", None) or [None, None]
    threads = getattr(session, "threads", "")
    conditions = (f" Machine load average {load[0]:.2f} → {load[1]:.2f} during the run"
                  + (f", on {threads}" if threads else "")
                  + f"; vanilla ran alongside, in chunks of {RACE_CHUNK_TOKENS} tokens." if None not in load else "")
    return (f"{title}\n{head}; vanilla {v.summary.tokens_per_s:.1f} tokens/s "
            f"({v.summary.new_tokens} tokens).{conditions}\n\n" + (f"{why}\n\n" if why else "") + _identical_note(session))


def speedup_decomposition(eagle_steps, vanilla_steps) -> str:
    """The measured speedup split into its two factors, from the same step records as the race:

        speedup = (tokens per EAGLE step / tokens per vanilla step) × (vanilla step ms / EAGLE step ms)

    This is an identity, not a model: tokens/s = tokens per step / seconds per step for each
    run. It says why a speedup is what it is: a step must add more tokens than it costs
    vanilla steps, and where its time goes (draft, verify, the rest)."""
    eagle_steps, vanilla_steps = decoding_steps(eagle_steps), decoding_steps(vanilla_steps)
    if not eagle_steps or not vanilla_steps:
        return ""
    ms_e = sum(s.step_ms for s in eagle_steps) / len(eagle_steps)
    ms_v = sum(s.step_ms for s in vanilla_steps) / len(vanilla_steps)
    if ms_e <= 0 or ms_v <= 0:
        return ""       # a trace without timings
    tau_e = sum(len(s.new_tokens) for s in eagle_steps) / len(eagle_steps)
    tau_v = sum(len(s.new_tokens) for s in vanilla_steps) / len(vanilla_steps)
    draft = sum(s.draft_ms for s in eagle_steps) / len(eagle_steps)
    verify = sum(s.verify_ms for s in eagle_steps) / len(eagle_steps)
    cost = ms_e / ms_v
    vanilla_tokens = "1 token" if abs(tau_v - 1) < 5e-3 else f"{tau_v:.2f} tokens"
    factor = f"{tau_e:.2f} × {ms_v:.1f} / {ms_e:.1f}" if vanilla_tokens == "1 token" else \
        f"({tau_e:.2f} / {tau_v:.2f}) × ({ms_v:.1f} / {ms_e:.1f})"
    verdict = ("it adds more tokens than it costs vanilla steps, so it wins" if tau_e / tau_v > cost else
               "it costs more vanilla steps than it adds tokens, so vanilla wins: try a smaller tree")
    return (f"**Why**: one step made τ = {tau_e:.2f} tokens in {ms_e:.1f} ms (draft {draft:.1f} + verify "
            f"{verify:.1f} + other {max(0.0, ms_e - draft - verify):.1f}); one vanilla step made {vanilla_tokens} "
            f"in {ms_v:.1f} ms. Speedup = {factor} = **{tau_e / tau_v / cost:.2f}×**. A step costs "
            f"{cost:.2f} vanilla steps; {verdict}.")
