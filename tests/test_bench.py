"""`python -m app bench` end to end on a tiny random Llama (real engine, real transformers
generate), plus the pieces it is made of: method parsing, pooling, the markdown table."""
from __future__ import annotations

import json

import pytest

from app.__main__ import main as app_main
from app.bench.prompts import load_suite, parse_suites
from app.bench.report import aggregate, markdown_table
from app.bench.runners import MethodSpec, RunRecord, parse_methods
from app.engine.config import TreeConfig


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    """A tiny target and a briefly trained head saved as folders, as a user would pass them."""
    from tests.tiny import tiny_target, trained_head

    root = tmp_path_factory.mktemp("tiny")
    target = tiny_target()
    target.model.save_pretrained(root / "target")
    target.tokenizer.save_pretrained(root / "target")
    trained_head(target, steps=60).save(root / "head")
    return root


def tiny_suites(folder):
    """Two 2-prompt suites in the tiny tokenizer's words (w3 ... w255): the real sets would
    encode to unknown tokens only, on which a random model repeats one token."""
    import app.bench.prompts as prompts

    folder.mkdir()
    for name, seed in (("alpha", 7), ("beta", 11)):
        rows = [{"question_id": i, "category": name,
                 "turns": [" ".join(f"w{3 + (seed * (i + 1) * j) % 250}" for j in range(12))]} for i in range(3)]
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return prompts


