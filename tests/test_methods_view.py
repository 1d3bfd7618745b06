"""The page's method comparison (app/ui/methods.py): the runs take turns in chunks, every
method's greedy output equals vanilla's, the table and the literature table say so, and a bad
choice of methods is refused in one line before any model work."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from app.engine.engine import Engine
from app.ui import methods
from app.ui.race import round_robin
from app.ui.session import Session
from app.ui.settings import AppContext, ServerConfig
from app.engine.drafters.registry import DEFAULT_HEAD_KIND, DRAFTERS, HEAD_KINDS, METHODS
from app.viz.methods import LITERATURE, METHOD_COLOURS, METHOD_NAMES
from tests.tiny import trained_medusa

PROMPT = "w5 w17 w33 w90 w5 w17"


class _Step:
    type = "step"

    def __init__(self, n):
        self.new_tokens = [0] * n


class _Summary:
    type = "summary"


def _run(sizes):
    yield from (_Step(n) for n in sizes)
    yield _Summary()


def test_round_robin_takes_turns_of_chunk_tokens_and_drains_every_run():
    runs = {"a": _run([1] * 10), "b": _run([3, 3, 3]), "c": _run([])}
    order = [(name, ev.type) for name, ev in round_robin(runs, chunk_tokens=4)]
    names = [n for n, t in order if t == "step"]
    # a: 4 tokens, b: 6 (two steps to pass 4), c: ends; then a: 4 more, b: its last step (9 >= 8); then a: 2
    assert names == ["a"] * 4 + ["b"] * 2 + ["a"] * 4 + ["b"] + ["a"] * 2
    assert sorted(n for n, t in order if t == "summary") == ["a", "b", "c"]
    with pytest.raises(ValueError, match="chunk_tokens"):
        next(round_robin({"a": _run([1])}, chunk_tokens=0))


def test_round_robin_closes_every_run_when_closed():
    closed = []

    def run(name):
        try:
            yield from _run([1] * 100)
        finally:
            closed.append(name)

    gen = round_robin({"a": run("a"), "b": run("b")}, chunk_tokens=2)
    next(gen)
    next(gen)
    next(gen)                      # b has started too
    gen.close()
    assert sorted(closed) == ["a", "b"]


@pytest.fixture(scope="module")
def ctx(tiny):
    target, head = tiny
    engine = Engine(target, head, medusa=trained_medusa(target))
    return AppContext(engine, ServerConfig(max_new_tokens=64, max_prompt_chars=200, update_interval_s=0.0), "tiny")


def test_every_method_decodes_the_prompt_losslessly_in_turns(ctx):
    chosen = ["vanilla", "pld", "medusa", "dynamic"]
    views = list(methods.compare_methods(ctx, Session(), PROMPT, chosen, 48))
    final = views[-1]
    assert final["methods_status"].startswith("done: 4 methods")
    table = [line for line in final["methods_table"].splitlines() if line.startswith("|")]
    rows = {line.split(" | ")[0].strip("| "): line for line in table[2:]}
    # the ratios carry their chunk range, and the note says which differences are noise
    assert "Ranges: the lowest and highest ratio over the turns" in final["methods_table"]
    assert set(rows) == {METHOD_NAMES[m] for m in chosen}
    for m in ("pld", "medusa", "dynamic"):
        assert rows[METHOD_NAMES[m]].rstrip(" |").endswith("yes"), rows[METHOD_NAMES[m]]   # = vanilla's output
    assert "| eagle2 |" in rows[METHOD_NAMES["dynamic"]] and "| medusa |" in rows[METHOD_NAMES["medusa"]]
    # one tree per drafting method, at the most instructive step; the race has one line per method
    trees = [a.text for a in final["methods_trees"].layout.annotations]
    assert [t.split("</b>")[0].removeprefix("<b>") for t in trees] == [METHOD_NAMES[m] for m in chosen[1:]]
    assert {tr.name for tr in final["methods_race"].data} == {METHOD_NAMES[m] for m in chosen}
    # the literature table: every published method, this run's ratio where it ran
    lit = final["methods_literature"]
    assert all(METHOD_NAMES[m] in lit for m in LITERATURE)
    assert lit.count("not run") == len(LITERATURE) - len(chosen)
    here = [line.rstrip(" |").rsplit("|", 1)[1] for line in lit.splitlines()[2:]]
    assert sum("×" in cell for cell in here) == len(chosen)
    # while running, the table shows what is not finished yet
    assert any("…" in v["methods_table"] for v in views[:-1])


def test_a_stopped_comparison_ends_at_its_next_update(ctx):
    session = Session()
    gen = methods.compare_methods(ctx, session, PROMPT, ["vanilla", "pld"], 64)
    next(gen)
    session.request_stop()
    views = list(gen)
    assert len(views) == 1 and views[0]["methods_status"].startswith("stopped")


@pytest.mark.parametrize("chosen, message", [
    (["vanilla"], "must be 2 to 4 methods"),
    (["vanilla", "pld", "lookahead", "medusa", "dynamic"], "must be 2 to 4 methods"),
    (["vanilla", "eagle9"], "eagle9"),
    ("vanilla,pld", "list of method names"),
])
def test_a_bad_choice_of_methods_is_refused_in_one_line(ctx, chosen, message):
    with pytest.raises(ValueError, match=message) as err:
        methods.check_compare(ctx, PROMPT, chosen, 32)
    assert str(err.value).startswith("methods") and "\n" not in str(err.value)


def test_methods_without_their_weights_are_not_offered(tiny):
    target, head = tiny
    bare = AppContext(Engine(target, None), ServerConfig(), "tiny")
    assert methods.available_methods(bare) == ["vanilla", "pld", "lookahead"]
    with pytest.raises(ValueError, match="medusa"):
        methods.check_compare(bare, PROMPT, ["vanilla", "medusa"], 32)
    assert methods.default_methods(bare) == ["vanilla", "pld"]


def test_the_prompt_and_token_count_get_the_generate_checks(ctx):
    with pytest.raises(ValueError, match="^prompt"):
        methods.check_compare(ctx, "", ["vanilla", "pld"], 32)
    with pytest.raises(ValueError, match="^max_new_tokens"):
        methods.check_compare(ctx, PROMPT, ["vanilla", "pld"], 10_000)


def test_another_shipped_head_races_beside_the_servers_own(tmp_path, monkeypatch):
    """An EAGLE-3 head shipped beside the EAGLE-2 one is offered as ``dynamic@eagle3`` (by name,
    never a path), drafts with its own engine on the same target, and is lossless too."""
    from app.engine import loading
    from app.engine.factory import load_engine
    from app.ui.settings import other_shipped_heads
    from tests.tiny import eagle3_target, random_eagle3_head, random_head

    target = eagle3_target(0)
    random_head(target).save(tmp_path / "eagle2")
    random_eagle3_head(target).save(tmp_path / "eagle3")
    monkeypatch.setattr(loading, "SHIPPED_HEADS", {"eagle2": tmp_path / "eagle2", "eagle3": tmp_path / "eagle3",
                                                   "missing": tmp_path / "nothing-here"})
    engine, _ = load_engine(draft_model=str(tmp_path / "eagle2"), target=target)
    heads = other_shipped_heads(engine, ServerConfig())
    assert list(heads) == ["eagle3"] and heads["eagle3"].target is target and heads["eagle3"].drafter == "eagle3"
    assert other_shipped_heads(engine, ServerConfig(base_model=str(tmp_path))) == {}   # trained for another target
    ctx = AppContext(engine, ServerConfig(max_new_tokens=64, max_prompt_chars=200, update_interval_s=0.0), "tiny",
                     heads=heads)
    assert methods.available_methods(ctx)[-2:] == ["dynamic", "dynamic@eagle3"]
    final = list(methods.compare_methods(ctx, Session(), PROMPT, ["vanilla", "dynamic", "dynamic@eagle3"], 24))[-1]
    rows = {line.split(" | ")[0].strip("| "): line for line in final["methods_table"].splitlines()[2:]}
    assert "| eagle2 |" in rows["EAGLE-2 (dynamic tree)"] and "| eagle3 |" in rows["EAGLE-3 (dynamic tree)"]
    assert all(rows[n].rstrip(" |").endswith("yes") for n in ("EAGLE-2 (dynamic tree)", "EAGLE-3 (dynamic tree)"))
    with pytest.raises(ValueError, match="dynamic@/tmp"):
        methods.check_compare(ctx, PROMPT, ["vanilla", "dynamic@/tmp"], 24)


def _compare_choices() -> list[str]:
    """Every method *Compare methods* can offer: a server with every drafter's weights and a
    shipped head of every kind (``methods.available_methods`` itself, on a stand-in context)."""
    others = {kind: None for kind in HEAD_KINDS if kind != DEFAULT_HEAD_KIND}
    ctx = SimpleNamespace(engine=SimpleNamespace(**{d.weights: object() for d in DRAFTERS if d.weights}),
                          has_head=True, heads=others)
    return methods.available_methods(ctx)


def test_every_method_on_the_page_has_its_name_colour_and_papers_numbers_in_the_registry():
    from app.engine import spec
    from app.viz import style

    compare = _compare_choices()
    assert {d.method for d in DRAFTERS} | {"vanilla", "static", "dynamic", "dynamic@eagle3"} <= set(compare)
    on_page = set(compare) | set(spec.PAGE_METHODS) | set(spec.METHODS)   # the comparison, the method choices
    missing = sorted(m for m in on_page if m not in METHODS)
    assert not missing, f"methods the page shows without an entry in app.engine.drafters.registry: {missing}"
    for method in on_page:
        facts = METHODS[method]
        assert facts.name.strip(), method
        assert re.fullmatch(r"#[0-9a-f]{6}", facts.colour), (method, facts.colour)
    for method in compare:   # the literature table lists each with its paper and Spec-Bench
        pub = METHODS[method].published
        assert pub is not None and pub.paper and pub.paper_speedup and pub.spec_bench, method
        assert method == "vanilla" or pub.citation.startswith("https://"), method
    colours = [f.colour for f in METHODS.values()]
    assert len(set(colours)) == len(colours), "two methods share a colour"
    # the views read the registry, not copies of it
    assert METHOD_NAMES == {m: f.name for m, f in METHODS.items()}
    assert METHOD_COLOURS == {m: f.colour for m, f in METHODS.items()}
    assert set(LITERATURE) == {m for m, f in METHODS.items() if f.published} >= set(compare)
    assert (style.VANILLA, style.EAGLE) == (METHODS["vanilla"].colour, METHODS["dynamic"].colour)
    assert all(methods.choice_label(m).startswith(METHODS[m].name) for m in compare)


def test_the_table_says_when_an_output_differs_from_vanillas():
    from app.engine.events import RunSummary
    from app.viz.methods import methods_table

    def summary(ids, tps):
        return RunSummary("x", len(ids), 1.0, tps, len(ids), 1.5, [], ids, "")

    table = methods_table({"vanilla": summary([1, 2, 3], 10.0), "pld": summary([1, 2, 3], 15.0),
                           "lookahead": summary([1, 2, 4], 5.0)}, {"pld": "pld", "lookahead": "lookahead"})
    rows = table.splitlines()[2:]
    assert rows[1].endswith("| 1.50× | yes |") and rows[2].endswith("| 0.50× | **no** |"), rows


def test_the_validators_result_is_reused_for_the_same_choice_of_methods(ctx):
    """The page validates a comparison once: what its validator accepted (a list of methods
    among the values) is found again by the event for the same values, and only for them."""
    from app.ui.requests import Checked

    checked = Checked()
    values = [PROMPT, ["vanilla", "pld"], 32]
    result = methods.check_compare(ctx, *values)
    checked.put(values, result)
    assert checked.get([PROMPT, ["vanilla", "pld"], 32]) is result
    assert checked.get([PROMPT, ["vanilla", "lookahead"], 32]) is None
    assert checked.get([PROMPT, ("vanilla", "pld"), 32]) is None      # another type: not the same values
