"""Server-side configuration of the app: which models, which caps, how big a queue.

Everything here comes from environment variables (or the defaults), never from the page, so
a visitor cannot make the server load a model or raise a cap:

    EAGLE_LENS_BASE_MODEL      target: hub id or folder (default: the embedded SmolLM2-135M-Instruct)
    EAGLE_LENS_DRAFT_MODEL     EAGLE head: hub id or folder (default: the shipped head)
    EAGLE_LENS_DEVICE          auto | cpu | cuda[:N]
    EAGLE_LENS_DTYPE           auto | float32 | bfloat16 | float16
    EAGLE_LENS_MAX_NEW_TOKENS  cap on max_new_tokens (default 256)
    EAGLE_LENS_MAX_PROMPT      cap on prompt characters (default 2000)
    EAGLE_LENS_QUEUE           queued requests at most (default 32)
    EAGLE_LENS_UPDATE_S        seconds between page updates while decoding (default: auto,
                               see ``AppContext.update_interval``)
    EAGLE_LENS_AUTO_TREE       1 (default): size the default EAGLE-2 tree for this machine at
                               start-up (app.engine.autotune; measured once, then cached); 0: the
                               engine's fixed defaults
    EAGLE_LENS_TRUSTED_PROXIES whose X-Forwarded-For names the client: "0" nobody's (the
                               default), "N" the last N proxy hops, or "10.0.0.1, 10.1.0.0/16"
                               those peers; on a Hugging Face Space (SPACE_ID set) the default is 1

If the draft head is missing the app still starts: vanilla decoding and trace replay work,
and the page says why EAGLE methods are off. It never falls back to a random head.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.engine.adapt import auto_lookup
from app.engine.autotune import choose_tree
from app.engine.config import GenerationLimits, TreeConfig
from app.engine.drafters.registry import DEFAULT_HEAD_KIND
from app.engine.factory import load_engine
from app.engine.head_choice import choose_head, shipped_engines
from app.engine.sources import DEFAULTS
from app.engine.threads import ThreadGovernor
from app.ui.engine_thread import EngineThread
from app.ui.limits import PausedRuns, PublicLimits, trusted_proxies
from app.viz.safe import md_code


def _trusted_proxies_env() -> str:
    """EAGLE_LENS_TRUSTED_PROXIES, checked now (a typo fails at start, not per request); on a
    Space, where every request passes the platform's proxy, 1 hop unless set."""
    spec = os.environ.get("EAGLE_LENS_TRUSTED_PROXIES") or ("1" if os.environ.get("SPACE_ID") else "")
    trusted_proxies(spec)
    return spec


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from exc
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def _env_seconds(name: str) -> float | None:
    raw = os.environ.get(name, "").strip()
    if raw in ("", "auto"):
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number of seconds or 'auto', got {raw!r}") from exc
    if not 0.0 <= value <= 10.0:
        raise ValueError(f"{name} must be in [0, 10] seconds, got {value}")
    return value


def _env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 1 or 0, got {raw!r}")


@dataclass(frozen=True)
class ServerConfig:
    base_model: str | None = None
    draft_model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_new_tokens: int = 256
    max_prompt_chars: int = 2000
    queue_size: int = 32
    explore_max_new_tokens: int = 48   # each explorer run is capped shorter than a normal run
    explore_max_values: int = 6
    update_interval_s: float | None = None   # seconds between page updates; None = auto (see AppContext)
    trace_max_bytes: int = 4_000_000
    session_ttl_s: int = 1800          # a visitor's state is dropped after 30 idle minutes
    auto_tree: bool = True             # default tree knobs from app.engine.autotune
    public_limits: PublicLimits = field(default_factory=PublicLimits)   # per-visitor bounds (app/ui/limits/)

    @classmethod
    def from_env(cls) -> "ServerConfig":
        return cls(base_model=os.environ.get("EAGLE_LENS_BASE_MODEL") or None,
                   draft_model=os.environ.get("EAGLE_LENS_DRAFT_MODEL") or None,
                   device=os.environ.get("EAGLE_LENS_DEVICE", "auto"),
                   dtype=os.environ.get("EAGLE_LENS_DTYPE", "auto"),
                   max_new_tokens=_env_int("EAGLE_LENS_MAX_NEW_TOKENS", 256),
                   max_prompt_chars=_env_int("EAGLE_LENS_MAX_PROMPT", 2000),
                   queue_size=_env_int("EAGLE_LENS_QUEUE", 32),
                   auto_tree=_env_flag("EAGLE_LENS_AUTO_TREE", True),
                   update_interval_s=_env_seconds("EAGLE_LENS_UPDATE_S"),
                   public_limits=PublicLimits(trusted_proxies=_trusted_proxies_env()))

    @property
    def limits(self) -> GenerationLimits:
        return GenerationLimits(max_new_tokens=self.max_new_tokens, max_prompt_chars=self.max_prompt_chars)


