"""The Gradio page: components, their wiring, and the queue.

Handlers (``handlers.py``) yield views — dicts keyed by view name. Here each view name is
bound to one component, and a thin wrapper per event turns a view into the tuple of outputs
Gradio expects (``gr.skip()`` for anything the view leaves alone) and a ``ValueError`` into a
``gr.Error`` message on the page. Before an engine event starts, its validator checks the
request's settings and shows a bad one's message under its control, so a refused run leaves
the page as it was. Nothing here decodes or draws.

Reliability (one model, many visitors): every event that runs the engine shares one worker
(``concurrency_id="engine"``, limit 1), the queue is bounded, each visitor's data lives in
their own ``gr.State``, and Stop cancels the running event (its generator is closed, which
closes the engine's iterator: generation ends after the current step).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import gradio as gr

from app.engine.config import MAX_DEPTH, MAX_TOP_K
from app.ui import handlers, limits
from app.ui.explain import EXAMPLES, HOW_IT_WORKS
from app.ui.requests import (AUTO_PRESET, CUSTOM_PRESET, DEFAULTS, SETTINGS, SWEEP_KNOBS, TREE_KNOBS, TREE_PRESETS,
                              UI_METHODS, preset_of, tree_preset)
from app.ui.session import Session, close_session
from app.ui.settings import AppContext, ServerConfig, gpu
from app.viz.autotune import choice_figure, choice_markdown
from app.viz.safe import page_message
from app.viz.style import legend_html

REPO_ROOT = Path(__file__).resolve().parents[2]
CSS_PATH = REPO_ROOT / "static" / "app.css"
TRACES_DIR = REPO_ROOT / "traces"
ENGINE = "engine"   # the concurrency id shared by every event that runs the model

# View name -> the order of outputs of the main events.
RUN_VIEWS = ("status", "stream", "tree", "speedup", "race", "slider", "phases",
             "depth", "calibration", "per_step", "trace_file")
REPLAY_VIEWS = ("stream", "tree", "phases")
EXPLORE_VIEWS = ("explorer_plot", "explorer_status")


def demo_traces(folder: Path = TRACES_DIR) -> dict[str, str]:
    """{name: path} of the shipped traces: the server's own list, chosen from by name only."""
    return {p.stem: str(p) for p in sorted(folder.glob("*.json"))}


