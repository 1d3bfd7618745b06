"""What the handlers of every feature share: the request check (``parse``) and how a refusal
is reported per field (``judge``), the model line of a run, the machine's load and the
thread count of a request."""
from __future__ import annotations

import dataclasses
import os

from app.engine.spec import shown
from app.engine.threads import engine_probe
from app.ui.requests import SETTING_NAMES, Request, build_request, setting_of
from app.ui.settings import AppContext

RACE_CHUNK_TOKENS = 16   # EAGLE and vanilla alternate every this many tokens (app/ui/race.py)


def _model_info(ctx: AppContext) -> dict:
    t = ctx.engine.target
    return {"target": t.name, "head": "" if ctx.engine.head is None else (ctx.config.draft_model or "shipped head"),
            "device": t.device.type, "dtype": str(t.dtype).replace("torch.", "")}


def parse(ctx: AppContext, raw: dict) -> Request:
    """Validate raw values; refuse EAGLE methods when the server has no head. The request
    carries the prompt encoded (``Request.prompt_ids``): the one tokenisation of a click, which
    its checks and runs all reuse."""
    if ctx.engine is None:
        raise ValueError("This server has no model loaded: load a recorded trace instead.")
    request = build_request(ctx.config.limits, **raw)
    if request.tree.uses_draft and not ctx.has_head:
        raise ValueError(f"Method {request.tree.method} needs a draft head. {ctx.head_missing} "
                         "Choose method vanilla, or load a recorded trace.")
    return dataclasses.replace(request, prompt_ids=tuple(ctx.engine.encode_prompt(request.prompt)))


def _check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {shown(value)}")


def _check_step_mode(step_mode) -> None:
    _check_flag("step_mode", step_mode)


def judge(check, names=SETTING_NAMES) -> tuple[object | None, dict[str, str]]:
    """Run ``check()``: (its result, {}) when it passes, (None, {name: message}) when it
    refuses one of ``names`` (the message's first word), (None, {}) when it refuses anything
    else (no model on this server): the event itself reports that, as a page-wide error."""
    try:
        return check(), {}
    except ValueError as exc:
        name = setting_of(exc, names)
        return None, ({name: str(exc)} if name else {})


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def use_request_threads(ctx: AppContext) -> int:
    """Set the thread count for the request about to run (``app.engine.threads``) and return
    it; on the engine thread, where the probe forward is built at the first request."""
    if ctx.thread_probe is None:
        ctx.thread_probe = engine_probe(ctx.engine)
    return ctx.threads.apply(ctx.thread_probe)
