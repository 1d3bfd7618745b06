"""Aggregate benchmark runs into per-suite, per-method numbers, a markdown table and JSON.

Aggregation follows Spec-Bench: tokens/s of a method on a suite = all its timed tokens /
all its timed seconds (so long answers weigh more, as they do for a user), and a speedup is
the ratio of two such rates measured on the same prompts in the same interleaved run.
"""
from __future__ import annotations

from dataclasses import asdict

from app.bench.llama_cpp import peer_line
from app.bench.runners import MethodSpec, RunRecord
from app.engine.autotune import cost_curve_text
from app.engine.config import TreeShape

ALL = "all"   # the pseudo-suite pooling every suite of the run


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def method_stats(runs: list[RunRecord], spec: MethodSpec, vanilla_runs: dict | None) -> dict:
    """Pooled numbers for one method over ``runs`` (one per prompt)."""
    timed = sum(r.timed_tokens for r in runs)
    seconds = sum(r.seconds for r in runs)
    forwards = sum(r.forwards for r in runs)
    step_ms = sum(r.step_ms for r in runs)
    depth = max((len(r.depth_reached) for r in runs), default=0)
    reached = [sum(r.depth_reached[d] for r in runs if d < len(r.depth_reached)) for d in range(depth)]
    accepted = [sum(r.depth_accepted[d] for r in runs if d < len(r.depth_accepted)) for d in range(depth)]
    stats = {
        "method": spec.label,
        "tree": ({"total_tokens": spec.tree.total_tokens, "depth": spec.tree.depth, "top_k": spec.tree.top_k}
                 if spec.tree is not None and spec.tree.uses_draft else None),
        "runs": len(runs),
        "new_tokens": sum(r.new_tokens for r in runs),
        "timed_tokens": timed,
        "seconds": seconds,
        "tokens_per_s": timed / seconds if seconds > 0 else 0.0,
        "forwards": forwards,
        "tau": timed / forwards if forwards else None,       # tokens per target forward
        "ms_per_step": (step_ms if not spec.is_hf else seconds * 1e3) / forwards if forwards else None,
        "prefill_ms": sum(r.prefill_ms for r in runs) / len(runs) if runs else None,
        "acceptance_by_depth": [a / r if r else 0.0 for a, r in zip(accepted, reached)],
        "draft_share": None, "verify_share": None, "other_share": None,
        "identical_to_vanilla": None,
        "adaptive": spec.adaptive,
        "tree_mix": tree_mix(runs),
    }
    if not spec.is_hf and step_ms > 0:
        draft = sum(r.draft_ms for r in runs)
        verify = sum(r.verify_ms for r in runs)
        stats.update(draft_share=draft / step_ms, verify_share=verify / step_ms,
                     other_share=max(0.0, step_ms - draft - verify) / step_ms,
                     draft_ms_per_step=draft / forwards, verify_ms_per_step=verify / forwards,
                     other_ms_per_step=max(0.0, step_ms - draft - verify) / forwards)
    if vanilla_runs is not None:
        same = sum(1 for r in runs if vanilla_runs.get((r.suite, r.question_id)) == r.token_ids)
        stats["identical_to_vanilla"] = [same, len(runs)]
    return stats


def aggregate(records: list[RunRecord], specs: list[MethodSpec], greedy: bool) -> dict:
    """{suite (and "all" when several): {method label: stats}} with speedups filled in."""
    suites = list(dict.fromkeys(r.suite for r in records))
    groups = suites + ([ALL] if len(suites) > 1 else [])
    labels = [s.label for s in specs]
    out: dict[str, dict[str, dict]] = {}
    for suite in groups:
        rows = [r for r in records if suite == ALL or r.suite == suite]
        vanilla = None
        if greedy and "vanilla" in labels:
            vanilla = {(r.suite, r.question_id): r.token_ids for r in rows if r.method == "vanilla"}
        table = {}
        for spec in specs:
            runs = [r for r in rows if r.method == spec.label]
            if runs:
                table[spec.label] = method_stats(runs, spec, vanilla)
        for stats in table.values():
            for ref in ("hf", "vanilla", "hf-fp32", "hf-bf16", "hf-compile"):
                base = table.get(ref)
                stats[f"speedup_{ref}"] = _ratio(stats["tokens_per_s"], base["tokens_per_s"]) if base else None
        out[suite] = table
    return out


def tree_mix(runs: list[RunRecord]) -> dict[str, dict]:
    """{tree "N/d/k" or "vanilla": {"steps", "share", "tau"}}, most-run first: which trees the
    steps of ``runs`` ran (one for a fixed tree; an adaptive run moves between several)."""
    pooled: dict[str, list[int]] = {}
    for r in runs:
        for key, (steps, tokens) in r.tree_steps.items():
            total = pooled.setdefault(key, [0, 0])
            total[0] += steps
            total[1] += tokens
    all_steps = sum(steps for steps, _ in pooled.values())
    ranked = sorted(pooled.items(), key=lambda kv: -kv[1][0])
    return {key: {"steps": steps, "share": steps / all_steps, "tau": tokens / steps}
            for key, (steps, tokens) in ranked if steps}


def tree_mix_text(mix: dict[str, dict]) -> str:
    """"3/2/2 52% (tau 2.31) · 2/2/1 30% (tau 1.92) · ..." """
    return " · ".join(f"{key} {100 * m['share']:.0f}% (tau {m['tau']:.2f})" for key, m in mix.items())


