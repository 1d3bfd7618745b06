"""The one specification of a request's settings (``app.engine.spec.SETTINGS``) and what is
derived from it: the engine's range checks, which methods each knob shapes (checked against
the tree policies themselves), the page's parser, controls, trace schema and API signature,
and a short message naming the field for any value a stranger can send."""
from __future__ import annotations

import inspect
import math
import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.engine.config import GenerationLimits, SamplingConfig, TreeConfig, check_max_new_tokens, check_prompt
from app.engine.spec import METHODS, SETTING, SETTINGS, TREE_METHODS, shown
from app.engine.engine import Engine
from app.engine.tree import grow_tree
from app.ui import handlers, traces
from app.ui.requests import SETTING_NAMES, SWEEP_KNOBS, TREE_KNOBS, build_request, tree_preset
from app.ui.session import Session
from app.ui.settings import AppContext, ServerConfig

PROMPT = "w5 w17 w33 w90"
VALID = dict(prompt=PROMPT, method="dynamic", max_new_tokens=8, temperature=0.0, top_p=1.0, seed=0,
             depth=3, top_k=2, total_tokens=6, tau_high=0.5, tau_low=0.05, min_confidence=0.0, adapt=False,
             lookup=2)
MAX_MESSAGE = 400   # characters: any refusal, whatever the value it echoes


@pytest.fixture(scope="module")
def ctx(tiny):
    target, head = tiny
    return AppContext(Engine(target, head), ServerConfig(max_new_tokens=64, max_prompt_chars=200,
                                                          update_interval_s=0.0), "tiny")


# --- the specification and the engine's checks ----------------------------------------------

def _checker(name):
    """The engine's own check of setting ``name``: the config class that holds it."""
    s = SETTING[name]
    if name == "prompt":
        return check_prompt
    if name == "max_new_tokens":
        return check_max_new_tokens
    cls = TreeConfig if s.owner == "tree" else SamplingConfig
    return lambda v: cls(**{name: v})


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.kind in ("int", "float")], ids=lambda s: s.name)
def test_the_config_classes_check_each_range_from_the_specification(s):
    check = _checker(s.name)
    for ok in (s.lo, s.hi, s.default):
        check(ok)
    tiny_step = 1 if s.kind == "int" else 1e-9
    for bad in (s.lo - tiny_step, s.hi + tiny_step, "1", None, True, [1]) + ((math.nan, math.inf) if s.kind == "float" else (1.5,)):
        with pytest.raises(ValueError) as refused:
            check(bad)
        assert str(refused.value).split()[0] == s.name


def test_defaults_live_in_the_specification():
    assert TreeConfig() == TreeConfig(**{s.name: s.default for s in SETTINGS if s.owner == "tree"})
    assert SamplingConfig() == SamplingConfig(**{s.name: s.default for s in SETTINGS if s.owner == "sampling"})
    assert set(SETTING["method"].choices) == set(METHODS)
    assert traces.SETTING_KEYS == SETTING_NAMES
    # the page's tree knobs, the drafters' own (prompt lookup / lookahead; q's meaning) and
    # the prompt-lookup branch beside the head
    assert traces.TREE_CONFIG_KEYS == {"method", *TREE_KNOBS, "ngram", "window", "pool", "lookup", "q"}


@pytest.mark.parametrize("name, value", [
    ("temperature", 1e-38), ("temperature", 5e-324), ("temperature", 0.005), ("top_p", 1e-300), ("top_p", 0.0),
])
def test_underflowing_temperatures_and_top_p_are_refused(name, value):
    """Below the specification's minimum the sampler is left with no distribution (a
    temperature of 1e-38 overflows the logits, a top_p of 1e-300 is 0 in float32)."""
    with pytest.raises(ValueError, match=f"^{name} must be .*0.01"):
        SamplingConfig(**{name: value})
    SamplingConfig(temperature=0.0)           # greedy
    SamplingConfig(temperature=0.01, top_p=0.01)


def test_sampling_at_the_smallest_temperature_and_top_p_runs(tiny):
    target, head = tiny
    for method in ("dynamic", "chain", "vanilla"):
        *_, summary = Engine(target, head).generate(
            prompt_ids=[5, 17, 33], tree=TreeConfig(method=method, depth=3, top_k=3, total_tokens=8),
            sampling=SamplingConfig(temperature=0.01, top_p=0.01, seed=1), max_new_tokens=6)
        assert summary.new_tokens == 6


