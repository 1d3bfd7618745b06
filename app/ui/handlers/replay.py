"""Replay: the step slider and autoplay over the run on screen, the traces written for
download and the ones uploaded, and a trace put on screen as if it had just run
(``show_trace``, also used by the shipped demos: ``demos.py``)."""
from __future__ import annotations

import contextlib
import math
import os
import time
import uuid

from app.engine.spec import shown
from app.engine.events import StepEvent
from app.ui import traces
from app.ui.handlers.common import _model_info
from app.ui.handlers.views import final_view, run_status, step_view
from app.ui.limits import upload_folder
from app.ui.session import Session, VanillaRun
from app.ui.settings import AppContext
from app.viz.phases import decoding_total, phase_account
from app.viz.safe import md_code
from app.viz.stream import stream_html

# The traces written for download: in the app's own folder, which Gradio serves files from as
# they are (a folder elsewhere is copied to where Gradio refuses to serve it: limits.upload_folder)
TRACE_DIR = os.path.join(upload_folder(), "traces")
TRACE_MAX_AGE_S = 3600
# trace files older than this are deleted, so a busy server's disk cannot fill


def replay_view(session: Session, index) -> dict:
    """The replay slider: step ``index``'s tree, account, mask and KV views, the text up to it."""
    steps = session.steps
    if not steps:
        return {"phases": phase_account(None)}
    if isinstance(index, bool) or not isinstance(index, (int, float)) or (
            isinstance(index, float) and not math.isfinite(index)):
        raise ValueError(f"step must be a number, got {shown(index)}")
    i = min(max(int(index), 0), len(steps) - 1)
    view = {"stream": stream_html(steps, upto=i, highlight=i), **step_view(session, i, decoding_total(steps))}
    if session.summary is not None and getattr(session, "status_base", None) is not None:
        view["status"] = run_status(session, i)    # the status follows the slider
    return view


def play_step(session: Session, index) -> tuple[dict, bool]:
    """Autoplay's tick: the view of the step after ``index`` and whether more steps follow
    (the page's timer stops when not). At the last step it starts again from step 1."""
    steps = session.steps
    if not steps:
        return {"phases": phase_account(None)}, False
    current = int(index) if isinstance(index, (int, float)) and not isinstance(index, bool) and math.isfinite(index) \
        else 0
    nxt = current + 1 if current + 1 < len(steps) else min(1, len(steps) - 1)
    view = replay_view(session, nxt)
    view["slider"] = nxt
    return view, nxt + 1 < len(steps)


def instructive_step(steps: list[StepEvent]) -> int:
    """The index of a step worth opening a recorded run on: the deepest accepted path among
    the steps where the target also rejected something (a tree that shows both outcomes),
    the earliest of equals; else the deepest accepted path; the last step when none drafted."""
    drafted = [i for i, s in enumerate(steps) if s.tree is not None and len(s.tree)]
    if not drafted:
        return max(len(steps) - 1, 0)
    mixed = [i for i in drafted if "rejected" in steps[i].tree.status] or drafted
    return max(mixed, key=lambda i: (len(steps[i].accepted), len(steps[i].tree), -i))


def prune_traces(max_age_s: float = TRACE_MAX_AGE_S) -> None:
    """Delete trace files written more than ``max_age_s`` ago (Gradio serves them from where
    they are written, with no copy of its own; the upload budget may prune them sooner)."""
    cutoff = time.time() - max_age_s
    for entry in os.scandir(TRACE_DIR):
        try:
            if entry.name.startswith("eagle-lens-trace-") and entry.stat().st_mtime < cutoff:
                os.remove(entry.path)
        except FileNotFoundError:
            pass   # another request (or the upload budget) removed it first


