"""The Gradio page: components, their wiring, and the queue.

Handlers (``app.ui.handlers``) yield views — dicts keyed by view name. Here each view name is
bound to one component, and a thin wrapper per event turns a view into the tuple of outputs
Gradio expects (``gr.skip()`` for anything the view leaves alone) and a ``ValueError`` into a
``gr.Error`` message on the page. Before an engine event starts, its validator checks the
request once and shows a bad setting's message under its control, so a refused run leaves
the page as it was; the event runs what the validator accepted. Nothing here decodes or draws.

The page is built in two parts: ``build_layout`` makes the components (each setting's
control from its specification, ``app.engine.config.SETTINGS``) and ``wire`` attaches the
events. The engine events' signatures, which Gradio turns into the public API, come from the
same specification (``event_signature``).

Reliability (one model, many visitors): every event that runs the engine shares one worker
(``concurrency_id="engine"``, limit 1), the queue is bounded, each visitor's data lives in
their own ``gr.State``, and Stop cancels the running event (its generator is closed, which
closes the engine's iterator: generation ends after the current step).
"""
from __future__ import annotations

import contextlib
import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from app.engine.config import SETTING, SETTINGS, Setting, TreeConfig
from app.ui import handlers, limits, methods, traces
from app.ui.explain import EXAMPLES, HOW_IT_WORKS, HOW_IT_WORKS_VIEWS, TOUR_STEPS, WHAT_IS_THIS, header_markdown
from app.ui.requests import (AUTO_PRESET, CUSTOM_PRESET, METHOD_KNOBS, SETTING_NAMES, SWEEP_KNOBS, TREE_KNOBS,
                              TREE_PRESETS, Checked, preset_of, tree_preset)
from app.ui.session import Session, close_session
from app.ui.settings import AppContext, ServerConfig, gpu
from app.viz.autotune import choice_figure, choice_markdown
from app.viz.safe import page_message
from app.viz.style import legend_html
from app.viz.verify_view import tree_caption

REPO_ROOT = Path(__file__).resolve().parents[2]
CSS_PATH = REPO_ROOT / "static" / "app.css"
JS_PATH = REPO_ROOT / "static" / "app.js"
TRACES_DIR = REPO_ROOT / "traces"
ENGINE = "engine"   # the concurrency id shared by every event that runs the model

# View name -> the order of outputs of the main events.
# (The first release's outputs keep their places; later views are appended, so the API's
# output order never changes.)
RUN_VIEWS = ("status", "stream", "tree", "speedup", "race", "slider", "phases", "depth", "calibration", "per_step",
             "trace_file", "mask", "mask_caption", "kv", "kv_caption", "ab_trees", "ab", "ab_caption")
REPLAY_VIEWS = ("stream", "tree", "phases", "mask", "mask_caption", "kv", "kv_caption", "ab_trees", "status")
PLAY_VIEWS = REPLAY_VIEWS + ("slider",)
EXPLORE_VIEWS = ("explorer_plot", "explorer_status")
COMPARE_VIEWS = ("ab", "ab_trees", "ab_caption")
METHODS_VIEWS = methods.VIEW_NAMES
PLAY_SPEEDS = {"slow: 2 s a step": 2.0, "1 s a step": 1.0, "fast: 0.5 s a step": 0.5}


def demo_traces(folder: Path = TRACES_DIR) -> dict[str, str]:
    """{name: path} of the shipped traces: the server's own list, chosen from by name only."""
    return {p.stem: str(p) for p in sorted(folder.glob("*.json"))}


def page_script() -> str:
    """The page's script (static/app.js: the guided tour, tree-to-mask hover, in-page links),
    with the tour's steps from ``explain.TOUR_STEPS``."""
    return JS_PATH.read_text(encoding="utf-8").replace("__TOUR_STEPS__", json.dumps(TOUR_STEPS))


def launch_kwargs(config: ServerConfig) -> dict:
    """Arguments for ``demo.launch`` (css and js live here in Gradio 6). Never ``share=True``."""
    return dict(css_paths=[str(CSS_PATH)], js=page_script(), max_file_size=config.trace_max_bytes, show_error=False,
                state_session_capacity=config.public_limits.sessions_max,
                app_kwargs=limits.app_kwargs(config, trace_dirs=[handlers.TRACE_DIR]))   # per-visitor bounds