@pytest.mark.parametrize("value, echo", [
    (10**400, "an integer of about 401 digits"), ("x" * 1_000_000, "'xxx"), (list(range(10**5)), "[0, 1, 2, 3, ...]"),
    ({"a": "b" * 10**6}, "{'a': 'bbbb"),
])
def test_messages_echo_a_short_value(value, echo):
    assert len(shown(value)) <= 60 and shown(value).startswith(echo)
    with pytest.raises(ValueError) as refused:
        SamplingConfig(seed=value)
    assert len(str(refused.value)) < MAX_MESSAGE and str(refused.value).startswith("seed must be")


def test_a_lone_surrogate_in_the_prompt_is_refused():
    with pytest.raises(ValueError, match="^prompt must be valid Unicode text"):
        check_prompt("w5 \ud800 w17")


# --- which methods each knob shapes ------------------------------------------------------------

# Values of each knob to grow trees with (tau_low stays below tau_high).
KNOB_VALUES = {"depth": (1, 2, 3, 5), "top_k": (1, 2, 4), "total_tokens": (1, 3, 8, 30),
               "tau_high": (0.1, 0.3, 0.6, 0.95), "tau_low": (0.0, 0.05, 0.2, 0.5),
               "min_confidence": (0.0, 0.05, 0.2, 0.5)}


def _propose(tree, frontier, depth):
    """A stand-in draft model: each frontier node's 8 best children with made-up but varied
    probabilities (seeded by position, so every tree grown from it is reproducible)."""
    probs, ids = [], []
    for node in frontier:
        rng = random.Random(depth * 1000 + node)
        raw = sorted((rng.random() ** 2 for _ in range(8)), reverse=True)
        total = sum(raw) * rng.uniform(1.0, 1.6)
        probs.append([r / total for r in raw])
        ids.append([rng.randrange(3, 256) for _ in range(8)])
    return probs, ids


@pytest.mark.parametrize("method", TREE_METHODS)
def test_applicability_matches_what_the_tree_policies_read(method):
    """A knob 'applies' to a method exactly when changing it can change the grown tree
    (``app.engine.tree``): what the page disables must really do nothing."""
    base = dict(method=method, depth=4, top_k=3, total_tokens=12, tau_high=0.6, tau_low=0.01, min_confidence=0.0)
    for knob in TREE_KNOBS:
        if knob == "lookup":
            continue    # hung beside the grown tree by Engine.draft: test_lookup_branch.py
        trees = set()
        for value in KNOB_VALUES[knob]:
            tree = grow_tree(TreeConfig(**{**base, knob: value}), _propose)
            trees.add((tuple(tree.tokens), tuple(tree.parents)))
        assert (len(trees) > 1) == SETTING[knob].applies_to(method), (method, knob)
        assert SETTING[knob].applies_to(method) or SETTING[knob].why_not(method).startswith(knob)


def test_no_tree_knob_applies_to_vanilla():
    assert not any(SETTING[k].applies_to("vanilla") for k in TREE_KNOBS)
    assert SETTING["tau_high"].why_not("dynamic") == "tau_high applies to the threshold method only"
    assert all(SETTING[s].applies_to(m) for s in ("temperature", "top_p", "seed", "max_new_tokens") for m in METHODS)


def test_an_unused_tau_pair_does_not_refuse_another_method():
    """The pair tau_low <= tau_high only binds the threshold method; elsewhere the page has
    disabled both knobs, so a refusal there could not be corrected."""
    TreeConfig(method="dynamic", tau_low=0.9, tau_high=0.1)
    with pytest.raises(ValueError, match="^tau_low must be <= tau_high"):
        TreeConfig(method="threshold", tau_low=0.9, tau_high=0.1)


# --- the page's parser, API and controls -----------------------------------------------------

def test_the_request_parser_takes_every_setting_and_the_page_caps():
    limits = GenerationLimits(max_new_tokens=128, max_prompt_chars=200)
    request = build_request(limits, **VALID)
    assert request.settings() == VALID and list(request.settings()) == list(SETTING_NAMES)
    assert build_request(limits, **{**VALID, "depth": 3.0}).tree.depth == 3          # sliders send floats
    assert build_request(limits, prompt=PROMPT).settings() == {**{s.name: s.default for s in SETTINGS},
                                                               "prompt": PROMPT}
    for name, value in (("temperature", 2.5), ("total_tokens", 129)):        # in the engine's range, over the page's
        with pytest.raises(ValueError, match=f"^{name} must be .* on this page"):
            build_request(limits, **{**VALID, name: value})
    with pytest.raises(ValueError, match="is not a setting"):
        build_request(limits, **VALID, temperatur=1.0)


