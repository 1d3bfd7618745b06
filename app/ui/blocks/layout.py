"""The page's components, made from the settings' specification where there is one
(``SETTINGS``); no events (``wire`` and the feature modules attach them). ``build_layout``
returns them as ``Components``."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from app.engine.forward import describe as describe_forward
from app.engine.spec import SETTING, SETTINGS, Setting
from app.ui import handlers, methods
from app.ui.blocks.api import ACCORDIONS, FOLDED, page_defaults
from app.ui.explain import EXAMPLES, HOW_IT_WORKS, HOW_IT_WORKS_VIEWS, WHAT_IS_THIS, header_markdown
from app.ui.handlers import ExploreView, RunView
from app.ui.requests import AUTO_PRESET, CUSTOM_PRESET, SETTING_NAMES, SWEEP_KNOBS, TREE_PRESETS
from app.ui.session import Session, close_session
from app.ui.settings import AppContext, ServerConfig
from app.viz.autotune import choice_figure, choice_markdown
from app.viz.style import legend_html
from app.viz.verify_view import tree_caption

PLAY_SPEEDS = {"slow: 2 s a step": 2.0, "1 s a step": 1.0, "fast: 0.5 s a step": 0.5}


TREE_SIZE_NOT_MEASURED = (
    "The page's default tree was not sized for this machine: the server runs without a draft head, or "
    "with `EAGLE_LENS_AUTO_TREE=0`. With both, it measures the target's forward cost over tree sizes and "
    "the head's acceptance once, picks the tree with the highest predicted tokens/s, and shows why here "
    "(`python -m app generate` with method dynamic and no tree knobs prints the same choice).")


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
    outputs: dict               # view (RunView, ExploreView, MethodsView) -> its component
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
            out[RunView.TREE] = gr.Plot(label="Draft tree of the step shown", elem_id="tree-plot", show_label=False)
            gr.Markdown(tree_caption(), elem_id="tree-caption", elem_classes=["caption"])
        with gr.Column(scale=5, min_width=380):
            out[RunView.STATUS] = gr.Markdown("", elem_id="status")
            with gr.Row(elem_id="player"):
                out[RunView.SLIDER] = gr.Slider(0, 1, value=0, step=1, label="Step (0 = the prefill, then 1, 2, …)",
                                                elem_id="step-slider", scale=4)
                with gr.Column(scale=1, min_width=110):
                    play = dict(play_btn=gr.Button("▶ Play", elem_id="play-btn", size="sm"),
                                play_speed=gr.Dropdown(list(PLAY_SPEEDS), value="1 s a step", show_label=False,
                                                       elem_id="play-speed", container=False),
                                timer=gr.Timer(PLAY_SPEEDS["1 s a step"], active=False))
            with gr.Tabs(elem_id="step-tabs"):
                with gr.Tab("What happened", elem_id="phases-tab"):
                    out[RunView.PHASES] = gr.Markdown(handlers.phase_account(None), elem_id="phases")
                with gr.Tab("Attention mask", elem_id="mask-tab"):
                    out[RunView.MASK] = gr.Plot(elem_id="mask-plot", show_label=False)
                    out[RunView.MASK_CAPTION] = gr.Markdown("", elem_id="mask-caption", elem_classes=["caption"])
                with gr.Tab("KV cache", elem_id="kv-tab"):
                    out[RunView.KV] = gr.Plot(elem_id="kv-plot", show_label=False)
                    out[RunView.KV_CAPTION] = gr.Markdown("", elem_id="kv-caption", elem_classes=["caption"])
    with gr.Row():
        with gr.Column(scale=1):
            out[RunView.STREAM] = gr.HTML(handlers.stream_html([]), label="Token stream", elem_id="token-stream")
            gr.HTML(legend_html())
        with gr.Column(scale=1):
            out[RunView.SPEEDUP] = gr.Markdown("", elem_id="speedup")
            pin_btn = gr.Button("Pin this run as A (then run B: compare them in the tab Compare A/B)",
                                elem_id="pin-btn", size="sm")
            out[RunView.RACE] = gr.Plot(label="Speed race", elem_id="race-plot")
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
    views = {ExploreView.STATUS: gr.Markdown("", elem_id="explore-status"),
             ExploreView.PLOT: gr.Plot(label="Sweep", elem_id="explore-plot")}
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
    return dict(upload=upload, demo_choice=demo_choice, demo_btn=demo_btn, views={RunView.TRACE_FILE: download})


def _compare_tab() -> dict:
    gr.Markdown("Pin a run as **A** (the button under the speedup), then run another — change the tree, "
                "the method or the temperature, or load another demo: that run is **B**. One pinned run is "
                "kept; pinning again replaces it. The trees are drawn at the step the slider shows.")
    return {RunView.AB_CAPTION: gr.Markdown("_Nothing pinned yet._", elem_id="ab-caption"),
            RunView.AB: gr.Plot(label="A against B", elem_id="ab-plot", show_label=False),
            RunView.AB_TREES: gr.Plot(label="The two trees at the same step", elem_id="ab-trees-plot",
                                      show_label=False)}


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
    view = methods.MethodsView
    views = {view.STATUS: gr.Markdown("", elem_id="methods-status"),
             view.TABLE: gr.Markdown("", elem_id="methods-table"),
             view.RACE: gr.Plot(label="Tokens vs time", elem_id="methods-race-plot", show_label=False),
             view.TREES: gr.Plot(label="Each method's tree", elem_id="methods-trees-plot", show_label=False),
             view.LITERATURE: gr.Markdown(methods.literature_table({}), elem_id="methods-literature")}
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
                views.update({RunView.DEPTH: gr.Plot(label="Acceptance by depth", elem_id="depth-plot"),
                              RunView.CALIBRATION: gr.Plot(label="Calibration", elem_id="calibration-plot"),
                              RunView.PER_STEP: gr.Plot(label="Tokens per step", elem_id="per-step-plot")})
        with gr.Tab("Threshold explorer"):
            explorer = _explorer_tab(ctx.config)
        with gr.Tab("Tree size for this machine", elem_id="tree-size-tab"):
            _tree_size_tab(ctx)
        with gr.Tab("Traces"):
            traces_tab = _traces_tab(demos)
    views.update(explorer.pop("views"))
    views.update(traces_tab.pop("views"))
    views.update(methods_tab.pop("views"))
    return dict(explorer, **traces_tab, **methods_tab, views=views)


def page_header(ctx: AppContext) -> str:
    """The header's Markdown (``explain.header_markdown``) from this server's engine and tree."""
    if ctx.engine is None:
        return header_markdown(None, None, False)
    tree = ctx.tree_defaults
    model = {**handlers._model_info(ctx), "forward": describe_forward(getattr(ctx.engine, "decoder", None))}
    return header_markdown(model,
                           {"total_tokens": tree.total_tokens, "depth": tree.depth, "top_k": tree.top_k,
                            "lookup": tree.lookup},
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