@dataclass
class AppContext:
    """What every handler may use: the engine (shared, read-only between requests), the server
    config, and a line describing the models for the page."""

    engine: object | None                   # app.engine.engine.Engine; None = replay-only
    config: ServerConfig = field(default_factory=ServerConfig)
    model_note: str = ""
    head_missing: str = ""                   # why EAGLE methods are off ("" = they are on)
    tree_defaults: TreeConfig = field(default_factory=TreeConfig)   # the page's initial tree knobs
    tree_choice: dict | None = None          # autotune's report behind them (TreeChoice.to_dict()), if it ran
    # Every torch computation of the server runs here, one job at a time (see engine_thread.py:
    # one OpenMP team instead of one per thread, and the visitors' runs serialised on the shared
    # model, including the moment after a Stop when the stopped run finishes its last step).
    engine_thread: EngineThread = field(default_factory=EngineThread, repr=False)
    # How many threads the next run uses, timed just before it (app/engine/threads.py); the
    # probe forward is built on the engine thread at the first run.
    threads: ThreadGovernor = field(default_factory=ThreadGovernor, repr=False)
    thread_probe: object | None = field(default=None, repr=False)
    paused: PausedRuns | None = field(default=None, repr=False)   # every paused step-mode run (limits/paused.py)
    # The other shipped heads for the same target, by name (e.g. "eagle3"), each in an engine of
    # its own that shares the target: the comparison can draft with them (never a path from the page).
    heads: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.paused is None:
            self.paused = PausedRuns(self.config.public_limits)

    @property
    def update_interval(self) -> float:
        """Seconds between page updates while decoding: the server's setting, else automatic.

        Every update wakes the handler, Gradio's event loop and the browser. On a small CPU
        that is not free: the engine's OpenMP threads occupy every core and stall whenever one
        is taken away, so each update costs the engine far more than its own few ms of Python.
        Measured on the 2-core dev machine (scripts/loadtest.py speed, embedded model):
        4 updates/s -> 67-80% of the engine's own tokens/s, 1/s -> 84-86% (earlier prompt).
        With its default prompt at 256 tokens, 1/s gave 70% while the server busy-polled
        (blocks.calm_queue_polling, pump.BackgroundRun.batches) and 81% once it stopped;
        with every torch op on one engine thread (engine_thread.py), 93-96% at 1/s.
        So: 4 updates/s on a GPU or a CPU with >= 8 cores, down to 1/s on 2 cores.
        """
        if self.config.update_interval_s is not None:
            return self.config.update_interval_s
        device = getattr(getattr(self.engine, "target", None), "device", None)
        if device is not None and device.type != "cpu":
            return 0.25
        return min(1.0, max(0.25, 2.0 / (os.cpu_count() or 1)))

    @property
    def has_head(self) -> bool:
        return self.engine is not None and getattr(self.engine, "head", None) is not None


def load_context(config: ServerConfig | None = None, log=print) -> AppContext:
    """Load the target and, if it exists, the draft head named by the server config; with
    ``config.auto_tree``, size the default tree for this machine (see ``auto_tree_defaults``)."""
    config = config or ServerConfig.from_env()
    engine_thread = EngineThread()
    # Load (and autotune) on the engine thread, the thread that will also run every generation.
    return engine_thread.call(_load_context, config, engine_thread, log)


