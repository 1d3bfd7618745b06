"""What happens when a visitor clicks: plain Python generators, no Gradio.

Each handler takes the app context (engine + server config), the visitor's ``Session`` and
raw widget values, and yields *views*: dicts from a view name ("stream", "tree", "speedup",
...) to a plain value (HTML string, plotly figure, Markdown, ``(maximum, value)`` for the
slider, a file path). ``blocks`` maps names to components; tests call handlers directly.
Bad input raises ``ValueError`` with a message for the page.

One module per feature, all sharing the visitor's ``Session``:

==============  =================================================================================
``run``         Generate, the race against vanilla, step mode (Step) and Stop
``views``       what a run looks like on the page: one step, a streaming run, a finished run
``speedup``     the race's result: the speedup, its factors, the lossless check
``replay``      the step slider, autoplay, trace files (download and upload), ``show_trace``
``demos``       the shipped demos
``explorer``    the threshold explorer (one knob swept, with a verdict against the noise)
``ab``          A/B: a pinned run against the run on screen
``common``      shared by them: ``parse`` (the request check), ``judge``, the model line, threads
==============  =================================================================================

Every name stays importable from ``app.ui.handlers``.
"""
from __future__ import annotations

from app.ui import traces  # noqa: F401
from app.ui.handlers.ab import compare_view, pin, run_label  # noqa: F401
from app.ui.handlers.common import (RACE_CHUNK_TOKENS, _check_flag, _check_step_mode, _load_average,  # noqa: F401
                                    _model_info, judge, parse, use_request_threads)
from app.ui.handlers.demos import load_demo  # noqa: F401
from app.ui.handlers.explorer import (EXPLORE_REPEATS, SWEEP_FIELDS, ExploreView, Sweep, _explore,  # noqa: F401
                                      _finite, _run_to_summary, _sweep_results, check_explore, explore,
                                      sweep_values, verdict)
from app.ui.handlers.replay import (TRACE_DIR, TRACE_MAX_AGE_S, _live_model, instructive_step,  # noqa: F401
                                    load_trace_file, play_step, prune_traces, read_trace_file, recorded_where,
                                    replay_view, show_trace, write_trace)
from app.ui.handlers.run import (STOP_WAIT_S, _done_status, _finish, _raced, _run_vanilla, _step,  # noqa: F401
                                 check_generate, check_step, generate, paused_run_bytes, request_problems, step, stop,
                                 tree_plan)
from app.ui.handlers.speedup import (_identical_note, _measure_parting, session_race,  # noqa: F401
                                     speedup_decomposition, speedup_headline, speedup_text)
from app.ui.handlers.views import (TREE_PX, RunView, _rate, _switch_reasons, final_view, live_view,  # noqa: F401
                                   run_status, step_view)

# names the module imported before it was split, still importable from here
from app.engine.config import TreeConfig  # noqa: F401,E402
from app.engine.spec import SETTING, shown  # noqa: F401,E402
from app.engine.events import StepEvent, decoding_steps  # noqa: F401,E402
from app.engine.threads import engine_probe  # noqa: F401,E402
from app.ui.limits import kv_bytes, upload_folder  # noqa: F401,E402
from app.ui.pump import BackgroundRun  # noqa: F401,E402
from app.ui.race import VANILLA, interleave  # noqa: F401,E402
from app.ui.requests import SETTING_NAMES, SWEEP_KNOBS, Request, build_request, setting_of  # noqa: F401,E402
from app.ui.session import PinnedRun, Session, VanillaRun  # noqa: F401,E402
from app.ui.settings import AppContext  # noqa: F401,E402
from app.viz.compare import ab_caption, ab_figure, ab_trees_figure  # noqa: F401,E402
from app.viz.glossary import term  # noqa: F401,E402
from app.viz.insights import (calibration_figure, depth_figure, explorer_figure,  # noqa: F401,E402
                              tokens_per_step_figure)
from app.viz.phases import decoding_total, phase_account, step_number, tree_shape  # noqa: F401,E402
from app.viz.race import RaceSpeedup, race_figure, race_speedup  # noqa: F401,E402
from app.viz.safe import md_code  # noqa: F401,E402
from app.viz.stream import stream_html  # noqa: F401,E402
from app.viz.tree import tree_figure  # noqa: F401,E402
from app.viz.verify_view import kv_caption, kv_figure, mask_caption, mask_figure  # noqa: F401,E402