def _to_output(name: str, value):
    if name == "slider" and isinstance(value, tuple):   # (maximum, value): a range change
        maximum, current = value
        return gr.Slider(minimum=0, maximum=max(maximum, 1), value=current, step=1)
    if name == "trace_file":
        return gr.DownloadButton(value=value, interactive=value is not None)
    return value


def _outputs(view: dict, names) -> tuple:
    return tuple(_to_output(n, view[n]) if n in view else gr.skip() for n in names)


def _plain(name: str, value):
    """The plain value of a view entry, for resending it unchanged (no property update)."""
    return value[1] if name == "slider" and isinstance(value, tuple) else value


@contextlib.contextmanager
def page_errors():
    """A ``ValueError`` (a refused request: its message names the setting) becomes a
    ``gr.Error``, the message Gradio shows on the page, without a server traceback."""
    try:
        yield
    except ValueError as exc:
        raise gr.Error(page_message(exc), print_exception=False) from None


def _stream(gen, names):
    """Run a handler generator, mapping views to outputs and ValueErrors to page messages.
    ``finally`` closes the handler at once when Gradio cancels this event (Stop, closed tab).

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


TREE_SIZE_NOT_MEASURED = (
    "The page's default tree was not sized for this machine: the server runs without a draft head, or "
    "with `EAGLE_LENS_AUTO_TREE=0`. With both, it measures the target's forward cost over tree sizes and "
    "the head's acceptance once, picks the tree with the highest predicted tokens/s, and shows why here "
    "(`python -m app generate` with method dynamic and no tree knobs prints the same choice).")

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


def make_explore(ctx: AppContext, checked: Checked):
    """The threshold explorer's event (API ``/explore``): knob, start, stop, count, then the
    settings, all required."""
    signature = event_signature(before=(("knob", str), ("start", float), ("stop", float), ("count", int)),
                                defaults={"adapt": False},   # added after the first release: optional
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


def settings_validator(check, names: tuple, checked: Checked):
    """Gradio's event validator for an engine event whose inputs are named ``names`` (None for
    the session): it runs ``check(*values)`` once, before the event. A refusal is shown under
    the control it names and the event never starts, so the page keeps the run it shows
    (raising ``gr.Error`` from the event instead marks every output of the run as failed and
    blanks its plots). What passes is handed to the event (``checked``), which then runs it
    without validating again. A problem of no one input is left to the event."""

    def validate(*values):
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


def applicability(method) -> tuple:
    """Updates for the controls of the settings that apply to some methods only (the tree
    knobs, then ``adapt``: ``METHOD_KNOBS``) when the method changes: one that does nothing
    under this method is disabled, with a note saying why (``Setting.why_not``)."""
    return tuple(gr.update(interactive=SETTING[k].applies_to(method), info=SETTING[k].why_not(method))
                 for k in METHOD_KNOBS)


# --- layout ------------------------------------------------------------------------------------

@dataclass
class Components:
    """Every component the wiring needs, made by ``build_layout``."""

    session: gr.State
    controls: dict              # setting name -> its control (SETTINGS)
    step_mode: gr.Checkbox
    race: gr.Checkbox
    generate_btn: gr.Button
    stop_btn: gr.Button
    step_btn: gr.Button
    settings_btn: gr.Button
    sidebar: gr.Sidebar
    example: gr.Dropdown
    preset: gr.Dropdown
    outputs: dict               # view name -> component (RUN_VIEWS, EXPLORE_VIEWS)
    play_btn: gr.Button
    play_speed: gr.Dropdown
    timer: gr.Timer
    pin_btn: gr.Button
    knob: gr.Dropdown
    start: gr.Number
    stop_value: gr.Number
    count: gr.Slider
    explore_btn: gr.Button
    upload: gr.File
    demo_choice: gr.Dropdown
    demo_btn: gr.Button
    methods_box: gr.CheckboxGroup
    methods_tokens: gr.Slider
    methods_btn: gr.Button

    @property
    def settings(self) -> list:
        """The settings' controls in the order the events (and their validators) take them."""
        return [self.controls[name] for name in SETTING_NAMES]

    @property
    def restored(self) -> list:
        """What loading a trace sets besides its views: every setting's control, the race
        checkbox and the preset menu (``restore_outputs``)."""
        return self.settings + [self.race, self.preset]

    def views(self, names) -> list:
        return [self.outputs[name] for name in names]


SAMPLING_ONLY = ("top_p", "seed")   # settings that greedy decoding (temperature 0) ignores


