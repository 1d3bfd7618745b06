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
  T(n) between measured sizes is interpolated linearly. A curve kept for one thread count
  serves the others, scaled by the thread probe (the pick does not depend on the scale), and
  a curve measured beside other work is marked so and replaced by a quieter measurement
  (the section "a kept profile" below).
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
``tree_choice`` (the prediction and the pick), ``profile_rules`` (which kept profile serves
and which is replaced); this module measures and keeps them, and
``choose_tree`` puts them together. Their public names are importable from here as well.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch

from app.engine import forward, kv
from app.engine.calibration import (CALIBRATION_PROMPTS, CALIBRATION_SETTINGS, Calibration, calibrate,
                                    calibration_cache_path, head_fingerprint, top1_chain)
from app.engine.config import TreeConfig
from app.engine.cost import (DEFAULT_PREFIX, DEFAULT_SIZES, MEASURED_FIELDS, CostCurve, cost_cache_path,
                             cost_curve_text, curve_from_times, load_cost_curve, save_cost_curve)
from app.engine.profile_rules import (BUSY_LOAD, THREAD_FIELDS, _preference, _probe, _thread_free,  # noqa: F401
                                      replaces, thread_scale, under_load)
from app.engine.threads import wait_policy
from app.engine.tree_choice import (DEFAULT_DEPTHS, DEFAULT_TOTALS, Candidate, TreeChoice, choose_from,
                                    pick_robust, predict, rank_candidates)

