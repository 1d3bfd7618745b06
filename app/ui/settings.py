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

If the draft head is missing the app still starts: vanilla decoding and trace replay work,
and the page says why EAGLE methods are off. It never falls back to a random head.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from app.engine.config import GenerationLimits


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
    update_interval_s: float = 0.25    # at most ~4 page updates a second while decoding
    trace_max_bytes: int = 4_000_000
    session_ttl_s: int = 1800          # a visitor's state is dropped after 30 idle minutes

    @classmethod
    def from_env(cls) -> "ServerConfig":
        return cls(base_model=os.environ.get("EAGLE_LENS_BASE_MODEL") or None,
                   draft_model=os.environ.get("EAGLE_LENS_DRAFT_MODEL") or None,
                   device=os.environ.get("EAGLE_LENS_DEVICE", "auto"),
                   dtype=os.environ.get("EAGLE_LENS_DTYPE", "auto"),
                   max_new_tokens=_env_int("EAGLE_LENS_MAX_NEW_TOKENS", 256),
                   max_prompt_chars=_env_int("EAGLE_LENS_MAX_PROMPT", 2000),
                   queue_size=_env_int("EAGLE_LENS_QUEUE", 32))

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
    # Held by whoever is running the model. The Gradio queue already runs one engine event at
    # a time; the lock also covers the moment after a Stop, when the stopped run is finishing
    # its last step while the next event starts.
    engine_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def has_head(self) -> bool:
        return self.engine is not None and getattr(self.engine, "head", None) is not None


def load_context(config: ServerConfig | None = None) -> AppContext:
    """Load the target and, if it exists, the draft head named by the server config."""
    from app.engine.engine import Engine
    from app.engine.loading import load_draft_head, load_draft_vocab, load_target

    config = config or ServerConfig.from_env()
    target = load_target(config.base_model, device=config.device, dtype=config.dtype)
    head, missing = None, ""
    try:
        head = load_draft_head(config.draft_model, target)
    except FileNotFoundError as exc:
        missing = f"No draft head loaded ({exc}). Vanilla decoding and recorded traces still work."
    head_name = config.draft_model or "shipped head models/eagle-smollm2-135m-instruct"
    note = (f"target **{target.name}** on {target.device.type} ({str(target.dtype).replace('torch.', '')}); "
            + (f"draft head: {head_name}" if head is not None else "no draft head"))
    # the head's reduced draft vocabulary, when it ships one (drafting only; output is unchanged)
    vocab = load_draft_vocab(head.folder, target.model.config.vocab_size) if head is not None else None
    return AppContext(Engine(target, head, limits=config.limits, draft_vocab=vocab), config, note, missing)


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