def test_the_api_signature_is_the_specification_in_the_published_order():
    """``gradio_client`` users call /generate and /explore with these names, in this order,
    with these defaults: the signature is built from ``SETTINGS`` and must never drift."""
    from app.ui.blocks import event_signature, page_defaults

    published = ["prompt", "method", "max_new_tokens", "temperature", "top_p", "seed", "depth", "top_k",
                 "total_tokens", "tau_high", "tau_low", "min_confidence", "adapt", "lookup"]
    assert list(SETTING_NAMES) == published
    sig = event_signature(defaults=page_defaults(TreeConfig(depth=3, top_k=2, total_tokens=9)),
                          after=(("step_mode", bool, False), ("session", object, None)))
    params = sig.parameters
    assert list(params) == published + ["step_mode", "session"]
    assert params["prompt"].default is inspect.Parameter.empty
    assert {k: params[k].default for k in published[1:]} == dict(
        method="dynamic", max_new_tokens=96, temperature=0.0, top_p=1.0, seed=0, depth=3, top_k=2, total_tokens=9,
        tau_high=0.5, tau_low=0.05, min_confidence=0.0, adapt=False, lookup=0)
    explore = event_signature(before=(("knob", str), ("start", float), ("stop", float), ("count", int)))
    assert list(explore.parameters) == ["knob", "start", "stop", "count"] + published
    assert all(p.default is inspect.Parameter.empty for p in explore.parameters.values())


def test_controls_follow_the_specification_and_the_method(ctx):
    from app.ui.blocks import SAMPLING_ONLY, applicability, build_demo, sampling_applicability

    blocks = {getattr(c, "elem_id", None): c for c in build_demo(ctx, demos={}).blocks.values()}
    for s in SETTINGS:
        control = blocks[s.name.replace("_", "-")]
        if s.kind in ("int", "float") and s.name != "seed":
            cap = ctx.config.max_new_tokens if s.name == "max_new_tokens" else s.page_hi or s.hi
            assert (control.minimum, control.maximum, control.step) == (s.lo, cap, s.step), s.name
            if s.name in SAMPLING_ONLY:     # greedy at the default temperature 0: disabled, with the note
                assert control.interactive is False and "temperature 0" in control.info, s.name
                continue
            assert control.interactive == s.applies_to("dynamic") and bool(control.info) != s.applies_to("dynamic")
    assert blocks["method"].choices == [(m, m) for m in SETTING["method"].page_choices]
    assert set(SETTING["method"].page_choices) < set(SETTING["method"].choices)   # the engine has more drafters
    assert blocks["seed"].interactive is False and "temperature 0" in blocks["seed"].info
    sampled = dict(zip(SAMPLING_ONLY, sampling_applicability(0.7)))
    assert all(u["interactive"] is True and u["info"] == "" for u in sampled.values())
    greedy = dict(zip(SAMPLING_ONLY, sampling_applicability(0.0)))
    assert all(u["interactive"] is False and "greedy" in u["info"] for u in greedy.values())
    updates = dict(zip(TREE_KNOBS, applicability("chain")))
    assert updates["top_k"]["interactive"] is False and updates["top_k"]["info"] == "top_k applies to the dynamic method only"
    assert updates["depth"]["interactive"] is True and updates["depth"]["info"] == ""


# --- any value a stranger can send -----------------------------------------------------------

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-10**500, max_value=10**500)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec=None, exclude_categories=()), max_size=30)
    | st.sampled_from(["dynamic", "threshold", "chain", "vanilla", "", " ", "1", "\ud800", "total_tokens"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)

# A refusal may name a setting other than the one changed when the two are checked together.
RELATED = {"tau_high": {"tau_low"}, "prompt": {"max_new_tokens"}, "depth": {"max_new_tokens"}}
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


def _named(exc: ValueError, fields: set) -> None:
    message = str(exc)
    assert len(message) < MAX_MESSAGE, message[:200]
    assert message.split()[0] in fields, message


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(SETTING_NAMES + ("step_mode",)), JSONISH, min_size=1, max_size=3),
       method=st.sampled_from(SETTING["method"].page_choices))
@example(changes={"temperature": 10**400}, method="dynamic")           # past float's range
@example(changes={"temperature": 1e-38, "top_p": 1e-300}, method="chain")
@example(changes={"seed": 10**400}, method="dynamic")
@example(changes={"prompt": "w5 \ud800"}, method="dynamic")
@example(changes={"method": "x" * 1_000_000}, method="dynamic")
def test_any_value_in_any_field_is_a_request_or_a_short_message_naming_it(ctx, changes, method):
    """The request parser and the Generate click's checks (what the page's validator runs):
    a valid request, or a ValueError whose first word names a field that was changed."""
    step_mode = changes.pop("step_mode", False)
    raw = {**VALID, "method": method, **changes}
    fields = set(changes) | {"step_mode"} | set().union(*(RELATED.get(k, set()) for k in changes))
    try:
        request = handlers.check_generate(ctx, raw, step_mode)
    except ValueError as exc:
        _named(exc, fields)
        return
    assert request.settings() == build_request(ctx.config.limits, **raw).settings()


