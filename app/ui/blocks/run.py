"""Generate (button and Enter), Step (step mode) and Stop: the events that run the model, with
the method comparison (``compare_methods.py``) and the explorer (``explorer.py``) on the same
worker. Stop asks the visitor's running (or queued) event to end (``Session.request_stop``)."""
from __future__ import annotations

from app.ui import handlers
from app.ui.blocks.api import (ENGINE, RUN_VIEWS, _once, _stream, _with_signature, event_signature, page_defaults,
                               precheck, settings_validator)
from app.ui.blocks.compare_methods import wire_methods
from app.ui.blocks.explorer import wire_explore
from app.ui.blocks.layout import Components
from app.ui.requests import SETTING_NAMES, Checked
from app.ui.session import Session
from app.ui.settings import AppContext, gpu


def make_generate(ctx: AppContext, checked: Checked):
    """The Generate event (API ``/generate``): its parameters are the settings, then
    step_mode, race (against plain decoding) and the visitor's session (not part of the API)."""
    signature = event_signature(defaults=page_defaults(ctx.tree_defaults),
                                after=(("step_mode", bool, False), ("race", bool, True),
                                       ("session", Session | None, None)))

    def generate(*args, **kwargs):
        """Decode the prompt with the chosen method, streaming tokens and trees, then race vanilla."""
        a = signature.bind(*args, **kwargs)
        a.apply_defaults()
        values = [a.arguments[name] for name in SETTING_NAMES] + [a.arguments["step_mode"], a.arguments["race"]]
        session = a.arguments["session"]
        session = session if isinstance(session, Session) else Session()
        gen = handlers.generate(ctx, session, step_mode=a.arguments["step_mode"], race=a.arguments["race"],
                                request=checked.get(values), **dict(zip(SETTING_NAMES, values)))
        yield from _stream(gen, RUN_VIEWS)

    return _with_signature(generate, signature)


def wire_engine(c: Components, ctx: AppContext) -> None:
    """Generate (button and Enter), Step, the method comparison and the explorer: the events
    that run the model, on one worker (``ENGINE``). Each validates its inputs once, in its
    validator (see ``settings_validator``)."""
    checked = Checked()
    run_outputs = c.views(RUN_VIEWS)
    # preprocess=False: the raw JSON values reach the handlers, whose own validation names
    # the parameter and its range in every message (the components' checks would not).
    engine_events = dict(concurrency_limit=1, concurrency_id=ENGINE, preprocess=False)
    n = len(SETTING_NAMES)

    def check_generate(*values):
        return handlers.check_generate(ctx, dict(zip(SETTING_NAMES, values)), values[n], values[n + 1])

    def next_step(session: Session):
        yield from _stream(handlers.step(ctx, session), RUN_VIEWS)

    generate = make_generate(ctx, checked)
    generate_validator = settings_validator(check_generate, SETTING_NAMES + ("step_mode", "race", None), checked)
    inputs = c.settings + [c.step_mode, c.race, c.session]
    c.generate_btn.click(generate, inputs, run_outputs, api_name="generate", validator=generate_validator,
                         **engine_events)
    c.controls["prompt"].submit(generate, inputs, run_outputs, api_visibility="private",
                                validator=generate_validator, **engine_events)
    c.step_btn.click(precheck(handlers.check_step), [c.session], None, api_visibility="private") \
        .success(gpu(next_step), [c.session], run_outputs, api_name="step", **engine_events)
    wire_methods(c, ctx, engine_events)
    wire_explore(c, ctx, checked, engine_events)


def wire_stop(c: Components) -> None:
    def stop(session: Session):
        return _once(lambda: handlers.stop(session), RUN_VIEWS)

    # Not ``cancels=``: a cancelled event's completion can reach the page after Stop's reply and
    # redraw its last live update ("decoding…") over it. The handlers end themselves instead,
    # with Stop's view as their last update (handlers.run._ends_stopped).
    c.stop_btn.click(stop, [c.session], c.views(RUN_VIEWS), api_name="stop")
