"""Runs saved as JSON, and traces from strangers loaded safely.

A trace holds the settings, a note on the models, the EAGLE run's step records and summary
(``app.engine.events``) and, when the race ran, the vanilla run's records:

    {"format": "eagle-lens-trace", "version": 2,
     "settings": {...}, "model": {...},
     "records": [step, step, ..., summary],
     "vanilla": [step, ..., summary] | null}

Version 2 step records carry ``rule``, ``drafter``, ``tree_config`` and ``prefill`` (step 0
is the prompt's forward). A version 1 trace (no such fields; its step 0 was the first tree)
still loads: each step's rule and tree are filled in from the trace's settings, once, here.

Loading never trusts the file: a size cap, strict JSON (no NaN / Infinity), and a schema check
of every field before any record is built (pydantic models, strict: types, ranges, list
lengths, texts that are valid Unicode), then the records' consistency (steps in order, parents
before children, every step adds a token, at least one step, the summary's tokens those of the
steps). Every refusal is one short line. Nothing in a trace is executed or used as a path; its
texts are escaped when drawn.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from app.engine.config import SamplingConfig, TreeConfig, TreeShape
from app.engine.spec import MAX_DEPTH, MAX_TOTAL_TOKENS, METHODS, SETTINGS, SPEC
from app.engine.drafters.registry import DEFAULT_HEAD_KIND, DRAFTER_LABELS
from app.engine.events import GREEDY, RULES, STATUSES, DraftTreeRecord, RunSummary, StepEvent
from app.engine.verify import rule_for
from app.ui.limits import records_bytes, step_bytes

FORMAT = "eagle-lens-trace"
VERSION = 2
VERSIONS = (1, 2)
MAX_STEPS = 4096
MAX_TOKEN_ID = 2**31 - 1
MAX_TEXT = 20_000
SETTING_KEYS = tuple(s.name for s in SETTINGS)   # a trace's settings: a request's (app.engine.spec)
DRAFTERS = tuple(DRAFTER_LABELS)   # what a step's ``drafter`` may name (app.engine.drafters.registry)
MESSAGE_CHARS = 200            # a refusal's length at most: nothing of the file is echoed at length


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


# --- validation: the schema (pydantic, strict: no bool for a number, no string for a list) -----

def _text(cap: int):
    """A string of at most ``cap`` characters; pydantic refuses lone surrogates ("\\ud800" in
    JSON), which Python keeps in a str but every later UTF-8 encoding of the page fails on."""
    return Annotated[str, Field(max_length=cap)]


def _number(lo: float, hi: float):
    return Annotated[float, Field(ge=lo, le=hi, allow_inf_nan=False)]


def _integer(lo: int, hi: int):
    return Annotated[int, Field(ge=lo, le=hi)]


TokenId = _integer(0, MAX_TOKEN_ID)
Prob = _number(0.0, 1.0)
Ms = _number(0.0, 1e7)
Methods = Literal[METHODS]
NODES = dict(max_length=MAX_TOTAL_TOKENS)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class _Tree(_Strict):
    root_token: TokenId
    tokens: list[TokenId] = Field(**NODES)
    texts: list[_text(200)] = Field(**NODES)
    parents: list[_integer(-1, MAX_TOTAL_TOKENS)] = Field(**NODES)
    depths: list[_integer(1, MAX_DEPTH)] = Field(**NODES)
    q: list[Prob] = Field(**NODES)
    confidence: list[Prob] = Field(**NODES)
    p: Optional[list[Prob]] = Field(**NODES)
    status: list[Literal[STATUSES]] = Field(**NODES)
    source: Optional[list[Optional[Literal[DRAFTERS]]]] = Field(None, **NODES)

    @model_validator(mode="after")
    def _consistent(self):
        n = len(self.tokens)
        for name in ("texts", "parents", "depths", "q", "confidence", "status", "p", "source"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise ValueError(f"{name} must have {n} entries like tokens")
        for i, (parent, depth) in enumerate(zip(self.parents, self.depths)):
            if parent >= i:
                raise ValueError(f"parents[{i}] must come before its node")
            if depth != (1 if parent < 0 else self.depths[parent] + 1):
                raise ValueError(f"depths[{i}] must be its parent's depth + 1")
        return self


# A step's tree_config: every tree knob of the specification (the drafters' too), in the
# engine's ranges (``SPEC``: the Setting checks, as pydantic bounds).
_TreeConfig = create_model(
    "_TreeConfig", __base__=_Strict, method=(Methods, ...),
    **{s.name: (Optional[_integer(int(s.lo), int(s.hi)) if s.kind == "int" else _number(s.lo, s.hi)], None)
       for s in SPEC if s.owner == "tree" and s.name != "method"},
    q=(Optional[Literal["count"]], None))          # what the nodes' q means when not the drafter's probability
TREE_CONFIG_KEYS = set(_TreeConfig.model_fields)   # TreeConfig's settings + drafter knobs


class _StepV1(_Strict):
    type: Literal["step"]
    step: _integer(0, MAX_STEPS)
    method: Methods
    tree: Optional[_Tree]
    accepted: list[TokenId] = Field(max_length=MAX_DEPTH)
    bonus: TokenId
    new_tokens: list[TokenId] = Field(min_length=1, max_length=MAX_DEPTH + 1)   # every step adds a token
    text: _text(4000)
    draft_ms: Ms
    verify_ms: Ms
    step_ms: Ms

    @model_validator(mode="after")
    def _consistent(self):
        k = len(self.accepted)
        if self.new_tokens[:k] != self.accepted or len(self.new_tokens) > k + 1:
            raise ValueError("new_tokens must be the accepted tokens followed by at most the bonus token")
        return self


class _Step(_StepV1):
    rule: Literal[RULES]
    drafter: Optional[Literal[DRAFTERS]]
    tree_config: Optional[_TreeConfig]
    prefill: bool


class _Summary(_Strict):
    type: Literal["summary"]
    method: Methods
    new_tokens: TokenId
    seconds: Ms
    tokens_per_s: _number(0.0, 1e9)
    target_forwards: _integer(0, MAX_STEPS)
    mean_accepted: _number(0.0, MAX_DEPTH + 1)
    accepted_by_depth: list[Prob] = Field(max_length=MAX_DEPTH)
    token_ids: list[TokenId] = Field(max_length=MAX_STEPS * (MAX_DEPTH + 1))
    text: _text(MAX_STEPS * 200)


def _setting_type(s):
    if s.name == "prompt":
        return _text(MAX_TEXT)
    if s.name == "method":
        return Methods
    if s.kind == "bool":
        return bool
    return Union[_integer(0, 2**63), _number(0, 2**63)]


_Settings = create_model("_Settings", __base__=_Strict, **{s.name: (Optional[_setting_type(s)], None) for s in SETTINGS})


class _Envelope(_Strict):
    format: Literal[FORMAT]
    version: Literal[VERSIONS]
    settings: _Settings
    model: dict[_text(40), _text(200)] = Field(max_length=8)
    records: list[dict] = Field(min_length=2, max_length=MAX_STEPS + 1)   # at least one step, then the summary
    vanilla: Optional[list[dict]] = Field(min_length=2, max_length=MAX_STEPS + 1)


def _short(text: str, cap: int = MESSAGE_CHARS) -> str:
    return text if len(text) <= cap else text[: cap - 1] + "…"


def _refusal(where: str, exc: ValidationError) -> TraceError:
    """One short line from pydantic's errors: the first one's place and message (never the
    input), and how many more there are."""
    errors = exc.errors(include_input=False, include_url=False, include_context=False)
    first = errors[0]
    place = "".join(f"[{p}]" if isinstance(p, int) else f".{_short(str(p), 40)}" for p in first["loc"]
                    if not str(p).startswith(("constrained-", "function-", "literal[", "list[", "dict[")))
    msg = first["msg"].removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return TraceError(_short(f"invalid trace: {where}{place}: {msg}") + more)


def _check(model, where: str, data):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _refusal(where, exc) from None


# --- from validated models to the engine's records -------------------------------------------

def _v1_fields(d: _StepV1, settings) -> dict:
    """rule / drafter / tree_config of a version 1 step, from the trace's settings (the
    engine's own rule, ``verify.rule_for``)."""
    try:
        sampling = SamplingConfig(temperature=float(settings.get("temperature", 0.0)))
        tree = TreeConfig(**{k: settings[k] for k in ("method", *TreeShape.__dataclass_fields__) if k in settings})
    except (TypeError, ValueError, OverflowError):
        return {"rule": GREEDY, "drafter": None, "tree_config": None, "prefill": False}
    uses_tree = d.tree is not None
    return {"rule": rule_for(tree if uses_tree else None, sampling), "drafter": DEFAULT_HEAD_KIND if uses_tree else None,
            "tree_config": tree.shape() if uses_tree else None, "prefill": False}


