"""tau(d, N): what the head gets accepted, read off one calibration decode with a large tree
(``calibrate``), for every smaller tree at once (``Calibration.tau``). Kept on disk by
``autotune.cached_calibration``."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from app.engine.config import SamplingConfig, TreeConfig
from app.engine.device import cache_dir

# Calibration prompts: written for this file, *not* taken from the evaluation sets or the
# head's training prompts (tests check both), one per kind of request a chat model meets
# (the mt_bench categories: STEM, coding, writing, role-play, reasoning, math, extraction,
# humanities, plus everyday advice). Acceptance differs a lot between kinds — lists and
# arithmetic are easy to draft, free prose is hard — so a calibration on one or two kinds
# measures one kind's acceptance, not the page's; nine give tau for every candidate from
# about a hundred steps of nine kinds of text.
CALIBRATION_PROMPTS = (
    "Explain how a bicycle stays upright while it is moving.",
    "Write a short Python function that returns the n-th Fibonacci number, with a docstring.",
    "Give three tips for writing a clear email to a colleague.",
    "Write an upbeat paragraph for a neighbourhood newsletter announcing that a community garden opens next month.",
    "You are a lighthouse keeper in 1890. Describe your evening routine to a visiting reporter.",
    "Three boxes, red, green and blue, stand in a row. Green is left of blue and red is in the middle. "
    "Which box is on the left? Explain step by step.",
    "A train covers 180 km in 2.5 hours. What is its average speed, and how far does it go in 4 hours at that speed?",
    "List each person and the city they live in as JSON: Mara moved to Lisbon last spring, her brother Tom "
    "still lives in Leeds, and their friend Ana splits her time between Porto and Madrid.",
    "Give three reasons why the printing press changed how ideas spread in Europe.",
)


@dataclass
class Calibration:
    """What one calibration run measured. ``steps`` holds, per step of the large tree, each
    node as [depth, confidence, accepted (0/1), on the top-1 chain (0/1)] in the engine's node
    order. The top-1 chain is what a ``top_k = 1`` tree of that depth would draft: from the
    root, each level's most confident child of the previous chain node."""

    steps: list[list[list[float]]]
    draft_ms: list[float]          # per step, drafting the large tree (depth = ``depth``)
    verify_ms: list[float]
    step_ms: list[float]
    vanilla_step_ms: list[float]   # per step of a short vanilla run (one token per forward)
    depth: int                     # depth of the large calibration tree
    top_k: int
    total_tokens: int
    key: dict = field(default_factory=dict)
    load: float | None = None      # 1-minute load average when it was measured (CPU timings)
    load_after: float | None = None    # ... and when it ended
    probe_ms: dict = field(default_factory=dict)   # the thread probe then: {threads: ms} (``threads.ThreadGovernor``)

    def tau(self, depth: int, total: int) -> tuple[float, float]:
        """(measured, confidence-estimated) tokens per step for EAGLE-2's tree of ``total``
        nodes over levels <= ``depth``: 1 (the bonus) + the accepted nodes it contains.

        The smaller tree is the top ``total`` nodes by confidence (ties: earlier node first,
        as ``tree.finalize`` does) among the levels <= depth of the large tree.
        """
        if not self.steps:
            return 1.0, 1.0
        acc = conf = 0.0
        for nodes in self.steps:
            kept = sorted((i for i, n in enumerate(nodes) if n[0] <= depth), key=lambda i: (-nodes[i][1], i))[:total]
            acc += sum(nodes[i][2] for i in kept)
            conf += sum(nodes[i][1] for i in kept)
        return 1.0 + acc / len(self.steps), 1.0 + conf / len(self.steps)

    def tau_se(self, depth: int, total: int | None = None) -> float:
        """Standard error of the measured tau of a (depth, total) tree — or, with ``total``
        None, of the top-1 chain of ``depth`` — from the spread of accepted nodes per step."""
        n = len(self.steps)
        if n < 2:
            return float("inf") if n == 0 else 0.0
        counts = []
        for nodes in self.steps:
            if total is None:
                counts.append(sum(x[2] for x in nodes if len(x) > 3 and x[3] and x[0] <= depth))
            else:
                kept = sorted((i for i, x in enumerate(nodes) if x[0] <= depth), key=lambda i: (-nodes[i][1], i))[:total]
                counts.append(sum(nodes[i][2] for i in kept))
        mean = sum(counts) / n
        var = sum((c - mean) ** 2 for c in counts) / (n - 1)
        return (var / n) ** 0.5

    def tau_chain(self, depth: int) -> tuple[float, float]:
        """(measured, confidence-estimated) tokens per step for the top-1 chain of ``depth``
        nodes (a ``top_k = 1`` tree), read from the chain nodes of the large tree. A chain
        node the large tree did not keep ends the chain there, so this errs low."""
        if not self.steps:
            return 1.0, 1.0
        acc = conf = 0.0
        for nodes in self.steps:
            chain = [n for n in nodes if len(n) > 3 and n[3] and n[0] <= depth]
            acc += sum(n[2] for n in chain)
            conf += sum(n[1] for n in chain)
        return 1.0 + acc / len(self.steps), 1.0 + conf / len(self.steps)