def test_bench_cli_end_to_end(tiny_folders, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(tiny_suites(tmp_path / "eval"), "EVAL_DIR", tmp_path / "eval")
    rc = app_main(["bench", "--quick", "--suite", "alpha,beta", "--max-new-tokens", "8",
                   "--methods", "hf,hf-pld,hf-fp32,vanilla,dynamic,dynamic:8/2/2,dynamic:adaptive",
                   "--warmup-tokens", "2",
                   "--total-tokens", "12", "--depth", "3", "--top-k", "4",
                   "--base-model", str(tiny_folders / "target"), "--draft-model", str(tiny_folders / "head"),
                   "--device", "cpu", "--out", str(out), "--plotly-js", "cdn"])
    assert rc == 0
    stdout = capsys.readouterr().out
    doc = json.loads((out / "results.json").read_text())
    md = (out / "results.md").read_text()
    assert md.strip() == stdout.strip()
    assert "× hf-fp32" in md
    assert "- llama.cpp: not run (the target is not the embedded model" in md     # the optional peer says why not
    # the tables name the target forward they were measured on (which kernels, e.g. AMX tiles)
    assert doc["meta"]["forward"] and f"target forward {doc['meta']['forward']}," in md
    # ... and the host's memory phase beside the load average: a copy's GB/s at start and end
    copies = doc["meta"]["copy_gbps_start"], doc["meta"]["copy_gbps_end"]
    assert all(0.1 < gbps < 10_000 for gbps in copies)
    assert f"copy bandwidth at start {copies[0]}, at end {copies[1]} GB/s" in md
    assert (out / "plots.html").stat().st_size > 1000
    assert "dynamic:adaptive: steps by tree" in (out / "plots.html").read_text()

    labels = ["hf", "hf-pld", "hf-fp32", "vanilla", "dynamic", "dynamic:8/2/2", "dynamic:adaptive"]
    assert list(doc["summary"]) == ["alpha", "beta", "all"]
    assert len(doc["runs"]) == 2 * 2 * len(labels)       # 2 suites x 2 prompts x methods
    for suite, table in doc["summary"].items():
        assert list(table) == labels
        assert f"## {suite}" in md
        for label, s in table.items():
            assert s["runs"] == (4 if suite == "all" else 2)
            assert s["tokens_per_s"] > 0 and s["tau"] >= 1.0 and s["prefill_ms"] > 0
            assert s["speedup_hf"] == pytest.approx(s["tokens_per_s"] / table["hf"]["tokens_per_s"])
            assert s["speedup_vanilla"] == pytest.approx(s["tokens_per_s"] / table["vanilla"]["tokens_per_s"])
            # greedy, float32: every method reproduces vanilla token for token (hf included)
            assert s["identical_to_vanilla"] == [s["runs"], s["runs"]]
            assert f"| {label} |" in md
        for label in ("vanilla", "dynamic", "dynamic:8/2/2", "dynamic:adaptive"):
            s = table[label]
            assert s["draft_share"] + s["verify_share"] + s["other_share"] == pytest.approx(1.0)
            # which trees the steps ran: every step and token counted once
            mix = s["tree_mix"]
            assert sum(m["share"] for m in mix.values()) == pytest.approx(1.0)
            assert sum(m["steps"] * m["tau"] for m in mix.values()) == pytest.approx(s["timed_tokens"])
        assert list(table["vanilla"]["tree_mix"]) == ["vanilla"]
        assert list(table["dynamic:8/2/2"]["tree_mix"]) == ["8/2/2"]
        # the adaptive tree moves between its candidates (each runs at least once) and says so
        adaptive = table["dynamic:adaptive"]["tree_mix"]
        assert len(adaptive) >= 3 and "vanilla" in adaptive
        assert "| dynamic:adaptive | adaptive |" in md and "| dynamic:8/2/2 | 8/2/2 |" in md
        assert f"dynamic:adaptive's steps by tree: {next(iter(adaptive))} " in md
        assert table["dynamic"]["tree"] == {"total_tokens": 12, "depth": 3, "top_k": 4}
        assert table["dynamic:8/2/2"]["tree"] == {"total_tokens": 8, "depth": 2, "top_k": 2}
        assert table["dynamic"]["acceptance_by_depth"] and table["vanilla"]["acceptance_by_depth"] == []
        # vanilla drafts nothing: no tree in its row. (Its "draft" time is a function call that
        # returns at once, ~0.3% of a tiny model's step when idle, but one preemption or GC
        # pause inside that lap made it 21% in a clean-clone CI run: a share of wall-clock
        # time is no property to test on a shared machine.)
        assert table["vanilla"]["tree"] is None and table["dynamic"]["draft_share"] > 0
    for r in doc["runs"]:
        assert 1 <= r["new_tokens"] <= 8
        assert len(set(r["token_ids"])) > 1                  # a real continuation, not one repeated token
    assert doc["meta"]["head"] == str(tiny_folders / "head")
    assert doc["meta"]["methods"] == labels


def test_bench_rejects_bad_arguments(capsys):
    assert app_main(["bench", "--suite", "nope"]) == 2
    assert "suite" in capsys.readouterr().err
    assert app_main(["bench", "--methods", "hf,warp"]) == 2
    assert "methods" in capsys.readouterr().err


def test_parse_methods_variants():
    base = TreeConfig(depth=5, top_k=8, total_tokens=24)
    specs = parse_methods("hf, vanilla ,dynamic,dynamic:60/5/10,dynamic:auto,chain", base)
    assert [s.label for s in specs] == ["hf", "vanilla", "dynamic", "dynamic:60/5/10", "dynamic:auto", "chain"]
    assert specs[0].tree is None and specs[0].is_hf and not specs[0].uses_head
    assert specs[1].tree.method == "vanilla" and not specs[1].uses_head
    assert (specs[3].tree.total_tokens, specs[3].tree.depth, specs[3].tree.top_k) == (60, 5, 10)
    assert specs[4].auto and specs[5].tree.method == "chain" and specs[5].tree.total_tokens == 24
    drafters = parse_methods("pld,pld:16/6/4,lookahead,medusa", base)
    assert [s.tree.method for s in drafters] == ["pld", "pld", "lookahead", "medusa"]
    assert not any(s.uses_head for s in drafters) and [s.uses_medusa for s in drafters] == [False] * 3 + [True]
    assert (drafters[1].tree.total_tokens, drafters[1].tree.depth, drafters[1].tree.top_k) == (16, 6, 4)
    heads = parse_methods("dynamic:auto@eagle3,chain@/some/folder,dynamic", base)
    assert [(s.method, s.head) for s in heads] == [("dynamic", "eagle3"), ("chain", "/some/folder"), ("dynamic", None)]
    assert heads[0].auto and heads[0].label == "dynamic:auto@eagle3"
    for bad in ("dynamic:60/5", "chain:auto", "hf:1/2/3", "vanilla,vanilla", "", "dynamic:600/5/10", "pld:auto",
                "pld@eagle3", "vanilla@x", "dynamic@", "hf@eagle3"):
        with pytest.raises(ValueError):
            parse_methods(bad, base)


def test_suites_are_shipped_with_the_repo():
    assert set(parse_suites("all")) == {"alpaca", "gsm8k", "humaneval", "mt_bench", "qa", "sum"}
    prompts = load_suite("mt_bench", 3)
    assert len(prompts) == 3 and all(p.text.strip() for p in prompts)
    assert len(load_suite("gsm8k")) == 80


def _run(method, qid, tokens, seconds, forwards, draft=0.0, verify=0.0, step=0.0, reached=(), acc=(), ids=(1,),
         prefill=0.0):
    return RunRecord(suite="s", question_id=qid, method=method, new_tokens=tokens, timed_tokens=tokens,
                     seconds=seconds, forwards=forwards, draft_ms=draft, verify_ms=verify, step_ms=step,
                     prefill_ms=prefill,
                     depth_reached=list(reached), depth_accepted=list(acc), token_ids=list(ids))


def test_pooling_and_table():
    specs = [MethodSpec("hf", "hf"), MethodSpec("vanilla", "vanilla", TreeConfig(method="vanilla")),
             MethodSpec("dynamic", "dynamic", TreeConfig())]
    records = [
        _run("hf", 0, 10, 1.0, 10), _run("hf", 1, 30, 1.0, 30),
        _run("vanilla", 0, 10, 0.5, 10, verify=500, step=500), _run("vanilla", 1, 30, 1.5, 30, verify=1500, step=1500),
        _run("dynamic", 0, 10, 0.25, 4, draft=50, verify=150, step=250, reached=[4, 3], acc=[3, 1], prefill=20),
        _run("dynamic", 1, 30, 0.75, 10, draft=150, verify=450, step=750, reached=[10, 8], acc=[8, 2], ids=(2,),
             prefill=40),
    ]
    table = aggregate(records, specs, greedy=True)["s"]
    assert table["hf"]["tokens_per_s"] == pytest.approx(20.0)           # 40 tokens / 2 s, pooled
    assert table["vanilla"]["speedup_hf"] == pytest.approx(1.0)
    d = table["dynamic"]
    assert d["tokens_per_s"] == pytest.approx(40.0) and d["speedup_vanilla"] == pytest.approx(2.0)
    assert d["tau"] == pytest.approx(40 / 14)
    assert d["acceptance_by_depth"] == pytest.approx([11 / 14, 3 / 11])
    assert (d["draft_share"], d["verify_share"], d["other_share"]) == pytest.approx((0.2, 0.6, 0.2))
    assert d["ms_per_step"] == pytest.approx(1000 / 14)
    assert d["prefill_ms"] == pytest.approx(30.0)                    # a prompt's mean, outside tokens/s
    assert d["identical_to_vanilla"] == [1, 2]
    md = markdown_table(table)
    assert "| dynamic | 24/5/8 | 40.0 | 2.00 | 2.00 | 2.86 | 71 | 20% / 60% / 20% | 30 | 0.79 0.27 | 1 of 2 |" in md


@pytest.mark.parametrize("head_kind", ["eagle", "eagle-draft-vocab", "eagle3"])
def test_profile_step_parts_add_up_to_the_step(head_kind):
    """The per-verb step profiler on a tiny engine: every part is measured, the parts add up
    to the step, and the engine is left unwrapped afterwards (its own decoder back in place).
    With a reduced draft vocabulary, or an EAGLE-3 head's own LM head, the draft's LM head is
    still counted as the draft LM head."""
    import torch

    from app.bench.profile_step import PARTS, format_profile, profile_tree
    from app.engine.engine import Engine
    from tests.tiny import eagle3_target, random_eagle3_head, random_head, tiny_target

    if head_kind == "eagle3":
        target = eagle3_target()
        engine = Engine(target, random_eagle3_head(target))
    else:
        target = tiny_target()
        vocab = torch.arange(40) if head_kind == "eagle-draft-vocab" else None
        engine = Engine(target, random_head(target), draft_vocab=vocab)
    decoder, forward = engine.decoder, engine.draft_model.forward
    t = profile_tree(engine, TreeConfig(total_tokens=12, depth=3, top_k=4), "w5 w6 w7 w8", steps=3)
    assert t["steps"] == 3
    for part in ("verify: target forward", "draft: head forwards", "draft: LM head", "accept", "commit", "record"):
        assert t[part] > 0, part
    assert sum(t.get(k, 0.0) for k in PARTS) == pytest.approx(t["step"], rel=0.05)
    assert "draft: LM head" in format_profile("x", t)
    assert engine.decoder is decoder
    assert not {"draft", "verify", "accept", "commit", "record_tree"} & set(vars(engine))
    assert engine.draft_model.forward is forward and "logits" not in vars(engine.draft_model)


def test_plots_load_plotly_js_from_the_cdn_by_default(tmp_path):
    """plots.html stays small unless asked otherwise: the CLI and write_plots default to a
    CDN <script src> tag; --plotly-js inline (~4.8 MB) remains a choice."""
    import argparse

    from app.bench.cli import add_arguments
    from app.bench.plots import write_plots

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).plotly_js == "cdn"
    assert parser.parse_args(["--plotly-js", "inline"]).plotly_js == "inline"
    summary = {"all": {"hf": {"speedup_hf": 1.0, "tau": 1.0, "acceptance_by_depth": []},
                       "dynamic": {"speedup_hf": 1.4, "tau": 1.8, "acceptance_by_depth": [0.6, 0.5]}}}
    html = write_plots(summary, tmp_path / "plots.html").read_text()
    assert "cdn.plot.ly" in html and len(html) < 100_000