def sampling_note(name: str, temperature) -> str | None:
    """Why a sampling-only setting does nothing at this temperature (None when it applies)."""
    if name in SAMPLING_ONLY and not (isinstance(temperature, (int, float)) and temperature > 0):
        return f"{name} applies to sampling only: at temperature 0 decoding is greedy (raise the temperature to use it)"
    return None


def sampling_applicability(temperature) -> tuple:
    """Updates for top_p and seed when the temperature changes: disabled, with the note, at 0."""
    return tuple(gr.update(interactive=sampling_note(k, temperature) is None, info=sampling_note(k, temperature) or "")
                 for k in SAMPLING_ONLY)


def setting_control(s: Setting, value, method: str, cfg: ServerConfig, temperature=None):
    """The page's control for one setting from its specification: its range (the page's cap
    where it is lower, the server's cap for max_new_tokens), default and step; disabled with a
    note when it does not apply to ``method`` (or, for top_p and seed, at ``temperature`` 0)."""
    elem_id = s.name.replace("_", "-")
    note = sampling_note(s.name, temperature)
    if s.name == "seed":
        return gr.Number(value, precision=0, minimum=s.lo, label=s.label, elem_id=elem_id,
                         interactive=note is None, info=note)
    if s.kind == "bool":
        return gr.Checkbox(value, label=s.label, elem_id=elem_id, interactive=s.applies_to(method),
                           info=s.why_not(method) or None)
    hi = cfg.max_new_tokens if s.name == "max_new_tokens" else s.page_hi if s.page_hi is not None else s.hi
    return gr.Slider(s.lo, hi, value=min(value, hi), step=s.step, label=s.label, elem_id=elem_id,
                     interactive=s.applies_to(method) and note is None, info=s.why_not(method) or note)


def control_value(name: str, value, cfg: ServerConfig):
    """A setting's value from a trace, as its control can hold it (a slider's range may be
    narrower than the trace's: a server with a lower max_new_tokens cap)."""
    s = SETTING[name]
    if s.kind in ("int", "float") and name != "seed":
        hi = cfg.max_new_tokens if name == "max_new_tokens" else s.page_hi if s.page_hi is not None else s.hi
        return min(max(value, s.lo), hi)
    return value


EXAMPLES_ENTRY = "Example prompts…"   # the example menu's first entry: a title, not a prompt


def _prompt_row(cfg: ServerConfig) -> dict:
    """The prompt, an example menu, the run buttons and the settings panel's button: one row
    above the stage."""
    with gr.Row(elem_id="prompt-row", equal_height=True):
        prompt = gr.Textbox(label=SETTING["prompt"].label, show_label=False, lines=1, max_lines=4, elem_id="prompt",
                            scale=6, max_length=cfg.max_prompt_chars, container=False,
                            placeholder="Type a prompt, or pick an example →")
        example = gr.Dropdown([(EXAMPLES_ENTRY, "")] + [(f"{cat}: {p[:60]}…", p) for cat, p in EXAMPLES],
                              value="", show_label=False,
                              label="Example prompts", elem_id="example-choice", scale=2, min_width=150,
                              container=False)
        buttons = dict(generate_btn=gr.Button("Generate", variant="primary", elem_id="generate-btn", min_width=90,
                                              scale=0),
                       stop_btn=gr.Button("Stop", variant="stop", elem_id="stop-btn", min_width=60, scale=0),
                       step_btn=gr.Button("Step ▶", elem_id="step-btn", min_width=80, scale=0),
                       settings_btn=gr.Button("⚙ Settings", elem_id="settings-btn", min_width=110, scale=0))
    return dict(prompt=prompt, example=example, **buttons)


def _settings_panel(ctx: AppContext) -> dict:
    """The side panel: the method, max_new_tokens, the race, adapt and step-mode switches, and
    the tree and sampling accordions: one control per setting of the specification
    (``SETTINGS``), in its accordion (``FOLDED``)."""
    method = SETTING["method"].default if ctx.has_head else "vanilla"
    values = page_defaults(ctx.tree_defaults)
    gr.Markdown("### Settings\nThe run on screen set these; **Generate** runs them.")
    controls = {"method": gr.Radio(list(SETTING["method"].page_choices or SETTING["method"].choices), value=method, label=SETTING["method"].label,
                                   elem_id="method")}
    for s in SETTINGS:
        if s.kind in ("int", "float", "bool") and s.name not in FOLDED:
            controls[s.name] = setting_control(s, values[s.name], method, ctx.config)
    race = gr.Checkbox(True, label="race against plain decoding (vanilla runs alongside, for the speedup)",
                       elem_id="race")
    step_mode = gr.Checkbox(False, label="Step mode (classroom): pause after every step; "
                            "press Step for the next one", elem_id="step-mode")
    preset = None
    for title in ACCORDIONS.values():
        with gr.Accordion(title, open=False):
            if title == ACCORDIONS["tree"]:
                preset = gr.Dropdown(list(TREE_PRESETS) + [CUSTOM_PRESET], value=AUTO_PRESET,
                                     label="preset (total / depth / top_k)", elem_id="tree-preset",
                                     info="the fastest tree depends on the hardware: compare them in the race")
            for s in SETTINGS:
                if FOLDED.get(s.name) == title:
                    controls[s.name] = setting_control(s, values[s.name], method, ctx.config,
                                                       temperature=values.get("temperature"))
    return dict(controls=controls, preset=preset, race=race, step_mode=step_mode)