@FUZZ
@given(fields=st.fixed_dictionaries({}, optional={f: JSONISH for f in handlers.SWEEP_FIELDS}),
       knob=st.sampled_from(SWEEP_KNOBS), method=st.sampled_from(SETTING["method"].page_choices))
def test_any_sweep_is_a_plan_or_a_short_message_naming_its_field(ctx, fields, knob, method):
    sweep = {"knob": knob, "start": 1, "stop": 3, "count": 2, **fields}
    try:
        plan = handlers.check_explore(ctx, *(sweep[f] for f in handlers.SWEEP_FIELDS), {**VALID, "method": method})
    except ValueError as exc:
        _named(exc, set(fields) | {"knob", "method", "start"})
        return
    assert plan.runs and all(math.isfinite(v) for v, _ in plan.runs)
    assert SETTING[knob].applies_to(method)


@FUZZ
@given(value=JSONISH)
def test_replay_presets_and_demos_take_any_value(finished_session, value):
    for call, field in ((lambda: handlers.replay_view(finished_session, value), "step"),
                        (lambda: tree_preset(value, TreeConfig()), "tree"),
                        (lambda: handlers.load_demo(None, Session(), {}, value), "unknown")):
        try:
            call()
        except ValueError as exc:
            _named(exc, {field})


@pytest.fixture(scope="module")
def finished_session(ctx):
    session = Session()
    list(handlers.generate(ctx, session, **VALID))
    return session


@pytest.mark.parametrize("start, stop, knob", [(1e308, -1e308, "depth"), (-1e308, 1e308, "tau_high"),
                                               (10**30, 1, "total_tokens"), (1e308, 1e308, "temperature")])
def test_extreme_sweeps_are_refused_or_skipped_with_a_message(ctx, start, stop, knob):
    """A sweep from 1e308 to -1e308 once gave "cannot convert float NaN to integer"."""
    try:
        plan = handlers.check_explore(ctx, knob, start, stop, 3, {**VALID, "method": "threshold"})
    except ValueError as exc:
        _named(exc, {"start"})
        return
    assert plan.skipped and all(len(s) < MAX_MESSAGE for s in plan.skipped)


def test_the_explorer_refuses_a_knob_the_method_does_not_use(ctx):
    with pytest.raises(ValueError, match="^knob tau_high does nothing under method dynamic .*threshold method only"):
        next(handlers.explore(ctx, Session(), "tau_high", 0.2, 0.8, 2, **VALID))
    with pytest.raises(ValueError, match="^knob top_k does nothing under method chain"):
        handlers.check_explore(ctx, "top_k", 1, 3, 2, {**VALID, "method": "chain"})
    with pytest.raises(ValueError, match="^method vanilla drafts no tree"):
        handlers.check_explore(ctx, "temperature", 0, 1, 2, {**VALID, "method": "vanilla"})
    assert handlers.check_explore(ctx, "tau_high", 0.2, 0.8, 2, {**VALID, "method": "threshold"}).runs


def test_a_huge_replay_index_shows_the_last_step(finished_session):
    last = len(finished_session.steps) - 1
    assert f"Step {last}" in handlers.replay_view(finished_session, 10**30)["phases"]
    assert "Prefill" in handlers.replay_view(finished_session, -10**400)["phases"]


@pytest.mark.parametrize("name, value", [("total_tokens", 0), ("total_tokens", 500), ("total_tokens", 12.5),
                                         ("depth", 40), ("temperature", 5.0), ("tau_high", 1.5)])
def test_a_value_outside_a_controls_range_is_refused_naming_that_range(name, value):
    """Refusal, not clamping, the same for the page and the API: the message names the range
    the control offers (the field's maximum: 128 nodes, not the engine's 256)."""
    from app.engine.spec import SETTING
    from app.ui.requests import build_request
    from app.ui.settings import ServerConfig

    s = SETTING[name]
    with pytest.raises(ValueError, match=rf"^{name} must be .*{s.page_hi if s.page_hi is not None else s.hi:g}\]"):
        build_request(ServerConfig().limits, prompt="hi", **{name: value})
