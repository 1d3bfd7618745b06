"""One click, one tokenisation: the page's events (through the functions Gradio calls, the
validator first, then the event) encode the prompt once and pass the ids on, through the
checks, the run, the race, step mode, the method comparison and the explorer. Real tiny-model
engine, CPU; the tokenizer is wrapped to count its calls."""
from __future__ import annotations

import copy
import dataclasses

import pytest

from app.engine.engine import Engine
from app.engine.spec import SETTINGS as SPEC_SETTINGS
from app.ui.blocks import build_demo
from app.ui.session import Session
from app.ui.settings import AppContext, ServerConfig

PROMPT = "w5 w17 w33 w90 w5 w17"
SETTINGS = dict(prompt=PROMPT, method="dynamic", max_new_tokens=12, temperature=0.0, depth=3, top_k=2,
                total_tokens=4)
# a chat template that keeps the text as it is, so the tiny model's ids stay its words
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


class CountingTokenizer:
    """The target's tokenizer, counting the calls that encode text (``__call__``, ``encode``,
    ``apply_chat_template``); everything else is the tokenizer's own."""

    def __init__(self, tok):
        self._tok = tok
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._tok(*args, **kwargs)

    def encode(self, *args, **kwargs):
        self.calls += 1
        return self._tok.encode(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        self.calls += 1
        return self._tok.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


@pytest.fixture(scope="module", params=["chat template", "plain"])
def page(request, tiny):
    """(the page's events by API name, the counting tokenizer), with and without a chat template."""
    target, head = tiny
    tok = copy.deepcopy(target.tokenizer)
    tok.chat_template = TEMPLATE if request.param == "chat template" else None
    counter = CountingTokenizer(tok)
    ctx = AppContext(Engine(dataclasses.replace(target, tokenizer=counter), head),
                     ServerConfig(max_new_tokens=64, max_prompt_chars=200, update_interval_s=0.0), "tiny")
    fns = {f.api_name: f for f in build_demo(ctx, demos={}).fns.values() if f.api_name}
    return fns, counter


def settings() -> list:
    """The settings' values in the order the events take them: ``SETTINGS`` over the defaults."""
    return [SETTINGS.get(s.name, s.default) for s in SPEC_SETTINGS]


def click(fn, *values, session: Session) -> list:
    """What the page does on a click: the event's validator, then (when it passes) the event."""
    verdicts = fn.validator(*values, session)
    assert all(v.get("is_valid", True) for v in verdicts), verdicts
    return list(fn.fn(*values, session))


def test_a_generate_click_tokenises_the_prompt_once(page):
    fns, counter = page
    values = settings()
    session = Session()
    counter.calls = 0
    outs = click(fns["generate"], *values, False, True, session=session)       # race on
    assert session.summary is not None and session.race_vanilla is not None and outs
    assert counter.calls == 1
    counter.calls = 0
    click(fns["generate"], *values, True, True, session=session)               # step mode: paused
    while session.stepper is not None:
        list(fns["step"].fn(session))
    assert session.summary is not None and session.race_vanilla is not None   # then raced vanilla
    assert counter.calls == 1


def test_a_methods_comparison_and_a_sweep_tokenise_the_prompt_once(page):
    fns, counter = page
    session = Session()
    counter.calls = 0
    click(fns["compare_methods"], PROMPT, ["vanilla", "pld", "dynamic"], 12, session=session)
    assert counter.calls == 1
    values = settings()
    counter.calls = 0
    outs = click(fns["explore"], "depth", 2, 3, 2, *values, session=session)   # 2 values x 2 runs
    assert "explorer_status" in dict(zip(("explorer_plot", "explorer_status"), outs[-1]))
    assert counter.calls == 1