def _stage() -> dict:
    """The classroom stage, one screen: the tree of the step shown (left), and beside it the
    step slider with autoplay and, in tabs, the step's account, attention mask and KV cache."""
    out = {}
    with gr.Row(elem_id="stage", equal_height=False):
        with gr.Column(scale=6, min_width=420):
            out["tree"] = gr.Plot(label="Draft tree of the step shown", elem_id="tree-plot", show_label=False)
            gr.Markdown(tree_caption(), elem_id="tree-caption", elem_classes=["caption"])
        with gr.Column(scale=5, min_width=380):
            out["status"] = gr.Markdown("", elem_id="status")
            with gr.Row(elem_id="player"):
                out["slider"] = gr.Slider(0, 1, value=0, step=1, label="Step (0 = the prefill, then 1, 2, …)",
                                          elem_id="step-slider", scale=4)
                with gr.Column(scale=1, min_width=110):
                    play = dict(play_btn=gr.Button("▶ Play", elem_id="play-btn", size="sm"),
                                play_speed=gr.Dropdown(list(PLAY_SPEEDS), value="1 s a step", show_label=False,
                                                       elem_id="play-speed", container=False),
                                timer=gr.Timer(PLAY_SPEEDS["1 s a step"], active=False))
            with gr.Tabs(elem_id="step-tabs"):
                with gr.Tab("What happened", elem_id="phases-tab"):
                    out["phases"] = gr.Markdown(handlers.phase_account(None), elem_id="phases")
                with gr.Tab("Attention mask", elem_id="mask-tab"):
                    out["mask"] = gr.Plot(elem_id="mask-plot", show_label=False)
                    out["mask_caption"] = gr.Markdown("", elem_id="mask-caption", elem_classes=["caption"])
                with gr.Tab("KV cache", elem_id="kv-tab"):
                    out["kv"] = gr.Plot(elem_id="kv-plot", show_label=False)
                    out["kv_caption"] = gr.Markdown("", elem_id="kv-caption", elem_classes=["caption"])
    with gr.Row():
        with gr.Column(scale=1):
            out["stream"] = gr.HTML(handlers.stream_html([]), label="Token stream", elem_id="token-stream")
            gr.HTML(legend_html())
        with gr.Column(scale=1):
            out["speedup"] = gr.Markdown("", elem_id="speedup")
            pin_btn = gr.Button("Pin this run as A (then run B: compare them in the tab Compare A/B)",
                                elem_id="pin-btn", size="sm")
            out["race"] = gr.Plot(label="Speed race", elem_id="race-plot")
    return dict(out, pin_btn=pin_btn, **play)


def _explorer_tab(cfg: ServerConfig) -> dict:
    gr.Markdown("Run the prompt for several values of one knob, a tree knob or the temperature "
                f"(other settings as in the side panel, at most {cfg.explore_max_new_tokens} tokens per run), "
                f"each value {handlers.EXPLORE_REPEATS} times: a value is named best only when it beats the "
                "others by more than the run-to-run noise. A knob must shape the chosen method's tree.")
    with gr.Row():
        parts = dict(knob=gr.Dropdown(list(SWEEP_KNOBS), value="total_tokens", label="knob", elem_id="explore-knob"),
                     start=gr.Number(8, label="from", elem_id="explore-start"),
                     stop_value=gr.Number(48, label="to", elem_id="explore-stop"),
                     count=gr.Slider(2, cfg.explore_max_values, value=4, step=1, label="values",
                                     elem_id="explore-count"))
    parts["explore_btn"] = gr.Button("Run sweep", elem_id="explore-btn")
    views = dict(explorer_status=gr.Markdown("", elem_id="explore-status"),
                 explorer_plot=gr.Plot(label="Sweep", elem_id="explore-plot"))
    return dict(parts, views=views)