def launch_kwargs(config: ServerConfig) -> dict:
    """Arguments for ``demo.launch`` (css lives here in Gradio 6). Never ``share=True``."""
    return dict(css_paths=[str(CSS_PATH)], max_file_size=config.trace_max_bytes, show_error=False,
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

# Settings whose controls live in the accordions, which may be closed when a run is refused.
FOLDED = {**{k: "Tree knobs" for k in TREE_KNOBS}, **{k: "Sampling" for k in ("temperature", "top_p", "seed")}}


def build_demo(ctx: AppContext, demos: dict[str, str] | None = None) -> gr.Blocks:
    """The whole page for one server context. Tests pass a tiny-model context."""
    cfg = ctx.config
    demos = demo_traces() if demos is None else demos
    tree0 = ctx.tree_defaults   # autotune's choice for this machine, or the engine's defaults

    # --- event functions: named parameters are the public API (gradio_client) ------------------

    @gpu
    def generate(prompt: str, method: str = DEFAULTS["method"], max_new_tokens: int = DEFAULTS["max_new_tokens"],
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, depth: int = tree0.depth,
                 top_k: int = tree0.top_k, total_tokens: int = tree0.total_tokens, tau_high: float = tree0.tau_high,
                 tau_low: float = tree0.tau_low, min_confidence: float = tree0.min_confidence,
                 step_mode: bool = False, session: Session | None = None):
        """Decode the prompt with the chosen method, streaming tokens and trees, then race vanilla."""
        session = session if isinstance(session, Session) else Session()
        raw = dict(prompt=prompt, method=method, max_new_tokens=max_new_tokens, temperature=temperature,
                   top_p=top_p, seed=seed, depth=depth, top_k=top_k, total_tokens=total_tokens,
                   tau_high=tau_high, tau_low=tau_low, min_confidence=min_confidence)
        yield from _stream(handlers.generate(ctx, session, step_mode=step_mode, **raw), RUN_VIEWS)

    @gpu
    def next_step(session: Session):
        yield from _stream(handlers.step(ctx, session), RUN_VIEWS)

    @gpu
    def explore(knob: str, start: float, stop: float, count: int, prompt: str, method: str,
                max_new_tokens: int, temperature: float, top_p: float, seed: int, depth: int, top_k: int,
                total_tokens: int, tau_high: float, tau_low: float, min_confidence: float, session: Session):
        raw = dict(prompt=prompt, method=method, max_new_tokens=max_new_tokens, temperature=temperature,
                   top_p=top_p, seed=seed, depth=depth, top_k=top_k, total_tokens=total_tokens,
                   tau_high=tau_high, tau_low=tau_low, min_confidence=min_confidence)
        yield from _stream(handlers.explore(ctx, session, knob, start, stop, count, **raw), EXPLORE_VIEWS)

    def stop(session: Session):
        return _once(lambda: handlers.stop(session), RUN_VIEWS)

    def replay(session: Session, index: float):
        return _once(lambda: handlers.replay_view(session, index), REPLAY_VIEWS)

    def load_trace(session: Session, path):
        return _once(lambda: handlers.load_trace_file(ctx, session, path), RUN_VIEWS)

    def load_demo(session: Session, name: str):
        return _once(lambda: handlers.load_demo(ctx, session, demos, name), RUN_VIEWS)

    def choose_preset(name: str):
        """(depth, top_k, total_tokens) of a named tree (requests.TREE_PRESETS) for the sliders;
        the custom entry leaves them as they are."""
        with page_errors():
            shape = tree_preset(name, tree0)
        return (gr.skip(),) * 3 if shape is None else shape

    def name_preset(depth: float, top_k: float, total_tokens: float) -> str:
        """The preset menu's entry after the user moved a knob: the preset it now matches, or custom."""
        return preset_of(depth, top_k, total_tokens, tree0)

    def settings_validator(before: int):
        """Gradio's event validator for an engine event whose request settings (``SETTINGS``)
        start at input ``before``: a bad setting is shown under its own control and the event
        never starts, so the page keeps the run it shows. (Raising ``gr.Error`` from the event
        instead marks every output of the run as failed and blanks its plots.) Values pass
        unchanged when only the event can judge them (``request_problems``)."""

        def validate(*values):
            raw = dict(zip(SETTINGS, values[before:before + len(SETTINGS)]))
            try:
                problems = handlers.request_problems(ctx, raw)
            except Exception:  # noqa: BLE001 — never fail here: the event's own checks answer then
                problems = {}
            for name, message in list(problems.items()):
                if name in FOLDED:   # its control may sit in a closed accordion: say it by the prompt too
                    problems["prompt"] = f"{FOLDED[name]}: {message}"
            names = [None] * before + list(SETTINGS) + [None] * (len(values) - before - len(SETTINGS))
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

    def first_demo(session: Session):
        """On page load: show the first shipped trace, so a visitor sees a demo at once."""
        if not demos:
            return _outputs({}, RUN_VIEWS)
        return load_demo(session, next(iter(demos)))

    # --- layout --------------------------------------------------------------------------------

    default_method = DEFAULTS["method"] if ctx.has_head else "vanilla"
    with gr.Blocks(title="EAGLE Lens", delete_cache=(3600, 3600)) as demo:
        session = gr.State(Session(), time_to_live=cfg.session_ttl_s, delete_callback=close_session)
        gr.Markdown("# EAGLE Lens — watch speculative decoding think\n" + ctx.model_note)
        if ctx.head_missing:
            gr.Markdown(f"⚠️ {ctx.head_missing}", elem_id="head-warning")
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt", max_length=cfg.max_prompt_chars,
                                    placeholder="Ask something, or pick an example below")
                gr.Examples([[p] for _, p in EXAMPLES], inputs=[prompt],
                            example_labels=[f"{cat}: {p[:48]}…" for cat, p in EXAMPLES], label="Examples")
                with gr.Row():
                    generate_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                    step_btn = gr.Button("Step ▶", elem_id="step-btn")
                step_mode = gr.Checkbox(False, label="Step mode (classroom): pause after every step; "
                                        "press Step to advance", elem_id="step-mode")
            with gr.Column(scale=2):
                method = gr.Radio(list(UI_METHODS), value=default_method, label="Method", elem_id="method")
                max_new_tokens = gr.Slider(1, cfg.max_new_tokens, value=min(DEFAULTS["max_new_tokens"], cfg.max_new_tokens),
                                           step=1, label="max new tokens", elem_id="max-new-tokens")
                with gr.Accordion("Tree knobs", open=False):
                    preset = gr.Dropdown(list(TREE_PRESETS) + [CUSTOM_PRESET], value=AUTO_PRESET, label="preset (total / depth / top_k)",
                                         info="the fastest tree depends on the hardware: compare them in the race",
                                         elem_id="tree-preset")
                    depth = gr.Slider(1, MAX_DEPTH, value=tree0.depth, step=1, label="depth (draft levels)", elem_id="depth")
                    top_k = gr.Slider(1, MAX_TOP_K, value=tree0.top_k, step=1, label="top_k (branching)", elem_id="top-k")
                    total_tokens = gr.Slider(1, 128, value=tree0.total_tokens, step=1,
                                             label="total_tokens (nodes verified)", elem_id="total-tokens")
                    tau_high = gr.Slider(0, 1, value=tree0.tau_high, step=0.01, label="tau_high (threshold: 2 children)", elem_id="tau-high")
                    tau_low = gr.Slider(0, 1, value=tree0.tau_low, step=0.01, label="tau_low (threshold: 1 child)", elem_id="tau-low")
                    min_confidence = gr.Slider(0, 1, value=tree0.min_confidence, step=0.01,
                                               label="min_confidence (drop nodes below)", elem_id="min-confidence")
                with gr.Accordion("Sampling", open=False):
                    temperature = gr.Slider(0, 2, value=0.0, step=0.05, label="temperature (0 = greedy)", elem_id="temperature")
                    top_p = gr.Slider(0.01, 1, value=1.0, step=0.01, label="top_p", elem_id="top-p")
                    seed = gr.Number(0, precision=0, minimum=0, label="seed", elem_id="seed")
        status = gr.Markdown("", elem_id="status")
        with gr.Row():
            with gr.Column(scale=1):
                stream = gr.HTML(handlers.stream_html([]), label="Token stream", elem_id="token-stream")
                gr.HTML(legend_html())
            with gr.Column(scale=1):
                tree_plot = gr.Plot(label="Draft tree of the current step", elem_id="tree-plot")
        with gr.Row():
            with gr.Column(scale=1):
                speedup = gr.Markdown("", elem_id="speedup")
            with gr.Column(scale=1):
                race = gr.Plot(label="Speed race", elem_id="race-plot")
        with gr.Group():
            slider = gr.Slider(0, 1, value=0, step=1, label="Step replay: drag through the steps",
                               elem_id="step-slider")
            phases = gr.Markdown(handlers.phase_account(None), elem_id="phases")
        with gr.Tabs():
            with gr.Tab("Insights"):
                with gr.Row():
                    depth_plot = gr.Plot(label="Acceptance by depth", elem_id="depth-plot")
                    calibration_plot = gr.Plot(label="Calibration", elem_id="calibration-plot")
                    per_step_plot = gr.Plot(label="Tokens per step", elem_id="per-step-plot")
            with gr.Tab("Threshold explorer"):
                gr.Markdown("Run the prompt once per value of one knob, a tree knob or the temperature "
                            f"(other settings as above, at most {cfg.explore_max_new_tokens} tokens per run) "
                            "and compare.")
                with gr.Row():
                    knob = gr.Dropdown(list(SWEEP_KNOBS), value="total_tokens", label="knob", elem_id="explore-knob")
                    start = gr.Number(8, label="from", elem_id="explore-start")
                    stop_value = gr.Number(48, label="to", elem_id="explore-stop")
                    count = gr.Slider(2, cfg.explore_max_values, value=4, step=1, label="values", elem_id="explore-count")
                explore_btn = gr.Button("Run sweep", elem_id="explore-btn")
                explorer_status = gr.Markdown("", elem_id="explore-status")
                explorer_plot = gr.Plot(label="Sweep", elem_id="explore-plot")
            with gr.Tab("Tree size for this machine", elem_id="tree-size-tab"):
                if ctx.tree_choice is not None:
                    gr.Markdown(choice_markdown(ctx.tree_choice), elem_id="tree-size-text")
                    gr.Plot(choice_figure(ctx.tree_choice), label="Cost curve and predicted speed",
                            elem_id="tree-size-plot")
                else:
                    gr.Markdown(TREE_SIZE_NOT_MEASURED, elem_id="tree-size-text")
            with gr.Tab("Traces"):
                gr.Markdown("Download this run as JSON (settings + every step record), or load one — "
                            "replay needs no model at all.")
                download = gr.DownloadButton("Download trace (.json)", interactive=False, elem_id="trace-download")
                upload = gr.File(label="Load a trace (.json)", file_types=[".json"], type="filepath", elem_id="trace-upload")
                with gr.Row():
                    demo_choice = gr.Dropdown(list(demos), value=next(iter(demos), None), label="Recorded demos",
                                              elem_id="demo-choice")
                    demo_btn = gr.Button("Show demo", elem_id="demo-btn")
            with gr.Tab("How EAGLE-2 works"):
                gr.Markdown(HOW_IT_WORKS)
                gr.HTML(legend_html())

        # --- wiring ----------------------------------------------------------------------------
        run_outputs = [status, stream, tree_plot, speedup, race, slider, phases, depth_plot,
                       calibration_plot, per_step_plot, download]
        controls = dict(prompt=prompt, method=method, max_new_tokens=max_new_tokens, temperature=temperature,
                        top_p=top_p, seed=seed, depth=depth, top_k=top_k, total_tokens=total_tokens,
                        tau_high=tau_high, tau_low=tau_low, min_confidence=min_confidence)
        settings = [controls[name] for name in SETTINGS]   # the order the events (and the validator) take
        # preprocess=False: the raw JSON values reach the handlers, whose own validation names
        # the parameter and its range in every message (the components' checks would not).
        engine_events = dict(concurrency_limit=1, concurrency_id=ENGINE, preprocess=False)
        gen_event = generate_btn.click(generate, settings + [step_mode, session], run_outputs,
                                       api_name="generate", validator=settings_validator(0), **engine_events)
        submit_event = prompt.submit(generate, settings + [step_mode, session], run_outputs,
                                     api_visibility="private", validator=settings_validator(0), **engine_events)
        step_event = step_btn.click(precheck(handlers.check_step), [session], None,
                                    api_visibility="private").success(
            next_step, [session], run_outputs, api_name="step", **engine_events)
        explore_event = explore_btn.click(explore, [knob, start, stop_value, count] + settings + [session],
                                          [explorer_plot, explorer_status], api_name="explore",
                                          validator=settings_validator(4), **engine_events)
        stop_btn.click(stop, [session], run_outputs, api_name="stop",
                       cancels=[gen_event, submit_event, step_event, explore_event])
        # a preset only moves the sliders: no engine work, so no queue
        preset.input(choose_preset, [preset], [depth, top_k, total_tokens], api_name="tree_preset",
                     queue=False, preprocess=False)
        for knob_slider in (depth, top_k, total_tokens):   # moved by hand: the menu follows
            knob_slider.input(name_preset, [depth, top_k, total_tokens], [preset], queue=False, preprocess=False,
                              api_visibility="private", show_progress="hidden", trigger_mode="always_last")
        slider.input(replay, [session, slider], [stream, tree_plot, phases], api_name="replay",
                     trigger_mode="always_last", preprocess=False)
        upload.upload(precheck(lambda path: handlers.read_trace_file(ctx, path)), [upload], None,
                      api_visibility="private").success(load_trace, [session, upload], run_outputs,
                                                        api_name="load_trace")
        demo_btn.click(load_demo, [session, demo_choice], run_outputs, api_name="load_demo", preprocess=False)
        demo.load(first_demo, [session], run_outputs, api_visibility="private")
    demo.queue(max_size=cfg.queue_size, default_concurrency_limit=4)
    limits.bound_queue_joins(demo._queue)   # the cap holds for joins that arrive together
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
