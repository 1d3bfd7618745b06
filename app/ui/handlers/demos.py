"""The shipped demos: a recorded trace chosen by name from the server's own list, put on screen
like an uploaded one (``replay.show_trace``)."""
from __future__ import annotations

from app.engine.spec import shown
from app.ui import traces
from app.ui.handlers.replay import _live_model, show_trace
from app.ui.session import Session
from app.ui.settings import AppContext


def load_demo(ctx: AppContext, session: Session, demos: dict, name) -> dict:
    """A shipped trace, chosen by name from the server's own list (never a path from the page)."""
    if not isinstance(name, str) or name not in demos:
        raise ValueError(f"unknown demo trace {shown(name)}")
    trace = traces.load_shipped(demos[name], ctx.config.trace_max_bytes)   # parsed once, shared by every session
    return show_trace(session, trace, name, _live_model(ctx))