def _tree_size_tab(ctx: AppContext) -> None:
    if ctx.tree_choice is not None:
        gr.Markdown(choice_markdown(ctx.tree_choice), elem_id="tree-size-text")
        gr.Plot(choice_figure(ctx.tree_choice), label="Cost curve and predicted speed", elem_id="tree-size-plot")
    else:
        gr.Markdown(TREE_SIZE_NOT_MEASURED, elem_id="tree-size-text")


def _traces_tab(demos: dict[str, str]) -> dict:
    gr.Markdown("Download this run as JSON (settings + every step record), or load one — "
                "replay needs no model at all. Loading a run also sets every control to its settings, "
                "so Generate runs it again.")
    download = gr.DownloadButton("Download trace (.json)", interactive=False, elem_id="trace-download")
    upload = gr.File(label="Load a trace (.json)", file_types=[".json"], type="filepath", elem_id="trace-upload")
    with gr.Row():
        demo_choice = gr.Dropdown(list(demos), value=next(iter(demos), None), label="Recorded demos",
                                  elem_id="demo-choice")
        demo_btn = gr.Button("Show demo", elem_id="demo-btn")
    return dict(upload=upload, demo_choice=demo_choice, demo_btn=demo_btn, views={"trace_file": download})


def _compare_tab() -> dict:
    gr.Markdown("Pin a run as **A** (the button under the speedup), then run another — change the tree, "
                "the method or the temperature, or load another demo: that run is **B**. One pinned run is "
                "kept; pinning again replaces it. The trees are drawn at the step the slider shows.")
    return dict(ab_caption=gr.Markdown("_Nothing pinned yet._", elem_id="ab-caption"),
                ab=gr.Plot(label="A against B", elem_id="ab-plot", show_label=False),
                ab_trees=gr.Plot(label="The two trees at the same step", elem_id="ab-trees-plot", show_label=False))


def _methods_tab(ctx: AppContext) -> dict:
    """Prompt lookup, lookahead, Medusa, EAGLE-1 and EAGLE-2 on the prompt above, in turns
    (``app.ui.methods``)."""
    gr.Markdown("Pick 2–4 methods and run them on the prompt above. They take turns on this machine, "
                f"{handlers.RACE_CHUNK_TOKENS} tokens each, greedy, every one verified by the same target forward "
                "and the same acceptance rule, all within the page's node budget (*Tree knobs*). The table under "
                "the trees puts this machine's ratios beside the published ones.", elem_classes=["caption"])
    choices = [(methods.choice_label(m), m) for m in methods.available_methods(ctx)]
    with gr.Row():
        parts = dict(methods_box=gr.CheckboxGroup(choices, value=methods.default_methods(ctx), label="methods",
                                                  elem_id="compare-methods", scale=4),
                     methods_tokens=gr.Slider(16, 128, value=methods.DEFAULT_TOKENS, step=16, label="new tokens",
                                              elem_id="compare-tokens", scale=1))
    parts["methods_btn"] = gr.Button("Run the comparison", elem_id="compare-methods-btn")
    views = dict(methods_status=gr.Markdown("", elem_id="methods-status"),
                 methods_table=gr.Markdown("", elem_id="methods-table"),
                 methods_race=gr.Plot(label="Tokens vs time", elem_id="methods-race-plot", show_label=False),
                 methods_trees=gr.Plot(label="Each method's tree", elem_id="methods-trees-plot", show_label=False),
                 methods_literature=gr.Markdown(methods.literature_table({}), elem_id="methods-literature"))
    return dict(parts, views=views)


