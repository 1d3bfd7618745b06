"""Runs saved as JSON, and traces from strangers loaded safely.

A trace holds the settings, a note on the models, the EAGLE run's step records and summary
(DESIGN.md section 3) and, when the race ran, the vanilla run's records:

    {"format": "eagle-lens-trace", "version": 2,
     "settings": {...}, "model": {...},
     "records": [step, step, ..., summary],
     "vanilla": [step, ..., summary] | null}

Version 2 step records carry ``rule``, ``drafter``, ``tree_config`` and ``prefill`` (step 0
is the prompt's forward). A version 1 trace (no such fields; its step 0 was the first tree)
still loads: each step's rule and tree are filled in from the trace's settings, once, here.

Loading never trusts the file: a size cap, strict JSON (no NaN / Infinity), and a schema check
of every field (types, ranges, list lengths, parents before children) before any record is
built. Nothing in a trace is executed or used as a path; its texts are escaped when drawn.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from app.engine.config import MAX_DEPTH, MAX_POOL, MAX_TOTAL_TOKENS, METHODS, SETTINGS
from app.engine.events import STATUSES, DraftTreeRecord, RunSummary, StepEvent
from app.engine.verify import RULES

FORMAT = "eagle-lens-trace"
VERSION = 2
VERSIONS = (1, 2)
MAX_STEPS = 4096
MAX_TOKEN_ID = 2**31 - 1
MAX_TEXT = 20_000
SETTING_KEYS = tuple(s.name for s in SETTINGS)   # a trace's settings: a request's (app.engine.config)
SETTING_KIND = {s.name: s.kind for s in SETTINGS}
STEP_KEYS_V1 = {"type", "step", "method", "tree", "accepted", "bonus", "new_tokens", "text",
                "draft_ms", "verify_ms", "step_ms"}
STEP_KEYS = STEP_KEYS_V1 | {"rule", "drafter", "tree_config", "prefill"}
DRAFTERS = ("eagle2", "eagle3", "medusa", "lookahead", "pld")
TREE_CONFIG_KEYS = {s.name for s in SETTINGS if s.owner == "tree"} | {"ngram", "window", "pool", "q"}   # TreeConfig's settings + drafter knobs
TREE_KEYS = {"root_token", "tokens", "texts", "parents", "depths", "q", "confidence", "p", "status"}
SUMMARY_KEYS = {"type", "method", "new_tokens", "seconds", "tokens_per_s", "target_forwards",
                "mean_accepted", "accepted_by_depth", "token_ids", "text"}


class TraceError(ValueError):
    """A trace that does not follow the schema; the message says where."""


@dataclass(frozen=True)
class Trace:
    settings: dict
    model: dict
    steps: list[StepEvent]
    summary: RunSummary
    vanilla_steps: list[StepEvent] | None
    vanilla_summary: RunSummary | None


def trace_dict(settings: dict, model: dict, steps, summary, vanilla_steps=None, vanilla_summary=None) -> dict:
    vanilla = None
    if vanilla_steps is not None and vanilla_summary is not None:
        vanilla = [s.to_dict() for s in vanilla_steps] + [vanilla_summary.to_dict()]
    return {"format": FORMAT, "version": VERSION, "settings": dict(settings), "model": dict(model),
            "records": [s.to_dict() for s in steps] + [summary.to_dict()], "vanilla": vanilla}


def dumps(trace: dict) -> str:
    return json.dumps(trace, ensure_ascii=False, separators=(",", ":"))


# --- validation -------------------------------------------------------------------------------

def _fail(where: str, what: str):
    raise TraceError(f"invalid trace: {where} {what}")


def _int(where, v, lo=0, hi=MAX_TOKEN_ID):
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        _fail(where, f"must be an integer in [{lo}, {hi}]")
    return v


def _num(where, v, lo=0.0, hi=math.inf):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        _fail(where, f"must be a finite number in [{lo}, {hi}]")
    return float(v)


def _str(where, v, cap=MAX_TEXT):
    if not isinstance(v, str) or len(v) > cap:
        _fail(where, f"must be a string of at most {cap} characters")
    return v


def _list(where, v, cap):
    if not isinstance(v, list) or len(v) > cap:
        _fail(where, f"must be a list of at most {cap} items")
    return v


def _keys(where, d, keys):
    if not isinstance(d, dict):
        _fail(where, "must be an object")
    if set(d) != set(keys):
        missing, extra = sorted(set(keys) - set(d)), sorted(set(d) - set(keys))
        _fail(where, f"has wrong fields (missing {missing}, unexpected {extra[:5]})")


def _tree(where, t) -> DraftTreeRecord:
    _keys(where, t, TREE_KEYS)
    n = len(_list(f"{where}.tokens", t["tokens"], MAX_TOTAL_TOKENS))
    for name in ("texts", "parents", "depths", "q", "confidence", "status"):
        if len(_list(f"{where}.{name}", t[name], MAX_TOTAL_TOKENS)) != n:
            _fail(f"{where}.{name}", f"must have {n} entries like tokens")
    if t["p"] is not None and len(_list(f"{where}.p", t["p"], MAX_TOTAL_TOKENS)) != n:
        _fail(f"{where}.p", f"must be null or have {n} entries")
    for i in range(n):
        _int(f"{where}.tokens[{i}]", t["tokens"][i])
        _str(f"{where}.texts[{i}]", t["texts"][i], 200)
        parent = _int(f"{where}.parents[{i}]", t["parents"][i], -1, i - 1)   # parents come first
        depth = _int(f"{where}.depths[{i}]", t["depths"][i], 1, MAX_DEPTH)
        if depth != (1 if parent < 0 else t["depths"][parent] + 1):
            _fail(f"{where}.depths[{i}]", "must be its parent's depth + 1")
        _num(f"{where}.q[{i}]", t["q"][i], 0.0, 1.0)
        _num(f"{where}.confidence[{i}]", t["confidence"][i], 0.0, 1.0)
        if t["p"] is not None:
            _num(f"{where}.p[{i}]", t["p"][i], 0.0, 1.0)
        if t["status"][i] not in STATUSES:
            _fail(f"{where}.status[{i}]", f"must be one of {', '.join(STATUSES)}")
    _int(f"{where}.root_token", t["root_token"])
    return DraftTreeRecord(root_token=t["root_token"], tokens=list(t["tokens"]), texts=list(t["texts"]),
                           parents=list(t["parents"]), depths=list(t["depths"]),
                           q=[float(x) for x in t["q"]], confidence=[float(x) for x in t["confidence"]],
                           p=None if t["p"] is None else [float(x) for x in t["p"]], status=list(t["status"]))


def _tree_config(where, c) -> dict | None:
    if c is None:
        return None
    if not isinstance(c, dict) or not set(c) <= TREE_CONFIG_KEYS or "method" not in c:
        _fail(where, f"must be null or an object with a method and fields among {', '.join(sorted(TREE_CONFIG_KEYS))}")
    if c["method"] not in METHODS:
        _fail(f"{where}.method", f"must be one of {', '.join(METHODS)}")
    out = {"method": c["method"]}
    for s in SETTINGS:
        if s.name in c and s.name != "method":
            check = _int if s.kind == "int" else _num
            out[s.name] = check(f"{where}.{s.name}", c[s.name], s.lo, s.hi)
    for k in ("ngram", "window", "pool"):          # pld / lookahead knobs
        if k in c:
            out[k] = _int(f"{where}.{k}", c[k], 1, MAX_POOL)
    if "q" in c:                                   # what the nodes' q means when it is not a probability
        if c["q"] != "count":
            _fail(f"{where}.q", "must be \"count\" (or absent: q is the drafter's probability)")
        out["q"] = "count"
    return out


def _v1_fields(d, settings) -> dict:
    """rule / drafter / tree_config of a version 1 step, from the trace's settings (the
    engine's own rule, ``verify.rule_for``)."""
    from app.engine.config import SamplingConfig, TreeConfig
    from app.engine.verify import GREEDY, rule_for

    try:
        sampling = SamplingConfig(temperature=float(settings.get("temperature", 0.0)))
        tree = TreeConfig(**{k: settings[k] for k in ("method", "depth", "top_k", "total_tokens") if k in settings})
    except (TypeError, ValueError):
        return {"rule": GREEDY, "drafter": None, "tree_config": None, "prefill": False}
    uses_tree = d.get("tree") is not None
    return {"rule": rule_for(tree if uses_tree else None, sampling), "drafter": "eagle2" if uses_tree else None,
            "tree_config": tree.shape() if uses_tree else None, "prefill": False}


