"""Hardware-aware tree size: pick the draft tree that this machine verifies fastest per token.

Why a tree size must follow the hardware
----------------------------------------
A speculative step costs one draft phase plus ONE target forward over the root and the N
tree nodes. On a GPU a forward over 60 tokens costs about what a forward over one token costs
(decoding is memory-bound), so EAGLE-2's 60-node trees are nearly free. On a small CPU the
forward is compute-bound: 64 tokens cost several forwards of one (benchmarks/engine-notes.md).
Every extra node must then earn its cost in accepted tokens.

The model
---------
With tau(d, N) the mean number of tokens a step commits (accepted drafts + the bonus token)
for a tree of depth d and N nodes, and T(n) the cost of one target forward over n tokens,

    tokens/s (tree)    = tau(d, N) / (T(N + 1) + r·(N + 1) + T_draft(d) + T_other)
    tokens/s (vanilla) = 1 / (T(1) + T_other_vanilla)

    speedup <= tau · T(1) / (T(tree) + T(draft))        (the speedup bound)

``choose_tree`` evaluates the first line over a grid of (depth, total_tokens) and returns
the argmax. Its three ingredients are all measured, none assumed:

* T(n): ``measure_forward_costs`` times the target's decoder stack + LM head (exactly what
  the engine's verify forward runs) over n query tokens on a realistic cached prefix, with a
  tree-shaped attention mask. On a shared machine an absolute time says as much about the
  neighbours as about the tree, so the sizes are timed round-robin and each repeat gives the
  *ratio* T(n) / T(1) of forwards taken moments apart, where load cancels; the curve is the
  median T(1) times the median ratio, and the ratios' spread is kept as the curve's noise.
  Measured once per (model, device, dtype, threads) and kept as JSON under
  ``device.cache_dir() / "autotune"`` (re-measured only on request: ``python -m app tune``);
  T(n) between measured sizes is interpolated linearly.
* tau(d, N): ``calibrate`` decodes a few built-in prompts (not the evaluation sets) with one
  *large* dynamic tree and records, per step, which nodes the target accepted. For greedy
  verification, the nodes a smaller tree would accept are exactly the accepted nodes of the
  large tree that the smaller tree contains: EAGLE-2's smaller tree is the top-N nodes by
  confidence among the levels <= d, which is closed under ancestors, so the target's accepted
  path in it is the large tree's accepted path cut where it leaves the smaller tree. So
  tau(d, N) = 1 + mean over steps of |accepted ∩ top-N(levels <= d)|, measured, not modelled.
  (EAGLE-2's own estimate, the sum of the kept nodes' confidences, is reported beside it.)
  The top-1 chain of each depth (a ``top_k = 1`` tree: the root's most confident child, then
  its most confident child, ...) is read off the same record and competes beside the
  (d, N) grid: with two or three nodes, a chain reaching depth 2-3 can beat the dynamic
  tree, whose few nodes go to confident siblings at depth 1.
* T_draft(d), r and T_other: from the same calibration run's step timings, which alternates
  tree runs with short vanilla runs and is put on the curve's scale through the vanilla step
  (so both are expressed in forwards, not in seconds of a given moment). Draft time grows
  about linearly with depth (one head forward + one LM-head call per level); r is the
  engine's per-row verify work beyond the bare forward (softmax of each row's logits,
  acceptance); T_other the rest of a step (KV commit, step record).

The choice prefers the smaller tree: a larger one must beat it by more than the two
predictions' combined noise (``pick_robust``), so a noisy measurement cannot talk the page
into a big tree that a quiet machine would not pick.

Everything is plain arithmetic over measured numbers, so the report (``TreeChoice``) carries
the cost curve, the tau table and the predicted tokens/s of every candidate: the app can
show why it picked what it picked.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from app.engine.config import MAX_DEPTH, SamplingConfig, TreeConfig
from app.engine.device import cache_dir

# Query sizes (tokens per target forward) at which T(n) is measured. 1 is vanilla decoding.
# Dense below 8: on a CPU the best trees have 1-4 nodes and T(n) there is not linear (it
# steps; benchmarks/engine-notes.md), so interpolating between 1 and 8 would misprice exactly
# the trees that compete.
DEFAULT_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
# Length of the cached prefix the forwards attend to: a short prompt plus some answer.
DEFAULT_PREFIX = 256
# Candidate tree sizes (draft nodes) and depths searched by ``choose_tree``.
DEFAULT_TOTALS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 63)
DEFAULT_DEPTHS = (1, 2, 3, 4, 5, 6, 7)

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


# --- T(n): the target's forward cost ---------------------------------------------------------

@dataclass
class CostCurve:
    """Milliseconds of one target forward (decoder stack + LM head) over n query tokens."""

    sizes: list[int]              # n, ascending
    ms: list[float]               # median T(1) x median ratio T(n)/T(1), made non-decreasing in n
    key: dict = field(default_factory=dict)   # what it was measured on (model, device, dtype, ...)
    noise: list[float] = field(default_factory=list)   # per size: relative spread of the ratio (half the IQR / median)

    def rel_noise(self, n: float) -> float:
        """Relative uncertainty of T(n), from the nearest measured size (0 if unknown)."""
        if not self.noise:
            return 0.0
        i = min(range(len(self.sizes)), key=lambda j: abs(self.sizes[j] - n))
        return self.noise[i]

    def __call__(self, n: float) -> float:
        """T(n) in ms, linear between measured sizes, extrapolated from the last two beyond."""
        xs, ys = self.sizes, self.ms
        if n <= xs[0]:
            return ys[0]
        for i in range(1, len(xs)):
            if n <= xs[i]:
                w = (n - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + w * (ys[i] - ys[i - 1])
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
        return ys[-1] + slope * (n - xs[-1])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cost_cache_key(target) -> dict:
    """What a forward-cost measurement depends on."""
    device = target.device
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    cfg = target.model.config
    from app.engine import fused

    return {
        "model": target.name,
        # which verify forward and cache the engine runs: a faster one invalidates old curves
        "forward": f"{fused.decoder_forward(target).name}+preallocated-kv",
        "shape": f"L{cfg.num_hidden_layers}-H{cfg.hidden_size}-V{cfg.vocab_size}",
        "device": device.type,
        "device_name": dev_name,
        "dtype": str(target.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads() if device.type == "cpu" else 0,
        "torch": torch.__version__,
    }


def cost_cache_path(key: dict) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key["model"])
    return cache_dir() / "autotune" / f"cost-{safe}-{key['device']}-{key['dtype']}-{digest}.json"


def save_cost_curve(curve: CostCurve, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(curve), indent=1) + "\n")
    tmp.replace(path)  # atomic: a half-written file is never read back


def load_cost_curve(path: Path) -> CostCurve | None:
    try:
        data = json.loads(Path(path).read_text())
        curve = CostCurve(sizes=[int(s) for s in data["sizes"]], ms=[float(m) for m in data["ms"]],
                          key=dict(data.get("key", {})), noise=[float(x) for x in data.get("noise", [])])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not curve.sizes or len(curve.sizes) != len(curve.ms):
        return None
    return curve


@torch.inference_mode()
def measure_forward_costs(target, sizes=DEFAULT_SIZES, prefix_len: int = DEFAULT_PREFIX,
                          repeats: int = 5, warmup: int = 2) -> CostCurve:
    """Time the verify forward over each query size n on a cached prefix of ``prefix_len``.

    For n > 1 the queries carry a tree attention mask (a chain: every node sees the prefix
    and the nodes before it), like the engine's verify step, so the same attention kernel
    runs; for n == 1 no mask, like vanilla decoding. Timed work: decoder stack + LM head over
    all n rows (the engine needs every row's logits). The cache is cropped back after each
    forward, so every repeat sees the same prefix.

    Robust to a shared machine: sizes are measured round-robin (a burst of load from another
    process hits all sizes alike, not one), each size keeps its *fastest* repeat (what the
    hardware can do; noise only ever adds time), and the curve is made non-decreasing (a
    forward over more tokens never costs less; a dip is noise).
    """
    from app.engine import fused, kv

    model, device = target.model, target.device
    decoder = fused.decoder_forward(target)      # the engine's verify forward
    vocab = model.config.vocab_size
    sizes = sorted(set(int(n) for n in sizes))
    prefix_len = min(prefix_len, target.max_positions - max(sizes) - 1)
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, prefix_len), generator=g, device="cpu").to(device)   # (1, P)
    cache = kv.preallocated_cache(model, prefix_len + max(sizes))    # the engine's cache kind
    decoder.prefill(prefix, cache)
    inputs = {}
    for n in sizes:
        ids = torch.randint(0, vocab, (1, n), generator=g, device="cpu").to(device)    # (1, n)
        pos = torch.arange(prefix_len, prefix_len + n, device=device)[None]           # (1, n)
        mask = (torch.ones(n, prefix_len + n, dtype=torch.bool, device=device).tril(prefix_len)[None, None]
                if n > 1 else None)                                                   # (1, 1, n, P+n) or None
        inputs[n] = (ids, pos, mask)
    if sizes[0] != 1:
        raise ValueError("sizes must include 1: every T(n) is measured relative to T(1)")
    times = {n: [] for n in sizes}          # per size, one time per repeat
    load_before = _load_average()
    for r in range(warmup + repeats):
        for n in sizes:
            ids, pos, mask = inputs[n]
            _sync(device)
            t0 = time.perf_counter()
            hidden = decoder(ids, pos, mask, cache)                                    # (1, n, H)
            decoder.logits(hidden[0])                                                  # (n, V)
            _sync(device)
            elapsed = (time.perf_counter() - t0) * 1e3
            kv.crop(cache, prefix_len)
            if r >= warmup:
                times[n].append(elapsed)
    ms, noise = curve_from_times(sizes, times)
    key = dict(cost_cache_key(target), raw_ms=[times[n] for n in sizes], load=load_before,
               load_after=_load_average())
    return CostCurve(sizes=sizes, ms=ms, key=key, noise=noise)


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def curve_from_times(sizes: list[int], times: dict[int, list[float]]) -> tuple[list[float], list[float]]:
    """(T(n) in ms, relative noise per size) from round-robin times: repeat r of every size was
    taken within moments of repeat r of size 1, so the ratio times[n][r] / times[1][r] cancels
    whatever load the machine had then. T(n) = median T(1) x median ratio, made non-decreasing
    (a forward over more tokens never costs less; a dip is noise); noise = half the
    interquartile range of the ratios over their median (0 for size 1, the reference)."""
    base = times[1]
    t1 = _quantile(base, 0.5)
    ms, noise, running = [], [], 0.0
    for n in sizes:
        ratios = [t / b for t, b in zip(times[n], base) if b > 0]
        med = _quantile(ratios, 0.5) if ratios else 1.0
        running = max(running, t1 * med)
        ms.append(running)
        spread = (_quantile(ratios, 0.75) - _quantile(ratios, 0.25)) / 2 if len(ratios) > 1 else 0.0
        noise.append(0.0 if n == 1 else spread / med if med > 0 else 0.0)
    return ms, noise


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


MEASURED_FIELDS = ("raw_ms", "load", "load_after")   # in a curve's key, but not part of what it depends on


def kept_cost_curve(target, sizes=DEFAULT_SIZES) -> CostCurve | None:
    """The kept T(n) for this target, or None if none was measured for it yet."""
    curve = load_cost_curve(cost_cache_path(cost_cache_key(target)))
    if curve is None or {k: v for k, v in curve.key.items() if k not in MEASURED_FIELDS} != cost_cache_key(target) \
            or not set(sizes) <= set(curve.sizes):
        return None
    return curve


def forward_cost_curve(target, sizes=DEFAULT_SIZES, refresh: bool = False, **kw) -> CostCurve:
    """T(n) for this target, measured once and then kept on disk. It is not re-measured
    because the machine was busy then: the ratios it is built from cancel load (see
    ``curve_from_times``); ``refresh`` re-measures (``python -m app tune``)."""
    path = cost_cache_path(cost_cache_key(target))
    if not refresh and (curve := kept_cost_curve(target, sizes)) is not None:
        return curve
    curve = measure_forward_costs(target, sizes=sizes, **kw)
    save_cost_curve(curve, path)
    return curve


def cost_curve_text(sizes, ms) -> str:
    """T(n) in one line, for logs and reports: "1: 28 ms, 2: 29 ms, ..." (n query tokens: ms)."""
    return ", ".join(f"{n}: {t:.0f} ms" for n, t in zip(sizes, ms))


# --- tau(d, N): what the head gets accepted -----------------------------------------------------

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


def _mean(xs) -> float:
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
            if event.prefill or event.step == 1:
                continue  # the prefill has no tree; step 1 also reads the whole prompt into the head

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


def _calibration_key(engine, settings: dict) -> dict:
    # the key holds every setting calibrate() is called with, defaults included, so a change of
    # the built-in prompts or lengths invalidates old records instead of silently reusing them
    return dict(cost_cache_key(engine.target), head=head_fingerprint(engine.head), records="chain+interleaved",
                **{k: (list(v) if isinstance(v, tuple) else v) for k, v in sorted(settings.items())})


def kept_calibration(engine, **kw) -> Calibration | None:
    """The kept calibration for this engine and settings, or None if there is none yet."""
    key = _calibration_key(engine, {**CALIBRATION_SETTINGS, **kw})
    try:
        data = json.loads(calibration_cache_path(key).read_text())
        return Calibration(**data) if data.get("key") == key else None
    except (OSError, ValueError, TypeError):
        return None


def cached_calibration(engine, refresh: bool = False, **kw) -> Calibration:
    """``calibrate`` once per (target cost key, head weights, settings); later calls read JSON.
    A calibration timed while the machine was busy is kept all the same: its tau table does not
    depend on load, and its timings are used relative to its own interleaved vanilla steps."""
    settings = {**CALIBRATION_SETTINGS, **kw}
    key = _calibration_key(engine, settings)
    path = calibration_cache_path(key)
    if not refresh and (kept := kept_calibration(engine, **kw)) is not None:
        return kept
    cal = calibrate(engine, **settings)
    cal.key, cal.load = key, _load_average()   # for the record: the load it was measured at
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(cal)) + "\n")
    tmp.replace(path)
    return cal


# --- the choice -------------------------------------------------------------------------------

@dataclass
class Candidate:
    depth: int
    total_tokens: int
    tau: float                 # measured tokens per step (bonus included)
    tau_confidence: float      # EAGLE-2's estimate: 1 + sum of the kept nodes' confidences
    verify_ms: float           # T(total_tokens + 1)
    draft_ms: float            # T_draft(depth)
    other_ms: float
    tokens_per_s: float        # tau / (verify + draft + other)
    top_k: int | None = None   # 1 for a top-1 chain; None = the calibration's top_k
    noise: float = 0.0         # relative uncertainty of tokens_per_s (tau's standard error, T(n)'s spread)


def predict(cost: CostCurve, tau: float, depth: int, total_tokens: int, draft_ms_per_level: float,
            other_ms: float, verify_ms_per_row: float = 0.0) -> tuple[float, float, float]:
    """(verify ms, draft ms, predicted tokens/s) of one tree size. The whole cost model."""
    rows = total_tokens + 1                          # root + nodes in one forward
    verify = cost(rows) + verify_ms_per_row * rows   # + per-row acceptance work (softmax of p)
    draft = draft_ms_per_level * depth               # one head forward + LM head per level
    return verify, draft, 1000.0 * tau / (verify + draft + other_ms)


def rank_candidates(cost: CostCurve, tau_of, draft_ms_per_level: float, other_ms: float,
                    depths=DEFAULT_DEPTHS, totals=DEFAULT_TOTALS, verify_ms_per_row: float = 0.0,
                    tau_chain_of=None, tau_se_of=None) -> list[Candidate]:
    """Every (depth, total_tokens) in the grid with its predicted tokens/s, best first.

    ``tau_of(depth, total) -> (tau, tau_confidence)``. Trees with fewer nodes than levels
    are skipped (a depth-d tree needs at least d nodes to reach depth d). With
    ``tau_chain_of(depth)``, the top-1 chain of every depth (``top_k = 1``) competes too:
    with the same node count a chain reaches deeper than the dynamic tree's siblings, which
    wins where a few nodes are all the hardware affords. Ties go to the smaller tree
    (cheaper in memory, and the prediction's noise favours no one).
    """
    out = []

    def add(d: int, t: int, taus: tuple[float, float], top_k: int | None = None) -> None:
        tau, tau_c = taus
        verify, draft, tps = predict(cost, tau, d, t, draft_ms_per_level, other_ms, verify_ms_per_row)
        se = tau_se_of(d, None if top_k == 1 else t) if tau_se_of is not None else 0.0
        noise = ((se / tau) ** 2 + cost.rel_noise(t + 1) ** 2) ** 0.5 if tau > 0 else 0.0
        out.append(Candidate(depth=d, total_tokens=t, tau=tau, tau_confidence=tau_c, verify_ms=verify,
                             draft_ms=draft, other_ms=other_ms, tokens_per_s=tps, top_k=top_k, noise=noise))

    for d in depths:
        for t in totals:
            if t >= d:
                add(d, t, tau_of(d, t))
        if tau_chain_of is not None:
            add(d, d, tau_chain_of(d), top_k=1)   # a chain of depth d has exactly d nodes
    out.sort(key=lambda c: (-c.tokens_per_s, c.total_tokens, c.depth))
    return out


def pick_robust(ranked: list[Candidate]) -> Candidate:
    """The smallest candidate whose predicted tokens/s is within noise of the best one.

    A larger tree must beat a smaller one by more than the two predictions' combined noise
    (their relative uncertainties added in quadrature, times the best rate) to be chosen:
    a small tree costs less memory and less when the prediction is wrong, and on a shared
    machine a noisy measurement should not buy a big tree. With no noise this is the argmax.
    ``ranked`` is best first (``rank_candidates``)."""
    best = ranked[0]
    by_size = sorted(ranked, key=lambda c: (c.total_tokens, c.depth))
    for c in by_size:
        if (c.total_tokens, c.depth) > (best.total_tokens, best.depth):
            break
        margin = best.tokens_per_s * (best.noise ** 2 + c.noise ** 2) ** 0.5
        if c.tokens_per_s >= best.tokens_per_s - margin:
            return c
    return best


@dataclass
class TreeChoice:
    """The chosen tree and everything needed to show why (the app renders ``to_dict``)."""

    tree: TreeConfig
    predicted_tokens_per_s: float
    predicted_vanilla_tokens_per_s: float
    cost_curve: CostCurve
    draft_ms_per_level: float
    other_ms: float
    verify_ms_per_row: float
    candidates: list[Candidate]          # best first
    calibration_steps: int
    calibration_top_k: int | None = None  # the top_k of every candidate whose own top_k is None

    @property
    def beats_vanilla(self) -> bool:
        """False when no tree is predicted to beat plain decoding (e.g. an untrained head):
        then the caller should decode with method vanilla, and say why."""
        return self.predicted_speedup > 1.0

    @property
    def predicted_speedup(self) -> float:
        v = self.predicted_vanilla_tokens_per_s
        return self.predicted_tokens_per_s / v if v > 0 else 0.0

    @property
    def chosen(self) -> Candidate:
        """The candidate the tree was made from (``pick_robust``'s, not always the argmax)."""
        t = self.tree
        return next((c for c in self.candidates if (c.depth, c.total_tokens) == (t.depth, t.total_tokens)
                     and (c.top_k or self.calibration_top_k) == t.top_k), self.candidates[0])

    def summary(self) -> str:
        c = self.chosen
        return (f"auto tree: depth {self.tree.depth}, total_tokens {self.tree.total_tokens}, top_k {self.tree.top_k} "
                f"-> predicted {self.predicted_tokens_per_s:.1f} tokens/s (tau {c.tau:.2f}, "
                f"verify {c.verify_ms:.0f} + draft {c.draft_ms:.0f} + other {c.other_ms:.0f} ms per step), "
                f"{self.predicted_speedup:.2f}x predicted vanilla {self.predicted_vanilla_tokens_per_s:.1f} tokens/s")

    def to_dict(self) -> dict:
        return {
            "tree": {"method": self.tree.method, "depth": self.tree.depth, "top_k": self.tree.top_k,
                     "total_tokens": self.tree.total_tokens},
            "predicted_tokens_per_s": self.predicted_tokens_per_s,
            "predicted_vanilla_tokens_per_s": self.predicted_vanilla_tokens_per_s,
            "predicted_speedup": self.predicted_speedup,
            "beats_vanilla": self.beats_vanilla,
            "cost_curve": asdict(self.cost_curve),
            "draft_ms_per_level": self.draft_ms_per_level,
            "other_ms": self.other_ms,
            "verify_ms_per_row": self.verify_ms_per_row,
            "calibration_steps": self.calibration_steps,
            "calibration_top_k": self.calibration_top_k,
            "candidates": [asdict(c) for c in self.candidates],
        }


def choose_from(cost: CostCurve, cal: Calibration, base: TreeConfig = TreeConfig(),
                depths=DEFAULT_DEPTHS, totals=DEFAULT_TOTALS) -> TreeChoice:
    """The tree to decode with, from a cost curve and a calibration (pure: no model runs):
    the smallest candidate within noise of the cost model's argmax (``pick_robust``).

    The calibration's timings were taken at another moment than the curve's, perhaps under
    another load, so they are first put on the curve's scale: the calibration's own vanilla
    step (timed between its tree runs) corresponds to the curve's T(1), and every calibration
    time is multiplied by T(1) / that step. A busy neighbour during either measurement then
    changes no prediction's ratio to vanilla."""
    depths = [d for d in depths if d <= cal.depth]
    totals = [t for t in totals if t <= cal.total_tokens]
    vanilla_cal = _quantile(cal.vanilla_step_ms, 0.5) if cal.vanilla_step_ms else 0.0
    scale = cost(1) / vanilla_cal if vanilla_cal > 0 else 1.0
    draft_per_level = scale * _mean(cal.draft_ms) / cal.depth
    # The engine's verify phase = the bare forward T(n) + per-row work (the softmax of every
    # row's logits, acceptance); whatever exceeds T(n) at the calibration size is charged per row.
    rows = cal.total_tokens + 1
    per_row = max(0.0, scale * _mean(cal.verify_ms) - cost(rows)) / rows
    # Everything else in a step (KV commit, the step record): a constant.
    other = scale * max(0.0, _mean(cal.step_ms) - _mean(cal.draft_ms) - _mean(cal.verify_ms))
    ranked = rank_candidates(cost, cal.tau, draft_per_level, other, depths, totals, per_row,
                             tau_chain_of=cal.tau_chain, tau_se_of=cal.tau_se)
    best = pick_robust(ranked)
    vanilla_ms = cost(1)          # the vanilla step on the curve's scale
    tree = replace(base, method="dynamic", depth=best.depth, total_tokens=best.total_tokens,
                   top_k=best.top_k or cal.top_k)
    return TreeChoice(tree=tree, predicted_tokens_per_s=best.tokens_per_s,
                      predicted_vanilla_tokens_per_s=1000.0 / vanilla_ms, cost_curve=cost,
                      draft_ms_per_level=draft_per_level, other_ms=other, verify_ms_per_row=per_row,
                      candidates=ranked,
                      calibration_steps=len(cal.steps), calibration_top_k=cal.top_k)


def choose_tree(engine, method: str = "dynamic", base: TreeConfig | None = None, refresh: bool = False,
                calibration: dict | None = None, progress=None,
                measure: bool = True) -> tuple[TreeConfig, TreeChoice] | tuple[None, None]:
    """The "auto" tree for this engine: (TreeConfig to decode with, report to show).

    First call on a machine measures the target's forward cost curve (seconds) and runs a
    short calibration decode with the head (tens of seconds on a CPU); both are cached on
    disk, so later calls return at once. ``base`` supplies the knobs not tuned here
    (tau_high, min_confidence, ...); ``calibration`` overrides ``calibrate``'s settings;
    ``progress(message)`` is called before each slow stage (for a UI status line).

    tau is calibrated with greedy verification; under sampling (temperature > 0) acceptance
    is usually lower, so the chosen tree is, if anything, a little large for sampling.
    If ``report.beats_vanilla`` is False (e.g. an untrained head), decode with vanilla.

    ``measure=False`` never measures: it returns the choice from the kept profile, or
    (None, None) when there is none yet (the CLI then starts from a small safe tree and
    adapts while decoding, instead of calibrating in the foreground).
    """
    if method != "dynamic":
        raise ValueError(f"choose_tree tunes the dynamic (EAGLE-2) tree only, got method {method!r}")
    if engine.head is None:
        raise ValueError("choose_tree needs a draft head: its acceptance decides the tree size")
    if not measure:
        cost, cal = kept_cost_curve(engine.target), kept_calibration(engine, **(calibration or {}))
        if cost is None or cal is None:
            return None, None
        choice = choose_from(cost, cal, base or TreeConfig())
        return choice.tree, choice
    say = progress or (lambda message: None)
    say("auto tree: target forward cost over tree sizes (measured once per model, device, dtype)")
    cost = forward_cost_curve(engine.target, refresh=refresh)
    say("auto tree: calibrating the head's acceptance (once per head)")
    cal = cached_calibration(engine, refresh=refresh, **(calibration or {}))
    choice = choose_from(cost, cal, base or TreeConfig())
    return choice.tree, choice
