"""Figure and HTML builders on real step records from the tiny engine (no server)."""
from __future__ import annotations

from dataclasses import replace

import plotly.graph_objects as go
import pytest

from app.engine.config import TreeConfig
from app.engine.engine import Engine
from app.engine.events import DraftTreeRecord, StepEvent, acceptance_by_depth
from app.viz import insights, race, style
from app.viz import tree as tree_view
from app.viz.phases import phase_account
from app.viz.stream import split_step_text, stream_html
from app.viz.tree import tree_figure


@pytest.fixture(scope="module")
def run(tiny):
    """Step records and summary of one real dynamic-tree run on the tiny model."""
    target, head = tiny
    events = list(Engine(target, head).generate(prompt_ids=[5, 17, 33, 90], max_new_tokens=40,
                                                tree=TreeConfig(depth=4, top_k=4, total_tokens=12)))
    return events[:-1], events[-1]


def test_tree_figure_draws_every_status(run):
    """Every node is filled with its confidence; the status is its outline, shape and edge."""
    steps, _ = run
    step = max(steps[1:], key=lambda s: len(s.accepted))   # a step with an accepted path
    assert step.accepted, "the trained tiny head should get some tokens accepted"
    tree = step.tree
    assert {"accepted", "rejected"} <= set(tree.status)
    fig = tree_figure(step)
    nodes = next(t for t in fig.data if t.name == "nodes")
    drawn = list(nodes.customdata)
    assert sorted(drawn) == list(range(len(tree)))
    assert (nodes.marker.cmin, nodes.marker.cmax) == (-3.0, 0.0) and nodes.marker.colorbar is not None
    # the fill is the node's own q (log scale) for EVERY node, rejected and unreached ones included
    from app.viz.tree import q_colour
    assert list(nodes.marker.color) == pytest.approx([q_colour(tree.q[i]) for i in drawn])
    assert nodes.marker.opacity == 1.0
    for j, i in enumerate(drawn):
        status = tree.status[i]
        assert f"status: {status}" in nodes.hovertext[j] and "q (the head's probability" in nodes.hovertext[j] and "p (the target's probability" in nodes.hovertext[j]
        symbol, size, outline, width, _ = tree_view.NODE_STYLE[status]
        assert (nodes.marker.symbol[j], nodes.marker.line.color[j]) == (symbol, outline)
    green = next(t for t in fig.data if t.name == "accepted edges")
    assert sum(x is None for x in green.x) == len(step.accepted)
    bonus = next(t for t in fig.data if t.name == "bonus")
    assert bonus.marker.symbol == "diamond"
    assert fig.layout.uirevision == "tree"


def test_fast_figures_are_valid_plotly(run):
    """The live figures skip plotly's validation for speed (style.fast_figure); validating
    their dicts here catches a misspelt property or a bad value all the same."""
    import plotly.graph_objects as go

    steps, _ = run
    vanilla = StepEvent(step=0, method="vanilla", tree=None, accepted=[], bonus=7, new_tokens=[7], text="x")
    figures = [tree_figure(s) for s in steps] + [tree_figure(None), tree_figure(vanilla),
                                                  race.race_figure(steps, steps[:3]), race.race_figure([], None)]
    for fig in figures:
        go.Figure(fig.to_dict())        # raises ValueError on anything plotly would refuse
    with pytest.raises(ValueError):
        go.Figure(style.fast_figure([dict(type="scatter", markr=dict(size=3))], {}).to_dict())


def test_tree_figure_without_a_tree():
    vanilla = StepEvent(step=0, method="vanilla", tree=None, accepted=[], bonus=7, new_tokens=[7], text="x")
    assert "vanilla" in tree_figure(vanilla).layout.annotations[0].text
    prefill = StepEvent(step=0, method="dynamic", tree=None, accepted=[], bonus=7, new_tokens=[7], text="x", prefill=True)
    assert "prefill" in tree_figure(prefill).layout.annotations[0].text
    assert tree_figure(None).layout.annotations[0].text == "no step yet"