def test_bench_sampled_run(tiny_folders, tmp_path, monkeypatch):
    """temperature 1.0: hf samples too (top_k off, like our SamplingConfig); outputs are not
    compared (no '= vanilla' column), everything else is filled in."""
    out = tmp_path / "out"
    monkeypatch.setattr(tiny_suites(tmp_path / "eval"), "EVAL_DIR", tmp_path / "eval")
    rc = app_main(["bench", "--suite", "alpha", "--limit", "1", "--max-new-tokens", "6", "--temperature", "1.0",
                   "--methods", "hf,vanilla,chain:4/3/1", "--warmup-tokens", "2", "--plotly-js", "none",
                   "--base-model", str(tiny_folders / "target"), "--draft-model", str(tiny_folders / "head"),
                   "--device", "cpu", "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    table = doc["summary"]["alpha"]
    assert list(table) == ["hf", "vanilla", "chain:4/3/1"]
    assert all(s["identical_to_vanilla"] is None and s["tokens_per_s"] > 0 for s in table.values())
    assert not (out / "plots.html").exists() and doc["meta"]["temperature"] == 1.0


def test_bench_auto_tree_reports_its_cost_curve(tiny_folders, tmp_path, monkeypatch):
    """dynamic:auto decodes with autotune's choice, and the report shows why: the measured
    cost curve in the markdown, the whole TreeChoice in the JSON, its figure in plots.html."""
    from app.engine import autotune

    import itertools

    from app.engine import threads

    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(autotune, "_load_average", lambda: 0.3)
    monkeypatch.setattr(tiny_suites(tmp_path / "eval"), "EVAL_DIR", tmp_path / "eval")
    monkeypatch.setattr(threads, "REUSE_S", 0.0)                     # every apply probes afresh
    flips = itertools.cycle([1, 2])
    monkeypatch.setattr(threads, "fastest", lambda times, margin=1.05: next(flips))
    out = tmp_path / "out"
    rc = app_main(["bench", "--quick", "--suite", "alpha", "--max-new-tokens", "8", "--methods", "vanilla,dynamic:auto,dynamic:adaptive",
                   "--warmup-tokens", "2", "--base-model", str(tiny_folders / "target"),
                   "--draft-model", str(tiny_folders / "head"), "--device", "cpu", "--out", str(out),
                   "--plotly-js", "cdn"])
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    report = doc["meta"]["auto_tree_report"]
    chosen = doc["summary"]["alpha"]["dynamic:auto"]["tree"]
    assert chosen == {k: report["tree"][k] for k in ("total_tokens", "depth", "top_k")}
    best = report["candidates"][0]
    assert best["tokens_per_s"] == max(c["tokens_per_s"] for c in report["candidates"])
    curve = report["cost_curve"]
    md = (out / "results.md").read_text()
    assert "measured forward cost T(n): " + ", ".join(
        f"{n}: {ms:.0f} ms" for n, ms in zip(curve["sizes"], curve["ms"])) in md
    assert "auto tree: why this size" in (out / "plots.html").read_text()
    adaptive = doc["summary"]["alpha"]["dynamic:adaptive"]
    assert adaptive["tokens_per_s"] > 0 and doc["meta"]["threads"].startswith("auto (per prompt")
    # the thread count changed between prompts (a probe at every chance, the choice flipping as
    # if a neighbour came and went), never between the methods of one prompt
    by_prompt: dict = {}
    for run in doc["runs"]:
        by_prompt.setdefault((run["suite"], run["question_id"]), set()).add(run["threads"])
    assert all(len(counts) == 1 for counts in by_prompt.values()), by_prompt
    assert set().union(*by_prompt.values()) == {1, 2}
    same, n = adaptive["identical_to_vanilla"]
    assert same == n > 0                                  # greedy: adapting never changes the output


def test_generate_cli_auto_tree_prints_its_choice_and_cost_curve(tiny_folders, tmp_path, capsys):
    """`python -m app generate` with method dynamic and no tree knobs adapts the tree while
    decoding. On the eager forward without a kept profile it says how to make one; `python -m
    app tune` makes it (printing the measured T(n) and its spread), and the next generate
    starts from it. On the fast forward the first generate measures the profile itself."""
    import os

    os.environ["EAGLE_LENS_CACHE"] = str(tmp_path / "cache")
    try:
        models = ["--base-model", str(tiny_folders / "target"), "--draft-model", str(tiny_folders / "head"),
                  "--device", "cpu", "--threads", "1"]
        gen = ["generate", "--prompt", "w5 w17 w33", "--max-new-tokens", "6", "--raw"] + models
        assert app_main(gen + ["--forward", "eager"]) == 0
        err = capsys.readouterr().err
        assert "[auto] adaptive tree over" in err and "python -m app tune" in err
        os.environ["EAGLE_LENS_CACHE"] = str(tmp_path / "cache-fast")
        assert app_main(gen) == 0                   # the fast forward: measured once, then kept
        err = capsys.readouterr().err
        assert "measuring it once" in err and "starting at the tuned" in err
        assert app_main(gen) == 0
        err = capsys.readouterr().err
        assert "measuring it once" not in err and "starting at the tuned" in err
        os.environ["EAGLE_LENS_CACHE"] = str(tmp_path / "cache")
        assert app_main(["tune"] + models) == 0
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if x.startswith("[tune] T(n)"))
        assert line.split(": ", 1)[1].startswith("1: ") and " ms, 2: " in line
        assert "relative spread of T(n)/T(1)" in out and "auto tree: depth" in out
        assert app_main(gen) == 0
        err = capsys.readouterr().err
        assert "starting at the tuned" in err and "[auto] kept forward cost T(n): 1: " in err
    finally:
        del os.environ["EAGLE_LENS_CACHE"]


def test_bench_runs_the_other_drafters_without_an_eagle_head(tiny_folders, tmp_path, capsys, monkeypatch):
    """pld, lookahead and medusa as benchmark methods: no EAGLE head is loaded (none is
    needed), Medusa heads come from --medusa-model, and every method reproduces vanilla."""
    from app.engine.heads.medusa import MedusaHeads
    from app.engine.loading import load_target

    target = load_target(str(tiny_folders / "target"), device="cpu", dtype="float32")
    MedusaHeads.from_target(target.model, 2).save(tmp_path / "medusa")
    out = tmp_path / "out"
    monkeypatch.setattr(tiny_suites(tmp_path / "eval"), "EVAL_DIR", tmp_path / "eval")
    labels = ["vanilla", "pld", "pld:16/6/4", "lookahead", "medusa"]
    rc = app_main(["bench", "--suite", "alpha", "--limit", "2", "--max-new-tokens", "12", "--warmup-tokens", "2",
                   "--methods", ",".join(labels), "--base-model", str(tiny_folders / "target"),
                   "--draft-model", str(tmp_path / "no-such-head"), "--medusa-model", str(tmp_path / "medusa"),
                   "--device", "cpu", "--dtype", "float32", "--threads", "1", "--out", str(out), "--plotly-js", "none"])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((out / "results.json").read_text())
    table = doc["summary"]["alpha"]
    assert list(table) == labels
    for label in labels:
        assert table[label]["identical_to_vanilla"] == [2, 2]
    assert table["pld:16/6/4"]["tree"] == {"total_tokens": 16, "depth": 6, "top_k": 4}
    assert table["lookahead"]["tree"]["total_tokens"] == 24 and table["vanilla"]["tree"] is None
    assert doc["meta"]["head"].startswith("none") and doc["meta"]["medusa"] == str(tmp_path / "medusa")
    for r in doc["runs"]:
        assert r["method"] == "vanilla" or r["tree"]["method"] == r["method"].partition(":")[0]


def test_bench_takes_another_head_per_method(tiny_folders, tmp_path, monkeypatch):
    """``method@HEAD``: the same target drafted by another head (here an untrained one) in the
    same table; both reproduce vanilla, and the trained head accepts more."""
    from app.engine.loading import load_target
    from tests.tiny import random_head

    target = load_target(str(tiny_folders / "target"), device="cpu", dtype="float32")
    random_head(target, seed=5).save(tmp_path / "untrained")
    out = tmp_path / "out"
    monkeypatch.setattr(tiny_suites(tmp_path / "eval"), "EVAL_DIR", tmp_path / "eval")
    labels = ["vanilla", "chain:3/3/1", f"chain:3/3/1@{tmp_path / 'untrained'}"]
    rc = app_main(["bench", "--suite", "alpha", "--limit", "2", "--max-new-tokens", "16", "--warmup-tokens", "2",
                   "--methods", ",".join(labels), "--base-model", str(tiny_folders / "target"),
                   "--draft-model", str(tiny_folders / "head"), "--device", "cpu", "--dtype", "float32",
                   "--threads", "1", "--out", str(out), "--plotly-js", "none"])
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    table = doc["summary"]["alpha"]
    assert list(table) == labels and all(table[m]["identical_to_vanilla"] == [2, 2] for m in labels)
    assert table["chain:3/3/1"]["tau"] > table[labels[2]]["tau"] + 0.3
    assert str(tmp_path / "untrained") in doc["meta"]["head"]