def write_trace(session: Session) -> str | None:
    """Write the run on screen as JSON for the download button; replaces the visitor's last file."""
    if session.summary is None:
        return None
    os.makedirs(TRACE_DIR, exist_ok=True)
    prune_traces()
    if session.trace_path:
        with contextlib.suppress(FileNotFoundError):
            os.remove(session.trace_path)
    v = session.race_vanilla
    data = traces.trace_dict(session.settings, session.model, session.steps, session.summary,
                             v.steps if v else None, v.summary if v else None)
    path = os.path.join(TRACE_DIR, f"eagle-lens-trace-{uuid.uuid4().hex[:12]}.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(traces.dumps(data))
    session.trace_path = path
    return path


def recorded_where(model: dict, live: dict | None) -> str:
    """Where and how a trace was recorded, against what this server runs (a demo's speeds are
    the recording machine's, not this one's)."""
    device = {"cpu": "a CPU", "cuda": "a GPU", "mps": "an Apple GPU"}.get(str(model.get("device", "")), "")
    parts = [p for p in (md_code(model["target"], 60) if model.get("target") else "",
                         f"on {device}" if device else "",
                         f"in {md_code(model['dtype'], 20)}" if model.get("dtype") else "") if p]
    text = "recorded " + " ".join(parts) if parts else "recorded elsewhere"
    if live and live.get("dtype") and (live.get("dtype") != model.get("dtype") or live.get("device") != model.get("device")):
        text += (f"; this server runs {live.get('dtype')} on its {str(live.get('device', '')).upper()}: "
                 "its speeds are the recording machine's")
    return text


def show_trace(session: Session, trace: traces.Trace, name: str, live: dict | None = None) -> dict:
    """Put a validated trace on screen as if it had just run, opened on an instructive step
    (``instructive_step``). The view's "settings" are the trace's settings and "race" whether
    it raced vanilla, for the page to restore into its controls (Generate then reproduces it)."""
    session.start(trace.settings, trace.model, source=f"trace: {name}")
    session.steps, session.summary = list(trace.steps), trace.summary
    if trace.vanilla_steps is not None:
        session.race_vanilla = VanillaRun(("trace", name), list(trace.vanilla_steps), trace.vanilla_summary)
    # the trace's model note is the uploader's text: shown as code, never as Markdown
    known = {"target", "device", "dtype", "head"}
    extra = ", ".join(f"{md_code(k, 40)} {md_code(v)}" for k, v in trace.model.items() if v and k not in known)
    where = recorded_where(trace.model, live) + (f"; {extra}" if extra else "")
    index = instructive_step(session.steps)
    view = final_view(session, f"replaying {md_code(name)} ({where}) — no model involved; drag the slider or "
                               "press ▶ to play.", index=index)
    return {**view, "settings": dict(trace.settings), "race_on": trace.vanilla_steps is not None}


def read_trace_file(ctx: AppContext, path, admit=None) -> traces.Trace:
    """An uploaded trace, checked and parsed: Gradio saved it to a temporary file; its size is
    checked before it is read. ``admit(nbytes)`` (``limits.admit_records``) may refuse it on
    the memory its records would hold (``traces.estimate_bytes``) before it is parsed: a load
    past the bounds costs a cheap read, not a parse."""
    if not path:
        raise ValueError("Choose a trace file (.json) to load.")
    size = os.path.getsize(path)
    if size > ctx.config.trace_max_bytes:
        raise ValueError(f"trace is {size} bytes; the limit is {ctx.config.trace_max_bytes} bytes")
    with open(path, "rb") as f:
        data = f.read()
    estimate = traces.estimate_bytes(data) if admit is not None else None
    if estimate is not None:
        admit(estimate)
    return traces.parse_trace(data, ctx.config.trace_max_bytes)


def load_trace_file(ctx: AppContext, session: Session, path) -> dict:
    return show_trace(session, read_trace_file(ctx, path), "uploaded trace", _live_model(ctx))


def _live_model(ctx: AppContext) -> dict | None:
    return _model_info(ctx) if getattr(ctx, "engine", None) is not None else None