def _step(where, d, index, version=VERSION, settings=None) -> StepEvent:
    if version == 1:
        _keys(where, d, STEP_KEYS_V1)
        d = {**d, **_v1_fields(d, settings or {})}
    _keys(where, d, STEP_KEYS)
    if d["type"] != "step":
        _fail(f"{where}.type", "must be 'step'")
    if _int(f"{where}.step", d["step"], 0, MAX_STEPS) != index:
        _fail(f"{where}.step", f"must be {index} (steps in order)")
    if d["method"] not in METHODS:
        _fail(f"{where}.method", f"must be one of {', '.join(METHODS)}")
    tree = None if d["tree"] is None else _tree(f"{where}.tree", d["tree"])
    accepted = [_int(f"{where}.accepted[]", x) for x in _list(f"{where}.accepted", d["accepted"], MAX_DEPTH)]
    new = [_int(f"{where}.new_tokens[]", x) for x in _list(f"{where}.new_tokens", d["new_tokens"], MAX_DEPTH + 1)]
    if new[: len(accepted)] != accepted or len(new) > len(accepted) + 1:
        _fail(f"{where}.new_tokens", "must be the accepted tokens followed by at most the bonus token")
    if d["rule"] not in RULES:
        _fail(f"{where}.rule", f"must be one of {', '.join(RULES)}")
    if d["drafter"] is not None and d["drafter"] not in DRAFTERS:
        _fail(f"{where}.drafter", f"must be null or one of {', '.join(DRAFTERS)}")
    if not isinstance(d["prefill"], bool):
        _fail(f"{where}.prefill", "must be true or false")
    return StepEvent(step=index, method=d["method"], tree=tree, accepted=accepted,
                     bonus=_int(f"{where}.bonus", d["bonus"]), new_tokens=new,
                     text=_str(f"{where}.text", d["text"], 4000), rule=d["rule"], drafter=d["drafter"],
                     tree_config=_tree_config(f"{where}.tree_config", d["tree_config"]), prefill=d["prefill"],
                     draft_ms=_num(f"{where}.draft_ms", d["draft_ms"], 0, 1e7),
                     verify_ms=_num(f"{where}.verify_ms", d["verify_ms"], 0, 1e7),
                     step_ms=_num(f"{where}.step_ms", d["step_ms"], 0, 1e7))