def _tabs(ctx: AppContext, demos: dict[str, str]) -> dict:
    with gr.Tabs(elem_id="more-tabs"):
        with gr.Tab("How it works", elem_id="how-tab"):
            gr.Markdown(HOW_IT_WORKS)
            gr.Markdown(HOW_IT_WORKS_VIEWS, elem_id="how-views")
            gr.HTML(legend_html())
        with gr.Tab("Compare A/B", elem_id="compare-tab"):
            views = _compare_tab()
        with gr.Tab("Compare methods", elem_id="methods-tab"):
            methods_tab = _methods_tab(ctx)
        with gr.Tab("Insights"):
            gr.Markdown("Over the whole run: how often the target accepted a guess at each depth, whether the head's "
                        "confidence predicts that (calibration), and how many tokens each step wrote.",
                        elem_classes=["caption"])
            with gr.Row():
                views.update(depth=gr.Plot(label="Acceptance by depth", elem_id="depth-plot"),
                             calibration=gr.Plot(label="Calibration", elem_id="calibration-plot"),
                             per_step=gr.Plot(label="Tokens per step", elem_id="per-step-plot"))
        with gr.Tab("Threshold explorer"):
            explorer = _explorer_tab(ctx.config)
        with gr.Tab("Tree size for this machine", elem_id="tree-size-tab"):
            _tree_size_tab(ctx)
        with gr.Tab("Traces"):
            traces_tab = _traces_tab(demos)
    views.update(explorer.pop("views"), **traces_tab.pop("views"), **methods_tab.pop("views"))
    return dict(explorer, **traces_tab, **methods_tab, views=views)


def page_header(ctx: AppContext) -> str:
    """The header's Markdown (``explain.header_markdown``) from this server's engine and tree."""
    if ctx.engine is None:
        return header_markdown(None, None, False)
    tree = ctx.tree_defaults
    return header_markdown(handlers._model_info(ctx),
                           {"total_tokens": tree.total_tokens, "depth": tree.depth, "top_k": tree.top_k},
                           ctx.tree_choice is not None, ctx.head_missing)


def build_layout(ctx: AppContext, demos: dict[str, str]) -> Components:
    """Every component of the page, inside the caller's ``gr.Blocks``; no events."""
    session = gr.State(Session(), time_to_live=ctx.config.session_ttl_s, delete_callback=close_session)
    gr.Markdown(page_header(ctx), elem_id="header")
    if ctx.head_missing:
        gr.Markdown(f"⚠️ {ctx.head_missing}", elem_id="head-warning")
    with gr.Accordion("What am I looking at?", open=False, elem_id="what-is-this"):
        gr.Markdown(WHAT_IS_THIS)
    with gr.Sidebar(label="Settings", open=False, elem_id="settings-panel", width=360) as sidebar:
        panel = _settings_panel(ctx)
    top = _prompt_row(ctx.config)
    stage = _stage()
    tabs = _tabs(ctx, demos)
    outputs = {k: stage.pop(k) for k in list(stage) if k not in ("play_btn", "play_speed", "timer", "pin_btn")}
    outputs.update(tabs.pop("views"))
    controls = {"prompt": top.pop("prompt"), **panel["controls"]}
    return Components(session=session, controls=controls, preset=panel["preset"], race=panel["race"],
                      step_mode=panel["step_mode"], sidebar=sidebar, outputs=outputs, **top, **stage, **tabs)


# --- wiring -----------------------------------------------------------------------------------

def wire(demo: gr.Blocks, c: Components, ctx: AppContext, demos: dict[str, str]) -> None:
    """Every event of the page, inside ``demo``'s context."""
    engine_events = wire_engine(c, ctx)
    wire_stop(c, engine_events)
    wire_knobs(c, ctx.tree_defaults)
    wire_replay_and_traces(demo, c, ctx, demos)
    wire_autoplay(c)
    wire_compare(c)


def wire_engine(c: Components, ctx: AppContext) -> list:
    """Generate (button and Enter), Step and the explorer: the events that run the model, on
    one worker (``ENGINE``). Each validates its inputs once, in its validator (see
    ``settings_validator``). Returns the events, for Stop to cancel."""
    checked = Checked()
    run_outputs = c.views(RUN_VIEWS)
    # preprocess=False: the raw JSON values reach the handlers, whose own validation names
    # the parameter and its range in every message (the components' checks would not).
    engine_events = dict(concurrency_limit=1, concurrency_id=ENGINE, preprocess=False)
    n = len(SETTING_NAMES)

    def check_generate(*values):
        return handlers.check_generate(ctx, dict(zip(SETTING_NAMES, values)), values[n], values[n + 1])

    def check_explore(*values):
        return handlers.check_explore(ctx, *values[:4], dict(zip(SETTING_NAMES, values[4:])))

    def next_step(session: Session):
        yield from _stream(handlers.step(ctx, session), RUN_VIEWS)

    generate = make_generate(ctx, checked)
    generate_validator = settings_validator(check_generate, SETTING_NAMES + ("step_mode", "race", None), checked)
    inputs = c.settings + [c.step_mode, c.race, c.session]
    events = [c.generate_btn.click(generate, inputs, run_outputs, api_name="generate", validator=generate_validator,
                                   **engine_events),
              c.controls["prompt"].submit(generate, inputs, run_outputs, api_visibility="private",
                                          validator=generate_validator, **engine_events)]
    events.append(c.step_btn.click(precheck(handlers.check_step), [c.session], None, api_visibility="private")
                  .success(gpu(next_step), [c.session], run_outputs, api_name="step", **engine_events))
    events.append(wire_methods(c, ctx, engine_events))
    events.append(c.explore_btn.click(
        make_explore(ctx, checked), [c.knob, c.start, c.stop_value, c.count] + c.settings + [c.session],
        c.views(EXPLORE_VIEWS), api_name="explore",
        validator=settings_validator(check_explore, handlers.SWEEP_FIELDS + SETTING_NAMES + (None,), checked),
        **engine_events))
    return events