def _f(x, fmt: str = "{:.2f}", none: str = "–") -> str:
    return none if x is None else fmt.format(x)


def _tree_text(tree: dict | None) -> str:
    return "–" if not tree else str(TreeShape.of(tree))


def markdown_table(table: dict[str, dict], max_depths: int = 6) -> str:
    """One suite's table. Columns explained in ``markdown_report``."""
    head = ("| method | tree N/d/k | tokens/s | × hf | × vanilla | tau | ms/step | draft / verify / other "
            "| prefill ms | acceptance by depth | = vanilla |")
    lines = [head, "|" + "|".join(["---"] * 11) + "|"]
    for s in table.values():
        shares = "–" if s["draft_share"] is None else \
            f"{100 * s['draft_share']:.0f}% / {100 * s['verify_share']:.0f}% / {100 * s['other_share']:.0f}%"
        acc = " ".join(f"{a:.2f}" for a in s["acceptance_by_depth"][:max_depths]) or "–"
        same = "–" if s["identical_to_vanilla"] is None else f"{s['identical_to_vanilla'][0]} of {s['identical_to_vanilla'][1]}"
        tree = "adaptive" if s.get("adaptive") else _tree_text(s["tree"])
        lines.append(f"| {s['method']} | {tree} | {s['tokens_per_s']:.1f} | {_f(s['speedup_hf'])} "
                     f"| {_f(s['speedup_vanilla'])} | {_f(s['tau'])} | {_f(s['ms_per_step'], '{:.0f}')} | {shares} "
                     f"| {_f(s.get('prefill_ms'), '{:.0f}')} | {acc} | {same} |")
    for s in table.values():
        if s.get("adaptive") and s.get("tree_mix"):
            lines += ["", f"{s['method']}'s steps by tree: {tree_mix_text(s['tree_mix'])}"]
    return "\n".join(lines)


LEGEND = """\
Columns: *tokens/s* = decoded tokens / decoding seconds, prefill excluded, pooled over the
suite's prompts (for `hf`/`hf-pld`: timed from the first token `generate` emits, see
app/bench/runners.py). *× hf*, *× vanilla*: ratio of tokens/s, same prompts, same run.
*tau*: tokens per target forward (accepted drafts + the target's bonus token). *ms/step*:
time per target forward including drafting. *draft / verify / other*: share of step time
drafting the tree, in the target's verify forward (+ acceptance), and everything else (KV
commit, step record). *prefill ms*: time to the first token, per prompt (the target's forward
over the prompt; for EAGLE also the head's read of the prompt), outside *tokens/s* for every
method. *tree N/d/k*: the tree every step ran, or *adaptive* for a tree chosen step by step
(app/engine/adapt.py; the line under the table gives its share of steps on each tree and the
tokens per step there). *acceptance by depth*: of the steps whose accepted path reached depth
d-1 and that drafted depth d, the share accepting a token at depth d. *= vanilla*: greedy
outputs token-for-token identical to our vanilla decoding (k of n prompts; exact equality is
a property of the fast forward in every dtype, and of float32 on the eager one: README, "The fast forward")."""


def markdown_report(summary: dict, meta: dict) -> str:
    lines = ["# Benchmark", ""]
    lines.append(f"`{meta['command']}`")
    lines.append("")
    forward = f", target forward {meta['forward']}" if meta.get("forward") else ""
    lines.append(f"- machine: {meta['machine']}; device {meta['device']}, dtype {meta['dtype']}{forward}, "
                 f"torch threads {meta['threads']}, load average at start {meta['load_start']}, "
                 f"at end {meta.get('load_end')}"
                 + (f"; copy bandwidth at start {meta['copy_gbps_start']}, at end {meta.get('copy_gbps_end')} GB/s "
                    "(a 256 MiB copy: the host's memory phase, which moves every tree's ratio to vanilla)"
                    if meta.get("copy_gbps_start") else ""))
    lines.append(f"- target: {meta['target']}; draft head: {meta['head']}")
    lines.append(f"- {meta['max_new_tokens']} new tokens max, temperature {meta['temperature']}, "
                 f"methods interleaved prompt by prompt after a warm-up ({meta['started']}, {meta['wall_s']:.0f} s)")
    if meta.get("auto_tree"):
        lines.append(f"- {meta['auto_tree']}")
    if meta.get("llama_cpp"):
        lines.append(peer_line(meta["llama_cpp"].get("result"), meta["llama_cpp"].get("why_not", "")))
    report = meta.get("auto_tree_report")
    if report:
        curve = report["cost_curve"]
        lines.append("- the auto tree's measured forward cost T(n): " + cost_curve_text(curve["sizes"], curve["ms"])
                     + " (every candidate's prediction: `meta.auto_tree_report` in results.json, and plots.html)")
    for suite, table in summary.items():
        lines += ["", f"## {suite}", "", markdown_table(table)]
        for ref, what in (("hf-fp32", "plain generate in float32"), ("hf-bf16", "plain generate in bfloat16"),
                          ("hf-compile", "generate with a static cache and torch.compile")):
            if ref in table:
                lines += ["", f"× {ref} ({what}): " + ", ".join(
                    f"{label} {_f(s[f'speedup_{ref}'])}" for label, s in table.items())]
    lines += ["", LEGEND, ""]
    return "\n".join(lines)


def json_document(summary: dict, records: list[RunRecord], meta: dict) -> dict:
    return {"meta": meta, "summary": summary, "runs": [dict(asdict(r), tokens_per_s=r.tokens_per_s) for r in records]}