__all__ = [
    "CALIBRATION_PROMPTS", "CALIBRATION_SETTINGS", "Calibration", "calibrate", "calibration_cache_path",
    "head_fingerprint", "top1_chain", "DEFAULT_PREFIX", "DEFAULT_SIZES", "MEASURED_FIELDS", "CostCurve",
    "cost_cache_path", "cost_curve_text", "curve_from_times", "load_cost_curve", "save_cost_curve",
    "DEFAULT_DEPTHS", "DEFAULT_TOTALS", "Candidate", "TreeChoice", "choose_from", "pick_robust", "predict",
    "rank_candidates", "cost_cache_key", "measure_forward_costs", "kept_cost_curve", "forward_cost_curve",
    "kept_calibration", "cached_calibration", "kept_profile", "profile_note", "under_load", "replaces",
    "thread_scale", "BUSY_LOAD", "choose_tree",
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
    """The 1-minute load average now (None where the OS has none): what a kept measurement
    records of its neighbours. Tests replace it to inject a load."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _exact_cost_curve(target, sizes=DEFAULT_SIZES) -> CostCurve | None:
    curve = load_cost_curve(cost_cache_path(cost_cache_key(target)))
    if curve is None or {k: v for k, v in curve.key.items() if k not in MEASURED_FIELDS} != cost_cache_key(target) \
            or not set(sizes) <= set(curve.sizes):
        return None
    return curve


def kept_cost_curve(target, sizes=DEFAULT_SIZES, probe_ms: dict | None = None,
                    derive: bool = True) -> CostCurve | None:
    """The kept T(n) for this target at the current thread count; else (``derive``) one kept
    for another thread count, scaled by ``thread_scale`` with ``probe_ms`` (this start's
    thread probe, {threads: ms}) and marked ``derived_from`` in its key; None if no thread
    count has one."""
    exact = _exact_cost_curve(target, sizes)
    if exact is not None or not derive:
        return exact
    key = cost_cache_key(target)
    want = _thread_free(key)
    others = []
    for path in sorted(cost_cache_path(key).parent.glob("cost-*.json")):
        curve = load_cost_curve(path)
        if curve is not None and _thread_free(curve.key) == want and set(sizes) <= set(curve.sizes) \
                and curve.key.get("threads") != key["threads"]:
            others.append(curve)
    if not others:
        return None
    source = min(others, key=lambda c: _preference(c.key, c.key.get("load"), key["threads"]))
    measured_at = source.key.get("threads") or 0
    scale = thread_scale(source, key["threads"], probe_ms)
    derived_key = {**{k: v for k, v in source.key.items() if k not in THREAD_FIELDS},
                   **{k: key[k] for k in THREAD_FIELDS if k in key},
                   "derived_from": {"threads": measured_at, "scale": scale}}
    return CostCurve(sizes=list(source.sizes), ms=[m * scale for m in source.ms], key=derived_key,
                     noise=list(source.noise))


def forward_cost_curve(target, sizes=DEFAULT_SIZES, refresh: bool = False, probe_ms: dict | None = None,
                       progress=None, **kw) -> CostCurve:
    """T(n) for this target at this thread count, measured once and then kept on disk. It is
    not re-measured because the machine was busy then: the ratios it is built from cancel
    load (see ``curve_from_times``); ``refresh`` measures again (``python -m app tune
    --retune``), and the new curve replaces the kept one only if it met no more load
    (``replaces``); otherwise the kept one is returned. ``probe_ms`` (the thread probe now)
    is kept with a new curve, for the record of how contended the machine was."""
    path = cost_cache_path(cost_cache_key(target))
    kept = _exact_cost_curve(target, sizes)
    if not refresh and kept is not None:
        return kept
    curve = measure_forward_costs(target, sizes=sizes, **kw)
    if probe_ms:
        curve.key["probe_ms"] = {str(n): ms for n, ms in _probe(probe_ms).items()}
    if kept is not None and not replaces(curve.key.get("load"), kept.key.get("load")):
        (progress or (lambda m: None))(
            f"kept the cost curve measured at load average {kept.key['load']:.2f}: this one met "
            f"{_load_text(curve.key.get('load'))}")
        return kept
    save_cost_curve(curve, path)
    return curve


def _load_text(load: float | None) -> str:
    return "no load reading" if load is None else f"load average {load:.2f}"


def _calibration_key(engine, settings: dict) -> dict:
    # the key holds every setting calibrate() is called with, defaults included, so a change of
    # the built-in prompts or lengths invalidates old records instead of silently reusing them
    # and what the head drafts with (its own forward, or the fast kernels' form of it): the
    # step timings of a calibration are that draft's
    draft = getattr(getattr(engine, "draft_model", None), "forward", None)
    return dict(cost_cache_key(engine.target), head=head_fingerprint(engine.head), records="chain+interleaved",
                draft_weights=getattr(engine, "draft_weights", "head"),
                draft_forward=type(draft).__name__ if draft is not None and draft is not engine.head else "head",
                **{k: (list(v) if isinstance(v, tuple) else v) for k, v in sorted(settings.items())})


def _read_calibration(path) -> Calibration | None:
    try:
        return Calibration(**json.loads(Path(path).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def kept_calibration(engine, derive: bool = True, **kw) -> Calibration | None:
    """The kept calibration for this engine and settings at the current thread count; else
    (``derive``) the one kept for another thread count (its tau does not depend on threads,
    and its timings are used relative to its own vanilla steps: ``choose_from``); None if
    there is none yet."""
    key = _calibration_key(engine, {**CALIBRATION_SETTINGS, **kw})
    path = calibration_cache_path(key)
    exact = _read_calibration(path)
    if exact is not None and exact.key == key:
        return exact
    if not derive:
        return None
    want = _thread_free(key)
    others = [c for p in sorted(path.parent.glob(f"calib-{key['head']}-*.json"))
              if (c := _read_calibration(p)) is not None and isinstance(c.key, dict)
              and _thread_free(c.key) == want and c.key.get("threads") != key["threads"]]
    return min(others, key=lambda c: _preference(c.key, c.load, key["threads"])) if others else None


def cached_calibration(engine, refresh: bool = False, probe_ms: dict | None = None, progress=None,
                       **kw) -> Calibration:
    """``calibrate`` once per (target cost key, head weights, settings); later calls read JSON.
    A calibration timed while the machine was busy is kept all the same: its tau table does not
    depend on load, and its timings are used relative to its own interleaved vanilla steps.
    ``refresh`` calibrates again; the new one replaces the kept one only if it met no more
    load (``replaces``)."""
    settings = {**CALIBRATION_SETTINGS, **kw}
    key = _calibration_key(engine, settings)
    path = calibration_cache_path(key)
    kept = kept_calibration(engine, derive=False, **kw)
    if not refresh and kept is not None:
        return kept
    load = _load_average()
    cal = calibrate(engine, **settings)
    # for the record: the load it met and the thread probe then
    cal.key, cal.load, cal.load_after = key, load, _load_average()
    cal.probe_ms = {str(n): ms for n, ms in _probe(probe_ms).items()}
    if kept is not None and not replaces(cal.load, kept.load):
        (progress or (lambda m: None))(
            f"kept the calibration measured at load average {kept.load:.2f}: this one met {_load_text(cal.load)}")
        return kept
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(cal)) + "\n")
    tmp.replace(path)
    return cal


def kept_profile(engine, probe_ms: dict | None = None, calibration: dict | None = None,
                 derive: bool = True) -> tuple[CostCurve | None, Calibration | None]:
    """(cost curve, calibration) kept for this engine, each None where no thread count has one
    (``derive=False``: only this thread count's)."""
    return (kept_cost_curve(engine.target, probe_ms=probe_ms, derive=derive),
            kept_calibration(engine, derive=derive, **(calibration or {})))


def profile_note(cost: CostCurve, cal: Calibration | None = None) -> str:
    """Where a profile in use came from, in a few words: "" for one measured at this thread
    count beside no other work; else e.g. "measured at 2 threads, scaled x0.31 by the thread
    probe; measured beside other work (load average 1.72): `python -m app tune --retune`
    on a quieter machine replaces it"."""
    parts = []
    derived = cost.key.get("derived_from")
    if derived:
        parts.append(f"measured at {derived['threads']} thread(s), scaled x{derived['scale']:.2f} to "
                     f"{cost.key.get('threads')} by the thread probe")
    loads = [x for x in (cost.key.get("load"), cal.load if cal is not None else None) if under_load(x)]
    if loads:
        parts.append(f"measured beside other work (load average {max(loads):.2f}): "
                     "`python -m app tune --retune` on a quieter machine replaces it")
    return "; ".join(parts)


def choose_tree(engine, method: str = "dynamic", base: TreeConfig | None = None, refresh: bool = False,
                calibration: dict | None = None, progress=None, measure: bool = True,
                probe_ms: dict | None = None, derive: bool = True) -> tuple[TreeConfig, TreeChoice] | tuple[None, None]:
    """The "auto" tree for this engine: (TreeConfig to decode with, report to show).

    From the kept profile (cost curve + calibration) when there is one, at this thread count
    or (``derive``) at another (``kept_cost_curve``, ``kept_calibration``): nothing is measured
    then. Otherwise the first call on a machine measures what no thread count has kept: the
    target's forward cost curve (seconds) and a short calibration decode with the head (tens
    of seconds on a CPU); both are kept on disk. ``refresh`` measures both again (they replace
    the kept ones if they met no more load: ``replaces``). ``base`` supplies the knobs not tuned
    here (tau_high, min_confidence, ...); ``calibration`` overrides ``calibrate``'s settings;
    ``progress(message)`` is called before each slow stage (for a UI status line);
    ``probe_ms`` is this start's thread probe ({threads: ms}: ``ThreadGovernor.probe_ms``),
    which scales another thread count's curve and is kept with a new measurement.

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
    cost = cal = None
    if not refresh:
        cost, cal = kept_profile(engine, probe_ms=probe_ms, calibration=calibration, derive=derive)
        if (cost is None or cal is None) and not measure:
            return None, None
    say = progress or (lambda message: None)
    if cost is None:
        say("auto tree: target forward cost over tree sizes (measured once per model, device, dtype)")
        cost = forward_cost_curve(engine.target, refresh=refresh, probe_ms=probe_ms, progress=say)
    if cal is None:
        say("auto tree: calibrating the head's acceptance (once per head)")
        cal = cached_calibration(engine, refresh=refresh, probe_ms=probe_ms, progress=say, **(calibration or {}))
    choice = choose_from(cost, cal, base or TreeConfig())
    return choice.tree, choice
