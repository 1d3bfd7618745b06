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

Modules: ``cost`` (T(n) and its curve), ``calibration`` (tau from one large-tree decode),
``tree_choice`` (the prediction and the pick); this module measures and keeps them, and
``choose_tree`` puts them together. Their public names are importable from here as well.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict

import torch

from app.engine import forward, kv
from app.engine.calibration import (CALIBRATION_PROMPTS, CALIBRATION_SETTINGS, Calibration, calibrate,
                                    calibration_cache_path, head_fingerprint, top1_chain)
from app.engine.config import TreeConfig
from app.engine.cost import (DEFAULT_PREFIX, DEFAULT_SIZES, MEASURED_FIELDS, CostCurve, cost_cache_path,
                             cost_curve_text, curve_from_times, load_cost_curve, save_cost_curve)
from app.engine.threads import wait_policy
from app.engine.tree_choice import (DEFAULT_DEPTHS, DEFAULT_TOTALS, Candidate, TreeChoice, choose_from,
                                    pick_robust, predict, rank_candidates)

__all__ = [
    "CALIBRATION_PROMPTS", "CALIBRATION_SETTINGS", "Calibration", "calibrate", "calibration_cache_path",
    "head_fingerprint", "top1_chain", "DEFAULT_PREFIX", "DEFAULT_SIZES", "MEASURED_FIELDS", "CostCurve",
    "cost_cache_path", "cost_curve_text", "curve_from_times", "load_cost_curve", "save_cost_curve",
    "DEFAULT_DEPTHS", "DEFAULT_TOTALS", "Candidate", "TreeChoice", "choose_from", "pick_robust", "predict",
    "rank_candidates", "cost_cache_key", "measure_forward_costs", "kept_cost_curve", "forward_cost_curve",
    "kept_calibration", "cached_calibration", "choose_tree",
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cost_cache_key(target) -> dict:
    """What a forward-cost measurement depends on."""
    device = target.device
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    cfg = target.model.config
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    # a curve on several threads depends on how they wait at each barrier (app/engine/threads.py)
    waiting = {"omp_wait": wait_policy()} if threads > 1 else {}
    return {
        "model": target.name,
        # which verify forward and cache the engine runs: a faster one invalidates old curves
        "forward": f"{forward.decoder_forward(target).name}+preallocated-kv",
        "shape": f"L{cfg.num_hidden_layers}-H{cfg.hidden_size}-V{cfg.vocab_size}",
        "device": device.type,
        "device_name": dev_name,
        "dtype": str(target.dtype).replace("torch.", ""),
        "threads": threads,
        **waiting,
        "torch": torch.__version__,
    }


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
    model, device = target.model, target.device
    decoder = forward.decoder_forward(target)      # the engine's verify forward
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


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


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


def _calibration_key(engine, settings: dict) -> dict:
    # the key holds every setting calibrate() is called with, defaults included, so a change of
    # the built-in prompts or lengths invalidates old records instead of silently reusing them
    return dict(cost_cache_key(engine.target), head=head_fingerprint(engine.head), records="chain+interleaved",
                draft_weights=getattr(engine, "draft_weights", "head"),
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