def test_stream_marks_origin_and_steps(run):
    steps, summary = run
    for s in steps:
        drafted, bonus = split_step_text(s)
        assert drafted + bonus == s.text
    html = stream_html(steps, highlight=3)
    assert html.count('class="step') == len(steps)
    assert 'title="step 3"' in html and 'class="step current"' in html
    assert html.count("tok bonus") == sum(1 for s in steps if len(s.new_tokens) > len(s.accepted) and s.text)
    assert "tok draft" in html
    assert stream_html(steps, upto=1).count('class="step') == 2


def test_stream_escapes_hostile_text():
    evil = StepEvent(step=0, method="vanilla", tree=None, accepted=[], bonus=1, new_tokens=[1],
                     text='<script>alert("x")</script>')
    html = stream_html([evil])
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_race_curves_and_speedup(run):
    steps, summary = run
    xs, ys = race.curve(steps)
    assert xs == sorted(xs) and ys[-1] == summary.new_tokens - len(steps[0].new_tokens)   # the prefill is untimed
    assert race.speedup(steps, steps) == pytest.approx(1.0)
    fig = race.race_figure(steps, steps[:3])
    assert [t.name for t in fig.data] == ["EAGLE", "vanilla"]


def test_insight_figures_agree_with_records(run):
    steps, summary = run
    assert list(insights.depth_figure(steps).data[0].y) == pytest.approx(acceptance_by_depth(steps))
    centres, rate, counts = insights.calibration_bins(steps)
    assert counts.sum() == sum(len(s.tree) for s in steps if s.tree is not None)
    per_step = insights.tokens_per_step_figure(steps)
    assert sum(per_step.data[0].y) + sum(per_step.data[1].y) == summary.new_tokens
    assert len(insights.calibration_figure(steps).data) == 2


def test_calibration_bins_by_hand():
    tree = DraftTreeRecord(root_token=0, tokens=[1, 2, 3], texts=["a", "b", "c"], parents=[-1, -1, 0],
                           depths=[1, 1, 2], q=[0.9, 0.05, 0.9], confidence=[0.9, 0.05, 0.81], p=None,
                           status=["accepted", "rejected", "rejected"])
    step = StepEvent(step=0, method="dynamic", tree=tree, accepted=[1], bonus=4, new_tokens=[1, 4], text="ad")
    centres, rate, counts = insights.calibration_bins([step])
    assert counts[0] == 1 and counts[8] == 1 and counts[9] == 1
    assert rate[9] == 1.0 and rate[8] == 0.0


def test_explorer_figure_marks_the_best():
    fig = insights.explorer_figure("depth", [{"value": 2, "mean_accepted": 1.5, "tokens_per_s": 10.0},
                                             {"value": 4, "mean_accepted": 2.5, "tokens_per_s": 14.0}])
    star = fig.data[-1]
    assert star.marker.symbol == "star" and list(star.x) == [4]


def test_phase_account_names_the_three_phases(run):
    steps, _ = run
    s = steps[1]
    text = phase_account(s, len(steps))
    assert f"EAGLE head proposed **{len(s.tree)} nodes in {max(s.tree.depths)} level" in text
    assert f"one target forward over {len(s.tree) + 1} tokens" in text
    assert f"{len(s.accepted)} draft token" in text
    assert "No step" in phase_account(None)
    # the prefill: the head's read of the prompt is told (with its time) where a head drafts
    assert steps[0].prefill and steps[0].method == "dynamic"
    assert "The head reads the prompt**: " in phase_account(steps[0], len(steps) - 1)
    assert f"({steps[0].draft_ms:.1f} ms)" in phase_account(steps[0], len(steps) - 1)
    vanilla = StepEvent(step=0, method="vanilla", tree=None, accepted=[], bonus=7, new_tokens=[7], text="x",
                        prefill=True, verify_ms=3.0)
    assert "reads the prompt**" not in phase_account(vanilla, 4)
    ended = StepEvent(step=0, method="dynamic", tree=None, accepted=[], bonus=7, new_tokens=[7], text="x",
                      prefill=True, verify_ms=3.0)        # the answer's only token: the head read nothing
    assert "reads the prompt**" not in phase_account(ended, 0)