def _summary(where, d) -> RunSummary:
    _keys(where, d, SUMMARY_KEYS)
    if d["type"] != "summary" or d["method"] not in METHODS:
        _fail(where, "must be a summary record with a known method")
    ids = _list(f"{where}.token_ids", d["token_ids"], MAX_STEPS * (MAX_DEPTH + 1))
    return RunSummary(method=d["method"], new_tokens=_int(f"{where}.new_tokens", d["new_tokens"]),
                      seconds=_num(f"{where}.seconds", d["seconds"], 0, 1e7),
                      tokens_per_s=_num(f"{where}.tokens_per_s", d["tokens_per_s"], 0, 1e9),
                      target_forwards=_int(f"{where}.target_forwards", d["target_forwards"], 0, MAX_STEPS),
                      mean_accepted=_num(f"{where}.mean_accepted", d["mean_accepted"], 0, MAX_DEPTH + 1),
                      accepted_by_depth=[_num(f"{where}.accepted_by_depth[]", x, 0, 1) for x in
                                         _list(f"{where}.accepted_by_depth", d["accepted_by_depth"], MAX_DEPTH)],
                      token_ids=[_int(f"{where}.token_ids[]", x) for x in ids],
                      text=_str(f"{where}.text", d["text"], MAX_STEPS * 200))


def _run(where, records, version=VERSION, settings=None) -> tuple[list[StepEvent], RunSummary]:
    _list(where, records, MAX_STEPS + 1)
    if not records:
        _fail(where, "must hold the step records and a summary")
    steps = [_step(f"{where}[{i}]", r, i, version, settings) for i, r in enumerate(records[:-1])]
    return steps, _summary(f"{where}[-1]", records[-1])


def _reject_constant(name):
    raise TraceError(f"invalid trace: {name} is not allowed in JSON")


def parse_trace(data: bytes | str, max_bytes: int = 4_000_000) -> Trace:
    """Validate and load a trace; raise TraceError with a readable message otherwise."""
    if len(data) > max_bytes:
        raise TraceError(f"trace is {len(data)} bytes; the limit is {max_bytes} bytes")
    try:
        obj = json.loads(data, parse_constant=_reject_constant)
    except TraceError:
        raise
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise TraceError(f"not a JSON file ({type(exc).__name__})") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise TraceError(f"not an EAGLE Lens trace (expected \"format\": \"{FORMAT}\")")
    _keys("trace", obj, ("format", "version", "settings", "model", "records", "vanilla"))
    version = obj["version"]
    if isinstance(version, bool) or version not in VERSIONS:
        _fail("version", f"must be one of {', '.join(map(str, VERSIONS))}")
    settings = obj["settings"]
    if not isinstance(settings, dict) or not set(settings) <= set(SETTING_KEYS):
        _fail("settings", f"must be an object with fields among {', '.join(SETTING_KEYS)}")
    for k, v in settings.items():
        if k == "prompt":
            _str("settings.prompt", v)
        elif k == "method":
            if v not in METHODS:
                _fail("settings.method", f"must be one of {', '.join(METHODS)}")
        elif SETTING_KIND[k] == "bool":
            if not isinstance(v, bool):
                _fail(f"settings.{k}", "must be true or false")
        else:
            _num(f"settings.{k}", v, 0, 2**63)
    model = obj["model"]
    if not isinstance(model, dict) or len(model) > 8:
        _fail("model", "must be an object with at most 8 fields")
    model = {_str("model key", k, 40): _str(f"model.{k}", v, 200) for k, v in model.items()}
    steps, summary = _run("records", obj["records"], version, settings)
    vanilla_steps = vanilla_summary = None
    if obj["vanilla"] is not None:
        vanilla_steps, vanilla_summary = _run("vanilla", obj["vanilla"], version, {**settings, "method": "vanilla"})
    return Trace(settings=settings, model=model, steps=steps, summary=summary,
                 vanilla_steps=vanilla_steps, vanilla_summary=vanilla_summary)