def wire_methods(c: Components, ctx: AppContext, engine_events: dict):
    """The method comparison (API ``/compare_methods``): prompt, methods, max_new_tokens.
    Validated before it starts (a refusal shows under the control it names)."""
    checked = Checked()

    def check(prompt, chosen, max_new_tokens):
        return methods.check_compare(ctx, prompt, chosen, max_new_tokens)

    def compare_methods(prompt: str, methods_list: list[str], max_new_tokens: int = methods.DEFAULT_TOKENS,
                        session: Session | None = None):
        """Run 2-4 methods on one prompt in turns; per method its tree, tau, tokens/s and the race."""
        session = session if isinstance(session, Session) else Session()
        gen = methods.compare_methods(ctx, session, prompt, methods_list, max_new_tokens,
                                      checked=checked.get([prompt, methods_list, max_new_tokens]))
        yield from _stream(gen, METHODS_VIEWS)

    names = ("prompt", "methods", "max_new_tokens", None)
    return c.methods_btn.click(gpu(compare_methods), [c.controls["prompt"], c.methods_box, c.methods_tokens, c.session],
                               c.views(METHODS_VIEWS), api_name="compare_methods",
                               validator=settings_validator(check, names, checked), **engine_events)


def wire_stop(c: Components, engine_events: list) -> None:
    def stop(session: Session):
        return _once(lambda: handlers.stop(session), RUN_VIEWS)

    c.stop_btn.click(stop, [c.session], c.views(RUN_VIEWS), api_name="stop", cancels=engine_events)


def wire_knobs(c: Components, tree0: TreeConfig) -> None:
    """The knobs: a method change enables the controls that apply to it; a preset moves three
    knobs; a knob moved by hand updates the preset menu; an example fills the prompt. No
    engine work, so no queue."""
    c.controls["method"].change(applicability, [c.controls["method"]], [c.controls[k] for k in METHOD_KNOBS],
                                queue=False, api_visibility="private", show_progress="hidden")
    c.controls["temperature"].change(sampling_applicability, [c.controls["temperature"]],
                                     [c.controls[k] for k in SAMPLING_ONLY], queue=False, api_visibility="private",
                                     show_progress="hidden")
    sizes = [c.controls[k] for k in ("depth", "top_k", "total_tokens")]

    def choose_preset(name: str):
        """(depth, top_k, total_tokens) of a named tree (requests.TREE_PRESETS) for the sliders;
        the custom entry leaves them as they are."""
        with page_errors():
            shape = tree_preset(name, tree0)
        return (gr.skip(),) * 3 if shape is None else shape

    def name_preset(depth: float, top_k: float, total_tokens: float) -> str:
        """The preset menu's entry after the user moved a knob: the preset it now matches, or custom."""
        return preset_of(depth, top_k, total_tokens, tree0)

    c.preset.input(choose_preset, [c.preset], sizes, api_name="tree_preset", queue=False, preprocess=False)
    for knob_slider in sizes:   # moved by hand: the menu follows
        knob_slider.input(name_preset, sizes, [c.preset], queue=False, preprocess=False,
                          api_visibility="private", show_progress="hidden", trigger_mode="always_last")
    c.example.input(lambda text: text if isinstance(text, str) and text else gr.skip(), [c.example],
                    [c.controls["prompt"]], queue=False, api_visibility="private", show_progress="hidden")
    c.settings_btn.click(lambda: gr.Sidebar(open=True), None, [c.sidebar], queue=False, api_visibility="private",
                         show_progress="hidden")