def _load_context(config: ServerConfig, engine_thread: EngineThread, log) -> AppContext:
    engine, missing = load_engine(config.base_model, config.draft_model, config.device, config.dtype,
                                  head="optional", limits=config.limits, medusa="optional")
    target, head = engine.target, engine.head
    if missing:
        missing = f"No draft head loaded ({missing}). Vanilla decoding and recorded traces still work."
    heads = other_shipped_heads(engine, config) if head is not None else {}
    if heads and config.auto_tree and config.draft_model in DEFAULTS:
        engine, heads = _faster_head(engine, heads, log)       # the shipped head predicted faster here
        head = engine.head
    head_name = config.draft_model or f"shipped head models/{Path(head.folder).name if head is not None else ''}"
    note = (f"target {md_code(target.name)} on {target.device.type} ({str(target.dtype).replace('torch.', '')}); "
            + (f"draft head: {md_code(head_name)}" if head is not None else "no draft head"))
    if heads:
        note += f"; also for the comparison: {', '.join(md_code(n) for n in heads)}"
    tree, choice = TreeConfig(), None
    if head is not None and config.auto_tree:
        tree, tree_note, choice = auto_tree_defaults(engine, log)
        note += f". {tree_note}"
    if head is not None:
        # beside the head's tree, a prompt-lookup branch, as the CLI's auto tree has: on the
        # six suites it took the sized tree from 1.23x to 1.39x our vanilla here
        # (benchmarks/fast-forward/lookup-branch.md); the page's lookup knob turns it off
        tree = replace(tree, lookup=auto_lookup(engine))
    return AppContext(engine, config, note, missing, tree_defaults=tree, tree_choice=choice,
                      engine_thread=engine_thread, heads=heads)


def _faster_head(engine, heads: dict, log) -> tuple:
    """(engine, other heads) with the shipped head this machine's kept profile predicts faster
    as the server's own (``head_choice``); the Medusa heads stay with the server's engine."""
    choice = choose_head({DEFAULT_HEAD_KIND: engine, **heads})
    log(f"[eagle-lens] {choice.text()}")
    if choice.name == DEFAULT_HEAD_KIND:
        return engine, heads
    chosen = heads[choice.name]
    chosen.medusa = engine.medusa
    return chosen, {DEFAULT_HEAD_KIND: engine, **{n: e for n, e in heads.items() if n != choice.name}}


def other_shipped_heads(engine, config: ServerConfig) -> dict:
    """{name: Engine} for every head shipped under models/ (``loading.SHIPPED_HEADS``) other than
    the one ``engine`` drafts with, when the target is the embedded model they were trained for."""
    return shipped_engines(engine, config.base_model,
                           lambda folder: load_engine(draft_model=str(folder), target=engine.target,
                                                      limits=config.limits)[0])


def auto_tree_defaults(engine, log=print) -> tuple[TreeConfig, str, dict]:
    """The default EAGLE-2 tree for this machine, a line for the page saying why, and the
    full report (``TreeChoice.to_dict()``: cost curve, candidates) for the page's tab.

    A CPU verifies big trees slowly (a forward over 64 tokens costs ~3.5x one over 1 token
    here), a GPU almost for free, so the best depth / total_tokens depend on the machine and
    the head: ``autotune.choose_tree`` measures both (once; cached on disk) and picks the tree
    with the highest predicted tokens/s. The page's sliders start there; visitors may move them.
    """
    tree, choice = choose_tree(engine, progress=lambda message: log(f"[eagle-lens] {message}"))
    log(f"[eagle-lens] {choice.summary()}")
    note = (f"Default tree sized for this machine: depth {tree.depth}, top_k {tree.top_k}, "
            f"total_tokens {tree.total_tokens} (predicted {choice.predicted_speedup:.2f}x vanilla; "
            "why: the tab *Tree size for this machine*)")
    if not choice.beats_vanilla:
        note += " — with this head no tree is predicted to beat plain decoding here"
    return tree, note, choice.to_dict()


def gpu(fn):
    """``spaces.GPU`` on a ZeroGPU Space (a GPU is attached only while ``fn`` runs), a no-op
    everywhere else. The ``spaces`` package is optional: only Spaces install it."""
    if not os.environ.get("SPACES_ZERO_GPU"):
        return fn
    try:
        import spaces
    except ImportError:
        return fn
    return spaces.GPU(duration=120)(fn)
