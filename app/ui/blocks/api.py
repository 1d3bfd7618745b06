"""What every event of the page shares: the views' order of outputs (``RUN_VIEWS``, ...), the
thin wrappers that turn a handler's views into Gradio outputs and a ``ValueError`` into a page
message (``_stream``, ``_once``, ``page_errors``), the engine events' Python signatures, from
which Gradio derives the public API (``event_signature``), and the validators that check a
click before its event starts (``settings_validator``, ``precheck``)."""
from __future__ import annotations

import contextlib
import inspect
import traceback

import gradio as gr

from app.engine.config import TreeConfig
from app.engine.spec import SETTINGS
from app.ui import handlers, methods
from app.ui.handlers import ExploreView, RunView
from app.ui.requests import SETTING_NAMES, TREE_KNOBS, Checked
from app.ui.session import Session
from app.ui.settings import gpu
from app.viz.safe import page_message

ENGINE = "engine"   # the concurrency id shared by every event that runs the model


# The order of outputs of each event, by view. The main events' is ``RunView``'s own order
# (the first release's outputs keep their places, later views are appended, so the API's
# output order never changes); the explorer's and the comparison's are their enums'.
RUN_VIEWS = tuple(RunView)
# the slider (a step of the run on screen) and the pin: a few of the run's views, in this order
REPLAY_VIEWS = (RunView.STREAM, RunView.TREE, RunView.PHASES, RunView.MASK, RunView.MASK_CAPTION, RunView.KV,
                RunView.KV_CAPTION, RunView.AB_TREES, RunView.STATUS)
PLAY_VIEWS = REPLAY_VIEWS + (RunView.SLIDER,)
COMPARE_VIEWS = (RunView.AB, RunView.AB_TREES, RunView.AB_CAPTION)
EXPLORE_VIEWS = tuple(ExploreView)
METHODS_VIEWS = tuple(methods.MethodsView)


def _to_output(name: str, value):
    if name == RunView.SLIDER and isinstance(value, tuple):   # (maximum, value): a range change
        maximum, current = value
        return gr.Slider(minimum=0, maximum=max(maximum, 1), value=current, step=1)
    if name == RunView.TRACE_FILE:
        return gr.DownloadButton(value=value, interactive=value is not None)
    return value


def _outputs(view: dict, names) -> tuple:
    return tuple(_to_output(n, view[n]) if n in view else gr.skip() for n in names)


def _plain(name: str, value):
    """The plain value of a view entry, for resending it unchanged (no property update)."""
    return value[1] if name == RunView.SLIDER and isinstance(value, tuple) else value


@contextlib.contextmanager
def page_errors():
    """A ``ValueError`` (a refused request: its message names the setting) becomes a
    ``gr.Error``, the message Gradio shows on the page, without a server traceback. The
    refusal's frames are cleared first (``drop_frames``): what the refused handler had built
    is freed at once, not kept by the traceback until the next full collection."""
    try:
        yield
    except ValueError as exc:
        message = page_message(exc)
        drop_frames(exc)
        raise gr.Error(message, print_exception=False) from None


