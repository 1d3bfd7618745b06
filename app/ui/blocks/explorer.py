"""The threshold explorer's event (API ``/explore``): its signature and its wiring, on the
engine's worker."""
from __future__ import annotations

from app.ui import handlers
from app.ui.blocks.api import (EXPLORE_VIEWS, _stream, _with_signature, event_signature, page_defaults,
                               settings_validator)
from app.ui.blocks.layout import Components
from app.ui.requests import SETTING_NAMES, Checked
from app.ui.session import Session
from app.ui.settings import AppContext


def make_explore(ctx: AppContext, checked: Checked):
    """The threshold explorer's event (API ``/explore``): knob, start, stop, count, then the
    settings, all required."""
    signature = event_signature(before=(("knob", str), ("start", float), ("stop", float), ("count", int)),
                                # added after the first release, so optional: adapt, then lookup
                                defaults={"adapt": False, "lookup": page_defaults(ctx.tree_defaults)["lookup"]},
                                after=(("session", Session | None, None),))

    def explore(*args, **kwargs):
        """Run the prompt once per value of one knob and plot acceptance and speed against it."""
        a = signature.bind(*args, **kwargs)
        a.apply_defaults()
        values = [a.arguments[name] for name in handlers.SWEEP_FIELDS + SETTING_NAMES]
        session = a.arguments.get("session")
        session = session if isinstance(session, Session) else Session()
        gen = handlers.explore(ctx, session, *values[:4], sweep=checked.get(values),
                               **dict(zip(SETTING_NAMES, values[4:])))
        yield from _stream(gen, EXPLORE_VIEWS)

    return _with_signature(explore, signature)


def wire_explore(c: Components, ctx: AppContext, checked: Checked, engine_events: dict):
    """Run sweep: validated once in its validator (``checked`` is shared with Generate's, see
    ``run.wire_engine``), then run on the engine's worker. Returns the event."""
    def check_explore(*values):
        return handlers.check_explore(ctx, *values[:4], dict(zip(SETTING_NAMES, values[4:])))

    return c.explore_btn.click(
        make_explore(ctx, checked), [c.knob, c.start, c.stop_value, c.count] + c.settings + [c.session],
        c.views(EXPLORE_VIEWS), api_name="explore",
        validator=settings_validator(check_explore, handlers.SWEEP_FIELDS + SETTING_NAMES + (None,), checked),
        **engine_events)