def _step(where: str, d: dict, index: int, version: int, settings: dict) -> StepEvent:
    if version == 1:
        old = _check(_StepV1, where, d)
        d = {**old.model_dump(), **_v1_fields(old, settings)}
    m = _check(_Step, where, d)
    if m.step != index:
        raise TraceError(f"invalid trace: {where}.step must be {index} (steps in order)")
    t = m.tree
    tree = None if t is None else DraftTreeRecord(
        root_token=t.root_token, tokens=list(t.tokens), texts=list(t.texts), parents=list(t.parents),
        depths=list(t.depths), q=list(t.q), confidence=list(t.confidence),
        p=None if t.p is None else list(t.p), status=list(t.status),
        source=None if t.source is None else list(t.source))
    return StepEvent(step=index, method=m.method, tree=tree, accepted=list(m.accepted), bonus=m.bonus,
                     new_tokens=list(m.new_tokens), text=m.text, rule=m.rule, drafter=m.drafter,
                     tree_config=None if m.tree_config is None else m.tree_config.model_dump(exclude_none=True),
                     prefill=m.prefill, draft_ms=m.draft_ms, verify_ms=m.verify_ms, step_ms=m.step_ms)


def _run(where: str, records: list, version: int, settings: dict) -> tuple[list[StepEvent], RunSummary]:
    steps = [_step(f"{where}[{i}]", r, i, version, settings) for i, r in enumerate(records[:-1])]
    s = _check(_Summary, f"{where}[-1]", records[-1])
    emitted = [t for step in steps for t in step.new_tokens]
    if version >= 2 and (s.token_ids != emitted or s.new_tokens != len(emitted)):
        raise TraceError(f"invalid trace: {where}[-1] must sum up the steps (its token_ids are the steps' new_tokens)")
    summary = RunSummary(method=s.method, new_tokens=s.new_tokens, seconds=s.seconds, tokens_per_s=s.tokens_per_s,
                         target_forwards=s.target_forwards, mean_accepted=s.mean_accepted,
                         accepted_by_depth=list(s.accepted_by_depth), token_ids=list(s.token_ids), text=s.text)
    return steps, summary


