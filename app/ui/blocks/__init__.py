"""The Gradio page: components, their wiring, and the queue.

Handlers (``app.ui.handlers``) yield views — dicts keyed by view name. Here each view name is
bound to one component, and a thin wrapper per event turns a view into the tuple of outputs
Gradio expects (``gr.skip()`` for anything the view leaves alone) and a ``ValueError`` into a
``gr.Error`` message on the page. Before an engine event starts, its validator checks the
request once and shows a bad setting's message under its control, so a refused run leaves
the page as it was; the event runs what the validator accepted. Nothing here decodes or draws.

The page is built in two parts: ``build_layout`` makes the components (each setting's
control from its specification, ``app.engine.spec.SETTINGS``) and ``wire`` attaches the
events. The engine events' signatures, which Gradio turns into the public API, come from the
same specification (``event_signature``).

Where each part lives (every name stays importable from ``app.ui.blocks``):

=====================  ==========================================================================
``api``                the views' output order, view-to-output wrappers, event signatures and
                       validators, shared by every event
``layout``             ``Components`` and ``build_layout``: every component, no events
``run``                Generate, Step and Stop (the engine's worker)
``explorer``           the threshold explorer's event
``compare_methods``    the method comparison's event
``knobs``              the settings' controls reacting to each other (no queue)
``replay``             the slider, trace upload, the demos, the first demo on load, autoplay
``compare``            A/B: pin a run
this module            ``wire``, ``build_demo``, ``launch_kwargs`` and the queue's polling
=====================  ==========================================================================

Reliability (one model, many visitors): every event that runs the engine shares one worker
(``concurrency_id="engine"``, limit 1), the queue is bounded, each visitor's data lives in
their own ``gr.State``, and Stop asks the visitor's running event to end at its next update
(the engine's iterator is closed: generation ends after the current step) and a queued one
not to start.
"""
from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from app.ui import handlers, limits
from app.ui.blocks.api import (ACCORDIONS, COMPARE_VIEWS, ENGINE, EXPLORE_VIEWS, FOLDED, METHODS_VIEWS,  # noqa: F401
                               PLAY_VIEWS, REPLAY_VIEWS, RUN_VIEWS, _once, _outputs, _plain, _stream, _to_output,
                               _with_signature, event_signature, page_defaults, page_errors, precheck,
                               settings_validator)
from app.ui.blocks.compare import wire_compare
from app.ui.blocks.compare_methods import wire_methods  # noqa: F401
from app.ui.blocks.explorer import make_explore, wire_explore  # noqa: F401
from app.ui.blocks.knobs import applicability, sampling_applicability, wire_knobs  # noqa: F401
from app.ui.blocks.layout import (EXAMPLES_ENTRY, PLAY_SPEEDS, SAMPLING_ONLY, TREE_SIZE_NOT_MEASURED,  # noqa: F401
                                  Components, _compare_tab, _explorer_tab, _methods_tab, _prompt_row,
                                  _settings_panel, _stage, _tabs, _traces_tab, _tree_size_tab, build_layout,
                                  control_value, page_header, sampling_note, setting_control)
from app.ui.blocks.replay import TREE_SETTINGS, restore_outputs, wire_autoplay, wire_replay_and_traces  # noqa: F401
from app.ui.blocks.run import make_generate, wire_engine, wire_stop
from app.ui.explain import TOUR_STEPS
from app.ui.settings import AppContext, ServerConfig

# names the module imported before it was split, still importable from here
import contextlib  # noqa: F401,E402
import inspect  # noqa: F401,E402
from dataclasses import dataclass  # noqa: F401,E402

from app.engine.config import TreeConfig  # noqa: F401,E402
from app.engine.spec import SETTING, SETTINGS, Setting  # noqa: F401,E402
from app.ui import methods, traces  # noqa: F401,E402
from app.ui.explain import EXAMPLES, HOW_IT_WORKS, HOW_IT_WORKS_VIEWS, WHAT_IS_THIS, header_markdown  # noqa: F401,E402
from app.ui.requests import (AUTO_PRESET, CUSTOM_PRESET, METHOD_KNOBS, SETTING_NAMES, SWEEP_KNOBS,  # noqa: F401,E402
                              TREE_KNOBS, TREE_PRESETS, Checked, preset_of, tree_preset)
from app.ui.session import Session, close_session  # noqa: F401,E402
from app.ui.settings import gpu  # noqa: F401,E402
from app.viz.autotune import choice_figure, choice_markdown  # noqa: F401,E402
from app.viz.safe import page_message  # noqa: F401,E402
from app.viz.style import legend_html  # noqa: F401,E402
from app.viz.verify_view import tree_caption  # noqa: F401,E402

REPO_ROOT = Path(__file__).resolve().parents[3]
CSS_PATH = REPO_ROOT / "static" / "app.css"
JS_PATH = REPO_ROOT / "static" / "app.js"
TRACES_DIR = REPO_ROOT / "traces"


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


def wire(demo: gr.Blocks, c: Components, ctx: AppContext, demos: dict[str, str]) -> None:
    """Every event of the page, inside ``demo``'s context."""
    wire_engine(c, ctx)
    wire_stop(c)
    wire_knobs(c, ctx.tree_defaults)
    wire_replay_and_traces(demo, c, ctx, demos)
    wire_autoplay(c)
    wire_compare(c)


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
