"""Replay: the step slider, trace upload, the shipped demos and the first demo on page load
(each restores the trace's settings into the controls, ``restore_outputs``), and autoplay."""
from __future__ import annotations

import gradio as gr

from app.ui import handlers, limits, traces
from app.ui.blocks.api import PLAY_VIEWS, REPLAY_VIEWS, RUN_VIEWS, _once, _outputs, page_errors, page_defaults
from app.ui.blocks.layout import PLAY_SPEEDS, Components, control_value
from app.ui.handlers import RunView
from app.ui.requests import SETTING_NAMES, TREE_KNOBS, preset_of
from app.ui.session import Session
from app.ui.settings import AppContext


# What the first demo, shown on page load, leaves at the page's defaults: the tree it drafts
# with (the method, its knobs, adapt), so the first Generate runs the tree the header names
# for this machine, not the demo's. The Load-demo button restores these too.
TREE_SETTINGS = ("method", *TREE_KNOBS, "adapt")
# A setting added after a trace was written: the value that trace ran with, not the page's default.
TRACE_PREDATES = {"lookup": 0, "adapt": False}


def restore_outputs(view: dict, ctx: AppContext, tree: bool = True) -> tuple:
    """Values for ``Components.restored`` from a loaded trace's view: each setting's control
    gets the trace's value (for a setting the trace predates, the value it ran with), the race
    checkbox whether it raced, the preset menu the tree the knobs now hold. Without ``tree``
    the controls of ``TREE_SETTINGS`` and the preset menu are left as they are (on page load:
    the page's defaults). A view without settings (a refused load) leaves every control alone."""
    settings = view.get("settings")
    if settings is None:
        return (gr.skip(),) * (len(SETTING_NAMES) + 2)
    defaults = {**page_defaults(ctx.tree_defaults), **TRACE_PREDATES}
    values = {name: control_value(name, settings.get(name, defaults.get(name)), ctx.config) for name in SETTING_NAMES}
    if not tree:
        return (tuple(gr.skip() if name in TREE_SETTINGS else values[name] for name in SETTING_NAMES)
                + (view.get("race_on", True), gr.skip()))
    preset = preset_of(values["depth"], values["top_k"], values["total_tokens"], ctx.tree_defaults)
    return tuple(values[name] for name in SETTING_NAMES) + (view.get("race_on", True), preset)


def wire_replay_and_traces(demo: gr.Blocks, c: Components, ctx: AppContext, demos: dict[str, str]) -> None:
    """The replay slider, trace upload, the shipped demos, and the first demo on page load.
    Loading a trace restores its prompt and every knob into the controls (``restore_outputs``);
    the first demo on page load leaves the tree's knobs at the page's defaults."""
    load_outputs = c.views(RUN_VIEWS) + c.restored

    def replay(session: Session, index: float):
        return _once(lambda: handlers.replay_view(session, index), REPLAY_VIEWS)

    def loaded(session: Session, fn, tree: bool = True) -> tuple:
        """A trace's view; a trace that cannot be shown leaves the session as it was and says
        why in one short line (never a traceback, never a half-replaced page). ``tree``: see
        ``restore_outputs``."""
        with page_errors():
            try:
                with session.kept_on_error():
                    view = fn()
            except ValueError:
                raise
            except Exception as exc:  # noqa: BLE001 — a view the validation did not foresee
                raise ValueError(f"this trace cannot be shown ({type(exc).__name__})") from None
        return _outputs(view, RUN_VIEWS) + restore_outputs(view, ctx, tree)

    def admission(request: gr.Request):
        """Its records must fit this address's share and the server's budget (limits)."""
        return lambda nbytes: limits.admit_records(demo.server_app, getattr(request, "session_hash", None), nbytes)

    def load_trace(session: Session, path, request: gr.Request):
        def show():
            admit = admission(request)
            trace = handlers.read_trace_file(ctx, path, admit)      # refused before parsing where it cannot fit
            admit(traces.trace_bytes(trace))
            return handlers.show_trace(session, trace, "uploaded trace")
        return loaded(session, show)

    def check_upload(path, request: gr.Request):
        with page_errors():
            handlers.read_trace_file(ctx, path, admission(request))

    def show_demo(session: Session, name, tree: bool) -> tuple:
        def show():
            view = handlers.load_demo(ctx, session, demos, name)
            session.records_shared = True        # a shipped trace's records: one copy for every session
            return view
        return loaded(session, show, tree)

    def load_demo(session: Session, name: str):
        return show_demo(session, name, tree=True)

    def first_demo(session: Session):
        """On page load: show the first shipped trace, so a visitor sees a demo at once, and
        its prompt in the box; the tree's knobs stay the page's (``TREE_SETTINGS``)."""
        return show_demo(session, next(iter(demos)), tree=False) if demos else loaded(session, dict)

    slider = c.outputs[RunView.SLIDER]
    slider.input(replay, [c.session, slider], c.views(REPLAY_VIEWS), api_name="replay",
                 trigger_mode="always_last", preprocess=False)
    c.upload.upload(check_upload, [c.upload], None, api_visibility="private").success(load_trace, [c.session, c.upload], load_outputs,
                                                      api_name="load_trace")
    c.demo_btn.click(load_demo, [c.session, c.demo_choice], load_outputs, api_name="load_demo", preprocess=False)
    demo.load(first_demo, [c.session], load_outputs, api_visibility="private")


def wire_autoplay(c: Components) -> None:
    """▶ Play / ⏸ Pause: a timer moves the slider one step per tick at the chosen speed and
    stops itself at the last step (no engine work, so off the engine's worker)."""
    playing = gr.State(False)

    def toggle(is_playing: bool, session: Session, index):
        start = not is_playing and bool(session.steps)
        if start and isinstance(index, (int, float)) and index >= len(session.steps) - 1:
            index = 0   # at the end: play from the start
        return (start, gr.Timer(active=start), "⏸ Pause" if start else "▶ Play",
                index if start else gr.skip())

    def tick(session: Session, index):
        with page_errors():
            view, more = handlers.play_step(session, index)
        return _outputs(view, PLAY_VIEWS) + (more, gr.Timer(active=more), "⏸ Pause" if more else "▶ Play")

    c.play_btn.click(toggle, [playing, c.session, c.outputs[RunView.SLIDER]],
                     [playing, c.timer, c.play_btn, c.outputs[RunView.SLIDER]], api_visibility="private",
                     show_progress="hidden", preprocess=False)
    c.timer.tick(tick, [c.session, c.outputs[RunView.SLIDER]], c.views(PLAY_VIEWS) + [playing, c.timer, c.play_btn],
                 api_visibility="private", show_progress="hidden", preprocess=False)
    c.play_speed.change(lambda name: gr.Timer(value=PLAY_SPEEDS.get(name, 1.0)), [c.play_speed], [c.timer],
                        api_visibility="private", show_progress="hidden", queue=False)