# What the first demo, shown on page load, leaves at the page's defaults: the tree it drafts
# with (the method, its knobs, adapt), so the first Generate runs the tree the header names
# for this machine, not the demo's. The Load-demo button restores these too.
TREE_SETTINGS = ("method", *TREE_KNOBS, "adapt")


def restore_outputs(view: dict, ctx: AppContext, tree: bool = True) -> tuple:
    """Values for ``Components.restored`` from a loaded trace's view: each setting's control
    gets the trace's value (the page's default for a setting the trace predates), the race
    checkbox whether it raced, the preset menu the tree the knobs now hold. Without ``tree``
    the controls of ``TREE_SETTINGS`` and the preset menu are left as they are (on page load:
    the page's defaults). A view without settings (a refused load) leaves every control alone."""
    settings = view.get("settings")
    if settings is None:
        return (gr.skip(),) * (len(SETTING_NAMES) + 2)
    defaults = page_defaults(ctx.tree_defaults)
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

    def load_trace(session: Session, path, request: gr.Request):
        def show():
            trace = handlers.read_trace_file(ctx, path)
            # its records must fit this address's share and the server's budget (limits)
            limits.admit_records(demo.server_app, getattr(request, "session_hash", None), traces.trace_bytes(trace))
            return handlers.show_trace(session, trace, "uploaded trace")
        return loaded(session, show)

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

    slider = c.outputs["slider"]
    slider.input(replay, [c.session, slider], c.views(REPLAY_VIEWS), api_name="replay",
                 trigger_mode="always_last", preprocess=False)
    c.upload.upload(precheck(lambda path: handlers.read_trace_file(ctx, path)), [c.upload], None,
                    api_visibility="private").success(load_trace, [c.session, c.upload], load_outputs,
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

    c.play_btn.click(toggle, [playing, c.session, c.outputs["slider"]],
                     [playing, c.timer, c.play_btn, c.outputs["slider"]], api_visibility="private",
                     show_progress="hidden", preprocess=False)
    c.timer.tick(tick, [c.session, c.outputs["slider"]], c.views(PLAY_VIEWS) + [playing, c.timer, c.play_btn],
                 api_visibility="private", show_progress="hidden", preprocess=False)
    c.play_speed.change(lambda name: gr.Timer(value=PLAY_SPEEDS.get(name, 1.0)), [c.play_speed], [c.timer],
                        api_visibility="private", show_progress="hidden", queue=False)


def wire_compare(c: Components) -> None:
    """Pin this run as A: kept in the visitor's session (one pinned run); the next run on
    screen is B and the comparison panel follows it (``handlers.compare_view``)."""
    def pin(session: Session):
        return _once(lambda: handlers.pin(session), COMPARE_VIEWS)

    c.pin_btn.click(pin, [c.session], c.views(COMPARE_VIEWS), api_name="pin")


def build_demo(ctx: AppContext, demos: dict[str, str] | None = None) -> gr.Blocks:
    """The whole page for one server context: layout, then wiring. Tests pass a tiny-model context."""
    demos = demo_traces() if demos is None else demos
    with gr.Blocks(title="EAGLE Lens", delete_cache=(3600, 3600)) as demo:
        wire(demo, build_layout(ctx, demos), ctx, demos)
    demo.queue(max_size=ctx.config.queue_size, default_concurrency_limit=4)
    limits.bound_queue_joins(demo._queue, ctx.config.public_limits)   # the cap holds for joins together, per client
    calm_queue_polling(demo)
    return demo


# Gradio's queue loop polls for new events every 1 ms and for progress every 10 ms, even when
# idle (gradio/queueing.py, `sleep_when_free`): ~1,100 wake-ups a second of the server thread.
# On a 2-core CPU each wake-up preempts one of the engine's two OpenMP threads, and the whole
# OpenMP team waits for it at the next barrier, so the polling alone costs decoding speed.
# A queued job now starts within 50 ms instead of 1 ms, which no visitor can see.
QUEUE_POLL_S = 0.05
PROGRESS_POLL_S = 0.1


def calm_queue_polling(demo: gr.Blocks) -> None:
    """Slow the Gradio queue's idle polling (see above); fail loudly if Gradio renames it."""
    queue = demo._queue  # private: Gradio has no public setting for these two intervals
    for name, value in (("sleep_when_free", QUEUE_POLL_S), ("progress_update_sleep_when_free", PROGRESS_POLL_S)):
        if not hasattr(queue, name):
            raise RuntimeError(f"gradio.queueing.Queue has no {name!r} any more: update calm_queue_polling")
        setattr(queue, name, value)