def top1_chain(parents: list[int], confidence: list[float]) -> list[int]:
    """0/1 per node: is it on the top-1 chain (the root's most confident child, then that
    node's most confident child, and so on)? Node order is the engine's (parents first)."""
    on = [0] * len(parents)
    best_child: dict[int, int] = {}                      # parent (-1 = root) -> its most confident child
    for i, (p, c) in enumerate(zip(parents, confidence)):
        if p not in best_child or c > confidence[best_child[p]]:
            best_child[p] = i
    node = best_child.get(-1)
    while node is not None:
        on[node] = 1
        node = best_child.get(node)
    return on


def head_fingerprint(head) -> str:
    """A short hash of the head's weights: the calibration cache is per head, not per path."""
    h = hashlib.sha1()
    for name, tensor in sorted(head.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def mean(xs) -> float:
    return sum(xs) / len(xs) if xs else 0.0


# calibrate()'s defaults in one place: cached_calibration keys its cache on all of them, so a
# change here (new prompts, other lengths) recalibrates instead of reusing old records.
CALIBRATION_SETTINGS = {"prompts": CALIBRATION_PROMPTS, "depth": 6, "top_k": 8, "total_tokens": 64,
                        "max_new_tokens": 32, "vanilla_tokens": 12}


def calibrate(engine, prompts=CALIBRATION_SETTINGS["prompts"], depth: int = CALIBRATION_SETTINGS["depth"],
              top_k: int = CALIBRATION_SETTINGS["top_k"], total_tokens: int = CALIBRATION_SETTINGS["total_tokens"],
              max_new_tokens: int = CALIBRATION_SETTINGS["max_new_tokens"],
              vanilla_tokens: int = CALIBRATION_SETTINGS["vanilla_tokens"]) -> Calibration:
    """Decode ``prompts`` greedily with one large dynamic tree and record every node's fate.

    Costs about len(prompts) * max_new_tokens / tau steps of a ``total_tokens``-node tree
    (~100 steps, ~30 s on a 2-core CPU with a trained head). After each prompt a short vanilla
    run times the one-token step with the same code, so tree and vanilla steps are timed
    alternately (a burst of load hits both), and the tree's costs can be put on the cost
    curve's scale through the vanilla step (``choose_from``). For depth == ``depth`` the recorded tree is exactly the top
    ``total_tokens`` candidates, so tau is exact for every N <= total_tokens; for shallower
    trees a node below the recorded top ``total_tokens`` is missed, which only matters for
    N close to ``total_tokens`` and then only by low-confidence (rarely accepted) nodes.
    """
    big = TreeConfig(method="dynamic", depth=depth, top_k=top_k, total_tokens=total_tokens)
    greedy = SamplingConfig(temperature=0.0)
    steps, draft_ms, verify_ms, step_ms, vanilla = [], [], [], [], []
    for prompt in prompts:
        for event in engine.generate(prompt, tree=big, sampling=greedy, max_new_tokens=max_new_tokens):
            if event.type != "step":
                continue
            if event.prefill:
                continue  # the prefill has no tree

            tree = event.tree
            chain = top1_chain(tree.parents, tree.confidence)
            steps.append([[d, c, 1 if s == "accepted" else 0, k]
                          for d, c, s, k in zip(tree.depths, tree.confidence, tree.status, chain)])
            draft_ms.append(event.draft_ms)
            verify_ms.append(event.verify_ms)
            step_ms.append(event.step_ms)
        for event in engine.generate(prompt, tree=TreeConfig(method="vanilla"), sampling=greedy,
                                     max_new_tokens=max(2, vanilla_tokens // max(1, len(prompts)) + 1)):
            if event.type == "step" and not event.prefill:
                vanilla.append(event.step_ms)
    return Calibration(steps=steps, draft_ms=draft_ms, verify_ms=verify_ms, step_ms=step_ms,
                       vanilla_step_ms=vanilla, depth=depth, top_k=top_k, total_tokens=total_tokens)


def calibration_cache_path(key: dict) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / "autotune" / f"calib-{key['head']}-{digest}.json"