def drop_frames(exc: BaseException | None) -> None:
    """Clear the local variables of every finished frame in the tracebacks of ``exc``, its
    cause and its context. A traceback holds its frames, and the frames the exception that
    holds them: a cycle, freed only by a full collection (rare in a server whose long-lived
    objects are the model's). A trace refused after parsing (``limits.admit_records``) stayed
    alive in it: each refused load of a 3.6 MB trace kept its parsed records, ~17 MiB of the
    server's memory, until then."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]


def _stream(gen, names):
    """Run a handler generator, mapping views to outputs and ValueErrors to page messages.
    ``finally`` closes the handler at once when Gradio drops this event (a closed tab).

    An output that a view leaves out gets its last value again, not ``gr.skip()``: Gradio
    treats a skip as a property update and rebuilds that component's config, JSON schema
    included — about 7 ms of the server's Python per skipped output per update (py-spy), taken
    from the engine on a 2-core CPU. An unchanged value costs one comparison in Gradio's diff.
    """
    sent: dict = {}
    try:
        with page_errors():
            for view in gen:
                out = []
                for n in names:
                    if n in view:
                        out.append(_to_output(n, view[n]))
                        sent[n] = _plain(n, view[n])
                    else:
                        out.append(sent[n] if n in sent else gr.skip())
                yield tuple(out)
    finally:
        gen.close()


def _once(fn, names):
    with page_errors():
        return _outputs(fn(), names)


# The accordion each folded setting's control lives in, by the config class that owns it; the
# accordions may be closed when a run is refused, so a message is repeated by the prompt.
ACCORDIONS = {"tree": "Tree knobs", "sampling": "Sampling"}
FOLDED = {s.name: ACCORDIONS[s.owner] for s in SETTINGS if s.owner in ACCORDIONS and s.name != "method"}


# --- the public API: the events' Python signatures, from the settings' specification ----------

def event_signature(before: tuple = (), defaults: dict | None = None, after: tuple = ()) -> inspect.Signature:
    """The signature of an engine event: ``before`` (name, annotation) pairs, every setting in
    ``SETTINGS`` order (with ``defaults``' default where it has one), then ``after``
    (name, annotation, default) triples. Gradio derives the event's API (names, order,
    defaults for ``gradio_client``) from it, so the API follows the specification."""
    P = inspect.Parameter
    kinds = {"int": int, "float": float, "bool": bool, "str": str, "choice": str}
    params = [P(name, P.POSITIONAL_OR_KEYWORD, annotation=kind) for name, kind in before]
    params += [P(s.name, P.POSITIONAL_OR_KEYWORD, annotation=kinds[s.kind],
                 default=(defaults or {}).get(s.name, P.empty)) for s in SETTINGS]
    params += [P(name, P.POSITIONAL_OR_KEYWORD, annotation=kind, default=default) for name, kind, default in after]
    return inspect.Signature(params)


def page_defaults(tree0: TreeConfig) -> dict:
    """The value each setting's control starts at: the specification's default, the tree
    knobs from ``tree0`` (autotune's choice for this machine, or the engine's defaults)."""
    return {s.name: getattr(tree0, s.name) if s.name in TREE_KNOBS else s.default
            for s in SETTINGS if s.default is not None}


def _with_signature(fn, signature: inspect.Signature):
    fn.__signature__ = signature
    fn.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    return gpu(fn)


def settings_validator(check, names: tuple, checked: Checked):
    """Gradio's event validator for an engine event whose inputs are named ``names`` (None for
    the session): it runs ``check(*values)`` once, before the event. A refusal is shown under
    the control it names and the event never starts, so the page keeps the run it shows
    (raising ``gr.Error`` from the event instead marks every output of the run as failed and
    blanks its plots). What passes is handed to the event (``checked``), which then runs it
    without validating again. A problem of no one input is left to the event."""

    def validate(*values):
        if isinstance(values[-1], Session):
            values[-1].submitted()               # a Stop from now on ends this event, even while queued
        values = list(values[:len(names) - 1])   # the last input is the session
        try:
            result, problems = handlers.judge(lambda: check(*values), names)
        except Exception:  # noqa: BLE001 — never fail here: the event's own checks answer then
            result, problems = None, {}
        if result is not None:
            checked.put(values, result)
        for name, message in list(problems.items()):
            # a setting's control sits in the side panel (maybe closed, maybe in a closed
            # accordion): say it by the prompt too (the explorer's own fields are in view)
            if name in SETTING_NAMES and name != "prompt" and "prompt" not in problems and "prompt" in names:
                problems["prompt"] = f"{FOLDED[name]}: {message}" if name in FOLDED else f"Settings: {message}"
        return [gr.validate(name not in problems, problems.get(name, "")) for name in names]

    return validate


def precheck(check):
    """A click's pre-check, an event with no outputs before the event itself (chained with
    ``.success``; queued, since Gradio shows no message for an error outside the queue, but
    not behind the engine's worker). A refusal is then only a toast: an error raised by the
    event itself would mark every one of its outputs as failed and blank the run on the
    page. The event still makes the same check (for API callers, and for a state that
    changed in between). For events whose inputs can show a message (generate, the sweep)
    ``settings_validator`` does this job, closer to the control."""

    def run(*args):
        with page_errors():
            check(*args)

    return run
