"""Turn raw values from the page or the API into validated engine settings.

Anyone can call the API with any JSON, bypassing the sliders, so nothing is trusted. The
settings and their ranges are defined once, in ``app.engine.spec.SETTINGS``; here each raw
value is only converted to its setting's type (``Setting.coerce``), then the engine's own
config classes check the ranges (raising ``ValueError`` whose first word names the setting),
and the page's lower caps are applied (``Setting.check_page_cap``). The page's event
validator shows each message under the control it names (``setting_of``); whatever reaches a
handler becomes a ``gr.Error`` message.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass

from app.engine.config import SamplingConfig, TreeConfig, check_max_new_tokens, check_prompt
from app.engine.spec import SETTING, SETTINGS, shown

# The settings of a request, in the order the page's generate event (and its API) takes them.
SETTING_NAMES = tuple(s.name for s in SETTINGS)
# The knobs of the draft tree (the method aside), in that order.
TREE_KNOBS = tuple(s.name for s in SETTINGS if s.owner == "tree" and s.name != "method")
# Every setting that applies to some methods only (the tree knobs, then ``adapt``): the page
# disables its control, with a note, under a method it does nothing for.
METHOD_KNOBS = tuple(s.name for s in SETTINGS if s.name != "method" and set(s.methods) != set(SETTING["method"].choices))
# What the explorer can sweep: every tree knob, and the sampling temperature (how acceptance
# falls as the target's and the draft's distributions flatten).
SWEEP_KNOBS = TREE_KNOBS + ("temperature",)

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
        raise ValueError(f"tree preset must be one of {list(TREE_PRESETS) + [CUSTOM_PRESET]}, got {shown(name)}")
    shape = TREE_PRESETS[name]
    if shape is None:
        return default.depth, default.top_k, default.total_tokens
    total, depth, top_k = shape
    return depth, top_k, total


def setting_of(exc: ValueError, names=SETTING_NAMES) -> str | None:
    """Which of ``names`` (the settings, unless told) a validation error is about, or None.

    Every check in this module and in the engine's config classes starts its message with
    the name of the parameter it refuses ("depth must be an integer in [1, 10], got 0"), so
    the first word names it. The page uses this to put the message under that control
    (Gradio's event validator) instead of failing the whole run with a page-wide error.
    """
    words = str(exc).split(maxsplit=1)
    first = words[0].lower() if words else ""
    return first if first in names else None


def preset_of(depth, top_k, total_tokens, default: TreeConfig) -> str:
    """The menu entry for the knobs as they stand: the first preset with this (depth, top_k,
    total_tokens), the page's default tree first, else ``CUSTOM_PRESET``. So the menu never
    names a tree the knobs no longer hold."""
    knobs = (depth, top_k, total_tokens)
    return next((name for name in TREE_PRESETS if tree_preset(name, default) == knobs), CUSTOM_PRESET)


@dataclass(frozen=True)
class Request:
    """One validated generation request.

    ``prompt_ids``: the prompt as the engine reads it (``Engine.encode_prompt``: the chat
    template, then the tokenizer), set by ``handlers.parse``, which encodes it once per click;
    every check and run of that click takes these ids (``Engine.generate(prompt_ids=...)``)
    instead of encoding the text again. None for a request not yet checked against an engine."""

    prompt: str
    tree: TreeConfig
    sampling: SamplingConfig
    max_new_tokens: int
    adapt: bool = False          # pick each step's tree while decoding (method dynamic only)
    prompt_ids: tuple[int, ...] | None = None

    def value(self, name: str):
        """The value of setting ``name`` in this request."""
        owner = SETTING[name].owner
        return getattr(self.tree if owner == "tree" else self.sampling if owner == "sampling" else self, name)

    def settings(self) -> dict:
        """The flat settings dict stored in traces and shown on the page (``SETTINGS``' order)."""
        return {name: self.value(name) for name in SETTING_NAMES}

    def vanilla_key(self) -> tuple:
        """What a vanilla run depends on: not the tree knobs, so changing only those reuses it."""
        return (self.prompt, self.max_new_tokens, tuple(sorted(asdict(self.sampling).items())))


def build_request(limits, **raw) -> Request:
    """Validate one request's raw values (any JSON; a setting left out takes its default);
    raise ValueError with a message fit for the page, naming the setting."""
    for name in raw:
        if name not in SETTING:
            raise ValueError(f"{shown(name)} is not a setting; the settings are {', '.join(SETTING_NAMES)}")
    v = {s.name: s.coerce(raw.get(s.name, s.default)) for s in SETTINGS}
    prompt = check_prompt(v["prompt"], limits.max_prompt_chars)
    for s in SETTINGS:   # a value beyond the page's cap is refused naming the page's range, as its control shows it
        if s.page_hi is not None and s.kind in ("int", "float"):
            try:
                s.check(v[s.name], hi=s.page_hi)
            except ValueError:
                s.refuse(v[s.name], s.page_hi, " on this page")
    tree = TreeConfig(**{s.name: v[s.name] for s in SETTINGS if s.owner == "tree"})
    sampling = SamplingConfig(**{s.name: v[s.name] for s in SETTINGS if s.owner == "sampling"})
    n = check_max_new_tokens(v["max_new_tokens"], limits.max_new_tokens)
    adapt = SETTING["adapt"].check(v["adapt"])
    for s in SETTINGS:
        s.check_page_cap(v[s.name])
    return Request(prompt=prompt, tree=tree, sampling=sampling, max_new_tokens=n, adapt=adapt)


class Checked:
    """What the page's event validator accepted, by the exact raw values it judged, so the
    event that follows the click runs what the validator built instead of validating again.

    Keys hold each value with its type (1, 1.0 and True are equal in Python, not here);
    only accepted values, which are small and hashable, are kept, the latest ``size``."""

    def __init__(self, size: int = 256):
        self._items: OrderedDict = OrderedDict()
        self._size = size
        self._lock = threading.Lock()   # the validator and the events run on different threads

    @staticmethod
    def key(values) -> tuple | None:
        try:
            k = tuple((type(v), tuple(v) if isinstance(v, list) else v) for v in values)
            hash(k)
        except TypeError:
            return None
        return k

    def put(self, values, checked) -> None:
        k = self.key(values)
        if k is None:
            return
        with self._lock:
            self._items[k] = checked
            self._items.move_to_end(k)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def get(self, values):
        k = self.key(values)
        if k is None:
            return None
        with self._lock:
            return self._items.get(k)
