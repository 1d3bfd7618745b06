"""Which shipped head drafts by default: the one this machine's kept profile predicts faster.

The embedded target ships an EAGLE-2 head and, where it has been trained, an EAGLE-3 head.
Which of them decodes faster here is a measurement, not the papers' ranking: it depends on
each head's acceptance (τ, from its own calibration) and on its draft cost (EAGLE-3 reads
three target layers and drafts over its own vocabulary). ``autotune.choose_tree`` already
predicts the tokens/s of a head's best tree from the kept profile (the target's cost curve,
shared, and that head's calibration), so the default is the head with the higher prediction.

Nothing is assumed and nothing is measured in the foreground: a head without a kept
calibration is never chosen (``python -m app tune`` calibrates every shipped head), and
without a prediction for the EAGLE-2 head the default stays EAGLE-2's.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.engine import loading
from app.engine.autotune import choose_tree
from app.engine.drafters.registry import DEFAULT_HEAD_KIND


@dataclass(frozen=True)
class HeadChoice:
    """The chosen head's name and every shipped head's predicted tokens/s (None: no kept profile)."""

    name: str
    predicted: dict[str, float | None]

    def text(self) -> str:
        rates = ", ".join(f"{n} {p:.1f}" if p is not None else f"{n} not calibrated here (`python -m app tune`)"
                          for n, p in self.predicted.items())
        return f"draft head {self.name} (predicted tokens/s from the kept profile: {rates})"


def shipped_engines(engine, base_model: str | None, load) -> dict:
    """{name: Engine} for every head shipped under models/ other than the one ``engine`` drafts
    with, each on ``engine``'s target, when the target is the embedded model they were trained
    for. ``load(folder)`` builds an engine for a head folder on that target."""
    folder = getattr(engine.head, "folder", None)       # None: a head built in memory, not a shipped one
    if base_model not in loading.EMBEDDED_ALIASES or folder is None:
        return {}
    mine = Path(folder).resolve()
    engines = {}
    for name, folder in loading.SHIPPED_HEADS.items():   # read here: tests point it elsewhere
        if not (folder / "config.json").is_file() or folder.resolve() == mine:
            continue
        try:
            engines[name] = load(folder)
        except ValueError:       # made for another target (a server run on a test model)
            continue
    return engines


def predicted_tokens_per_s(engine, probe_ms: dict | None = None) -> float | None:
    """The tokens/s the kept profile predicts for this engine's best dynamic tree; None when
    this head has no kept calibration yet. (Where no head's tree beats vanilla, the auto tree
    decodes vanilla whichever head is chosen.)"""
    _, choice = choose_tree(engine, measure=False, probe_ms=probe_ms)
    return None if choice is None else choice.predicted_tokens_per_s


def choose_head(engines: dict, probe_ms: dict | None = None, default: str = DEFAULT_HEAD_KIND) -> HeadChoice:
    """The head among ``engines`` ({name: Engine}, ``default`` among them) with the highest
    predicted tokens/s; ``default`` unless it and another head both have a prediction."""
    predicted = {name: predicted_tokens_per_s(e, probe_ms) for name, e in engines.items()}
    rated = {n: p for n, p in predicted.items() if p is not None}
    name = default
    if default in rated and len(rated) > 1:
        name = max(rated, key=lambda n: (rated[n], n == default))     # a tie keeps the default
    return HeadChoice(name, predicted)