def test_draft_account_tells_the_heads_nodes_from_a_lookup_branch_and_names_other_drafters():
    """The head's levels are its own nodes' depth: a prompt-lookup branch beside them is
    counted apart, and a step drafted by prompt lookup alone does not speak of a head."""
    tree = DraftTreeRecord(root_token=0, tokens=[1, 2, 3, 4, 5], texts=list("abcde"), parents=[-1, -1, 0, 2, 3],
                           depths=[1, 1, 2, 3, 4], q=[0.9, 0.05, 1.0, 1.0, 1.0], confidence=[0.9, 0.05, 1, 1, 1],
                           p=None, status=["accepted", "rejected", "accepted", "accepted", "rejected"],
                           source=[None, None, "pld", "pld", "pld"])
    step = StepEvent(step=3, method="dynamic", tree=tree, accepted=[1, 3, 4], bonus=9, new_tokens=[1, 3, 4, 9],
                     text="acdx", draft_ms=0.8, drafter="eagle2")
    text = phase_account(step, 10)
    assert "the EAGLE head proposed **2 nodes in 1 level**" in text
    assert "prompt lookup added **3 more** beside them" in text
    assert "one target forward over 6 tokens" in text
    pld = replace(step, method="pld", drafter="pld",
                  tree=replace(tree, source=None, parents=[-1, 0, 1, 2, 3], depths=[1, 2, 3, 4, 5]))
    text = phase_account(pld, 10)
    assert "the prompt lookup proposed **5 nodes in 5 levels** (copied from" in text and "head" not in text


def test_tree_size_figure_and_text_show_autotunes_choice():
    """The tab "Tree size for this machine": the measured cost curve as measured, every
    candidate drawn once, the star on the chosen tree (the smallest within noise of the
    argmax), and the text naming that same tree, its
    predicted speedup and the candidates best first."""
    from app.engine.autotune import choose_from
    from app.viz.autotune import choice_figure, choice_markdown, chosen_candidate
    from tests.test_autotune import CPU, big_tree_calibration

    choice = choose_from(CPU, big_tree_calibration()).to_dict()
    fig = choice_figure(choice)
    go.Figure(fig.to_dict())                                       # valid plotly
    assert list(fig.data[0].x) == CPU.sizes and list(fig.data[0].y) == CPU.ms
    star = next(t for t in fig.data if t.name.startswith("chosen"))
    best = max(choice["candidates"], key=lambda c: c["tokens_per_s"])
    chosen = chosen_candidate(choice)
    assert (star.x[0], star.y[0]) == (chosen["total_tokens"], chosen["tokens_per_s"])
    drawn = sum(len(t.x) for t in fig.data[1:] if t is not star)
    assert drawn == len(choice["candidates"])
    text = choice_markdown(choice)
    tree = choice["tree"]
    assert f"total_tokens {tree['total_tokens']}, depth {tree['depth']}, top_k {tree['top_k']}" in text
    assert f"**{choice['predicted_speedup']:.2f}×**" in text
    speeds = [float(row.split("|")[5]) for row in text.splitlines() if row.startswith("| ") and "tokens/s" not in row]
    assert speeds[:5] == sorted(speeds[:5], reverse=True) and speeds[0] == round(best["tokens_per_s"], 1)
    assert "use method vanilla" not in text or not choice["beats_vanilla"]


