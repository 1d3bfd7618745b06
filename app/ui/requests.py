"""Turn raw values from the page or the API into validated engine settings.

Anyone can call the API with any JSON, bypassing the sliders, so nothing is trusted: every
value is type-checked here, then range-checked by the engine's own config classes (which
raise ``ValueError`` naming the parameter and its range, first word first). The page's event
validator shows each message under the control it names (``setting_of``); whatever reaches a
handler becomes a ``gr.Error`` message.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from app.engine.config import SamplingConfig, TreeConfig, check_max_new_tokens, check_prompt

# The knobs of one request, in the order the API takes them after the first four.
TREE_KNOBS = ("depth", "top_k", "total_tokens", "tau_high", "tau_low", "min_confidence")
INT_KNOBS = {"depth", "top_k", "total_tokens", "max_new_tokens", "seed"}
UI_METHODS = ("dynamic", "static", "chain", "threshold", "vanilla")

# What the explorer can sweep: every tree knob, and the sampling temperature (how acceptance
# falls as the target's and the draft's distributions flatten).
SWEEP_KNOBS = TREE_KNOBS + ("temperature",)
MAX_TEMPERATURE = 2.0   # the page's cap (build_request)

# The settings of a request, in the order the page's generate event takes them.
SETTINGS = ("prompt", "method", "max_new_tokens", "temperature", "top_p", "seed") + TREE_KNOBS

DEFAULTS = dict(method="dynamic", max_new_tokens=96, temperature=0.0, top_p=1.0, seed=0,
                **{k: getattr(TreeConfig(), k) for k in TREE_KNOBS})

# Named trees for the knobs, as (total_tokens, depth, top_k), the papers' N/d/k notation. The
# first is whatever the page starts with (autotune's choice for this machine when it ran, else
# the engine's defaults); the others let a class compare it with the EAGLE-2 paper's GPU tree,
# a tree big enough to see branching, and a plain chain, one click each.
AUTO_PRESET = "the page's default tree"
TREE_PRESETS: dict[str, tuple[int, int, int] | None] = {
    AUTO_PRESET: None,
    "EAGLE-2 paper, GPU (60 / 5 / 10)": (60, 5, 10),
    "teaching: a branchy tree (16 / 4 / 4)": (16, 4, 4),
    "chain of 5 (5 / 5 / 1)": (5, 5, 1),
}


# What the preset menu shows once the knobs match none of the presets; choosing it keeps them.
CUSTOM_PRESET = "custom (the knobs as you set them)"


def tree_preset(name, default: TreeConfig) -> tuple[int, int, int] | None:
    """(depth, top_k, total_tokens) of the preset ``name``, the knobs' order on the page;
    the auto preset gives ``default``'s, the custom entry None (leave the knobs alone)."""
    if name == CUSTOM_PRESET:
        return None
    if not isinstance(name, str) or name not in TREE_PRESETS:
        raise ValueError(f"tree preset must be one of {list(TREE_PRESETS) + [CUSTOM_PRESET]}, got {name!r}")
    shape = TREE_PRESETS[name]
    if shape is None:
        return default.depth, default.top_k, default.total_tokens
    total, depth, top_k = shape
    return depth, top_k, total


def setting_of(exc: ValueError) -> str | None:
    """Which setting a validation error is about, or None.

    Every check in this module and in the engine's config classes starts its message with
    the name of the parameter it refuses ("depth must be an integer in [1, 10], got 0"), so
    the first word names it. The page uses this to put the message under that control
    (Gradio's event validator) instead of failing the whole run with a page-wide error.
    """
    words = str(exc).split(maxsplit=1)
    first = words[0].lower() if words else ""
    return first if first in SETTINGS else None


def preset_of(depth, top_k, total_tokens, default: TreeConfig) -> str:
    """The menu entry for the knobs as they stand: the first preset with this (depth, top_k,
    total_tokens), the page's default tree first, else ``CUSTOM_PRESET``. So the menu never
    names a tree the knobs no longer hold."""
    knobs = (depth, top_k, total_tokens)
    return next((name for name in TREE_PRESETS if tree_preset(name, default) == knobs), CUSTOM_PRESET)


def as_int(name: str, value) -> int:
    """An integer from an int, or a float with no fractional part (sliders send floats)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    raise ValueError(f"{name} must be an integer, got {value!r}")


def as_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Request:
    """One validated generation request."""

    prompt: str
    tree: TreeConfig
    sampling: SamplingConfig
    max_new_tokens: int

    def settings(self) -> dict:
        """The flat settings dict stored in traces and shown on the page."""
        tree = {k: getattr(self.tree, k) for k in TREE_KNOBS}
        return dict(prompt=self.prompt, method=self.tree.method, max_new_tokens=self.max_new_tokens,
                    temperature=self.sampling.temperature, top_p=self.sampling.top_p,
                    seed=self.sampling.seed, **tree)

    def vanilla_key(self) -> tuple:
        """What a vanilla run depends on: not the tree knobs, so changing only those reuses it."""
        return (self.prompt, self.max_new_tokens, tuple(sorted(asdict(self.sampling).items())))


def build_request(limits, *, prompt, method, max_new_tokens, temperature, top_p=1.0, seed=0,
                  depth=5, top_k=8, total_tokens=24, tau_high=0.5, tau_low=0.05,
                  min_confidence=0.0) -> Request:
    """Validate everything; raise ValueError with a message fit for the page."""
    check_prompt(prompt, limits.max_prompt_chars)
    if not isinstance(method, str) or method not in UI_METHODS:
        raise ValueError(f"method must be one of {', '.join(UI_METHODS)}, got {method!r}")
    n = check_max_new_tokens(as_int("max_new_tokens", max_new_tokens), limits.max_new_tokens)
    tree = TreeConfig(method=method, depth=as_int("depth", depth), top_k=as_int("top_k", top_k),
                      total_tokens=as_int("total_tokens", total_tokens),
                      tau_high=as_float("tau_high", tau_high), tau_low=as_float("tau_low", tau_low),
                      min_confidence=as_float("min_confidence", min_confidence))
    sampling = SamplingConfig(temperature=as_float("temperature", temperature),
                              top_p=as_float("top_p", top_p), seed=as_int("seed", seed))
    if sampling.temperature > MAX_TEMPERATURE:
        raise ValueError(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}] here, got {sampling.temperature}")
    return Request(prompt=prompt, tree=tree, sampling=sampling, max_new_tokens=n)