def _reject_constant(name):
    raise TraceError(f"invalid trace: {name} is not allowed in JSON")


def parse_trace(data: bytes | str, max_bytes: int = 4_000_000) -> Trace:
    """Validate and load a trace; raise TraceError with a short readable message otherwise."""
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
    env = _check(_Envelope, "trace", obj)
    settings = env.settings.model_dump(exclude_none=True)
    steps, summary = _run("records", env.records, env.version, settings)
    vanilla_steps = vanilla_summary = None
    if env.vanilla is not None:
        vanilla_steps, vanilla_summary = _run("vanilla", env.vanilla, env.version, {**settings, "method": "vanilla"})
    return Trace(settings=settings, model=dict(env.model), steps=steps, summary=summary,
                 vanilla_steps=vanilla_steps, vanilla_summary=vanilla_summary)


def load_shipped(path: str, max_bytes: int = 4_000_000) -> Trace:
    """A shipped trace, parsed once per version of the file and shared by every session that
    shows it (its records are never changed once loaded)."""
    st = os.stat(path)
    return _load_shipped(path, st.st_mtime_ns, st.st_size, max_bytes)


@functools.lru_cache(maxsize=32)
def _load_shipped(path: str, mtime_ns: int, size: int, max_bytes: int) -> Trace:
    with open(path, "rb") as f:
        return parse_trace(f.read(), max_bytes)


def trace_bytes(trace: Trace) -> int:
    """The memory a session showing ``trace`` holds in its records (``limits.session_bytes``)."""
    return records_bytes(trace.steps) + (records_bytes(trace.vanilla_steps) if trace.vanilla_steps else 0)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _SizedTree(_Lenient):
    texts: list[str] = []


class _SizedRecord(_Lenient):
    type: str = ""
    text: str = ""
    tree: Optional[_SizedTree] = None


class _Sized(_Lenient):
    records: list[_SizedRecord] = []
    vanilla: Optional[list[_SizedRecord]] = None


def estimate_bytes(data: bytes | str) -> int | None:
    """``trace_bytes`` of the trace in ``data`` if it is valid, without parsing it: pydantic
    reads the JSON in Rust and builds only each step's text and its nodes' texts (~35 ms and
    1 MiB for a 3.7 MB trace; ``parse_trace`` takes ~0.4 s and tens of MiB of small Python
    objects, which the allocator keeps long after they are freed). A load past the memory
    bounds is refused on this figure before the parse; None when the JSON cannot be read so
    (``parse_trace`` then says why)."""
    try:
        sized = _Sized.model_validate_json(data)
    except (ValidationError, ValueError):
        return None
    steps = sized.records[:-1] + (sized.vanilla or [])[:-1]        # each run's last record: its summary
    return sum(step_bytes(len(r.text), len(r.tree.texts) if r.tree else 0, sum(map(len, r.tree.texts)) if r.tree else 0)
               for r in steps)