def test_tree_size_text_says_when_no_tree_pays():
    from app.engine.autotune import Calibration, choose_from
    from app.viz.autotune import choice_markdown
    from tests.test_autotune import CPU

    never = [[1, 0.5, 0], [2, 0.3, 0]]                              # nothing is ever accepted
    cal = Calibration(steps=[never, never], draft_ms=[20.0, 20.0], verify_ms=[90.0, 90.0], step_ms=[115.0, 115.0],
                      vanilla_step_ms=[60.0, 60.0], depth=2, top_k=1, total_tokens=2)
    choice = choose_from(CPU, cal).to_dict()
    assert not choice["beats_vanilla"]
    assert "use method vanilla" in choice_markdown(choice)


def test_phase_account_explains_each_checked_node_by_the_rule_in_force(tiny):
    """Greedy: every checked node is the target's top token (kept) or not (refused, with the
    token the target chose); sampled chains: min(1, p/q) in the step's own numbers."""
    from app.engine.config import SamplingConfig
    from app.engine.verify import GREEDY, SAMPLED_CHAIN, SAMPLED_TREE
    from app.viz.phases import acceptance_rule

    target, head = tiny
    engine = Engine(target, head)
    *steps, _ = engine.generate(prompt_ids=[5, 17, 33, 90], max_new_tokens=40,      # small trees: all explained
                                tree=TreeConfig(depth=2, top_k=2, total_tokens=4))
    step = next(s for s in steps[1:] if "rejected" in s.tree.status and "accepted" in s.tree.status)
    text = phase_account(step, len(steps))
    assert "**Why** (greedy)" in text
    lines = [x for x in text.splitlines() if x.startswith("- `")]
    tree = step.tree
    assert len(lines) == len(tree) - tree.status.count("unreached")
    assert sum(x.endswith("✓") for x in lines) == len(step.accepted)
    refused = [x for x in lines if x.endswith("✗")]
    assert len(refused) == tree.status.count("rejected")
    assert all("not the target's top token" in x for x in refused)
    *chain_steps, _ = engine.generate(prompt_ids=[5, 17, 33, 90, 4], tree=TreeConfig(method="dynamic", depth=3, top_k=1,
                                                                                     total_tokens=3),
                                      sampling=SamplingConfig(temperature=1.0, seed=5), max_new_tokens=30)
    checked = next(s for s in chain_steps if s.tree and "rejected" in s.tree.status)
    assert checked.rule == SAMPLED_CHAIN
    why = acceptance_rule(checked)
    assert "min(1, p/q)" in why
    i = checked.tree.status.index("rejected")
    expected = min(1.0, checked.tree.p[i] / checked.tree.q[i])
    assert f"min(1, p/q) = {expected:.2f} ✗" in why
    assert acceptance_rule(replace(checked, rule=GREEDY)).startswith("**Why** (greedy)")
    assert step.rule == GREEDY
    # the rule is the one the engine ran, not read off the tree's shape: a top-k tree cut to
    # a chain by its total_tokens was verified as fixed candidates, so no min(1, p/q) is claimed
    *cut, _ = engine.generate(prompt_ids=[5, 17, 33, 90, 4], tree=TreeConfig(method="dynamic", depth=2, top_k=4,
                                                                              total_tokens=2),
                              sampling=SamplingConfig(temperature=1.0, seed=5), max_new_tokens=20)
    chain_shaped = next(s for s in cut if s.tree and len(set(s.tree.depths)) == len(s.tree))
    assert chain_shaped.rule == SAMPLED_TREE
    assert "min(1, p/q)" not in acceptance_rule(chain_shaped)


def test_the_views_load_without_torch():
    """app/viz reads step records only (rule names included, app.engine.events): every view
    module loads in a fresh interpreter without torch, so a page or a notebook drawing saved
    traces does not pay for it."""
    import subprocess
    import sys

    code = ("import importlib, pkgutil, sys, app.viz\n"
            "for m in pkgutil.iter_modules(app.viz.__path__):\n"
            "    importlib.import_module('app.viz.' + m.name)\n"
            "print(sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.'))[:3])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
