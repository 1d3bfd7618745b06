"""The specification of every knob of a request, once: ``SPEC``.

Each knob is a ``Setting``: name, type, range, default, which tree methods it shapes, the
page's cap where the page caps lower than the engine, which config class owns it, and the
page control's label. ``SPEC`` holds ``SETTINGS`` (what the page's request, and its API, take,
in their order), the engine's knobs the page does not offer (``ENGINE_SETTINGS``:
top_k_sampling and the drafters' ngram / window / pool) and the page's run flags
(``PAGE_FLAGS``: race, step_mode); ``KNOB`` looks one up by name. The method names
(``METHODS``, ``HEAD_METHODS``, ``TREE_METHODS``) and the engine's upper bounds are here too,
since the knobs' ranges and ``methods`` are written in them.

This module says what a valid value is; ``config.py``'s classes (``TreeConfig``,
``SamplingConfig``) hold a request's values and run these checks in ``__post_init__``. Every
reader of the settings (the CLI's flags via ``Setting.add_argument``, the page's controls,
request parser, trace schema and API) derives from this specification. Every bad value
raises ``ValueError`` whose first word names the setting, with its allowed range and a short
echo of the value (``shown``), so the CLI can print it (exit 2) and the UI can show it under
the control. Nothing downstream re-checks.

Two different "top-k"s exist in speculative decoding, so they get two different names here:
``top_k`` is the EAGLE-2 branching factor of the draft tree, and ``top_k_sampling`` truncates
the *target's* sampling distribution.
"""
from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass, replace

from app.engine.drafters.registry import DRAFTERS

# Who proposes the nodes: the EAGLE head grows the tree for these four policies; the other
# drafters (app/engine/drafters/, one line each in its registry) need no EAGLE head: prompt
# lookup and lookahead need no trained weights at all, Medusa has its own heads.
HEAD_METHODS = ("dynamic", "static", "chain", "threshold")
DRAFTER_METHODS = tuple(d.method for d in DRAFTERS)
METHODS = ("vanilla",) + HEAD_METHODS + DRAFTER_METHODS
TREE_METHODS = HEAD_METHODS + DRAFTER_METHODS   # the methods that draft a tree
PAGE_METHODS = HEAD_METHODS + ("vanilla",)      # what the page offers (its own drafter views come later)
MAX_POOL = 1024

# Upper bounds: generous for a GPU, but small enough that a stray API call cannot ask for a
# tree or an answer that takes the server down.
MAX_DEPTH = 16
MAX_TOP_K = 32
MAX_TOTAL_TOKENS = 256
MAX_NEW_TOKENS = 4096
MAX_PROMPT_CHARS = 20_000
MAX_TOP_K_SAMPLING = 100_000
MAX_SEED = 2**63 - 1


_ECHO = reprlib.Repr()
_ECHO.maxstring = _ECHO.maxother = 60
_ECHO.maxlist = _ECHO.maxtuple = _ECHO.maxdict = _ECHO.maxset = 4
_ECHO.maxlevel = 2
ECHO_CHARS = 60


def shown(value) -> str:
    """``value`` as an error message may echo it: a repr cut to about 60 characters, so a
    1 MB value never comes back as a 1 MB message (and a 10**400 integer, whose repr
    Python refuses past 4300 digits, by its size)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = _ECHO.repr(value)
    return text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS - 1] + "…"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


_SPEC_DEFAULT = object()   # "the setting's own default" for ``Setting.add_argument``


@dataclass(frozen=True)
class Setting:
    """One setting of a generation request.

    kind:        "int" | "float" | "bool" | "str" (the prompt) | "choice" (one of ``choices``)
    default:     the value a request that leaves it out gets (None: it is required)
    lo, hi:      the engine's inclusive range (for "str": at most ``hi`` characters)
    least_positive: floats only: besides 0, nothing below this (a smaller temperature or
                 top_p underflows float32 and leaves the sampler no distribution to draw from)
    methods:     the methods whose tree it shapes; elsewhere it is accepted and unused
    page_hi:     the page's (and its API's) cap, where the page caps lower than the engine
    owner:       the config class that holds it: "request" (the request itself) | "tree" | "sampling"
                 | "page" (how the page runs a request: not part of the request)
    label, step: the page control's label and step
    """

    name: str
    kind: str
    default: object
    lo: float | None = None
    hi: float | None = None
    least_positive: float | None = None
    choices: tuple[str, ...] = ()
    page_choices: tuple[str, ...] = ()   # the choices the page offers, where fewer than the engine's
    methods: tuple[str, ...] = METHODS
    page_hi: float | None = None
    owner: str = "request"
    label: str = ""
    step: float | None = None

    # --- applicability ------------------------------------------------------------------------

    def applies_to(self, method: str) -> bool:
        return method in self.methods

    def why_not(self, method: str) -> str:
        """A short note for a control that does nothing under ``method`` ("" if it applies)."""
        if self.applies_to(method):
            return ""
        if len(self.methods) == 1:
            return f"{self.name} applies to the {self.methods[0]} method only"
        if set(self.methods) == set(TREE_METHODS):
            return f"{self.name} shapes the draft tree: {method} drafts none"
        return f"{self.name} applies to {', '.join(self.methods)} only"

    # --- parsing and checking -----------------------------------------------------------------

    def range_text(self, hi=None) -> str:
        hi = self.hi if hi is None else hi
        if self.kind == "choice":
            return f"one of {', '.join(self.choices)}"
        if self.kind == "str":
            return f"a non-empty, non-blank string of at most {hi} characters"
        if self.kind == "bool":
            return "true or false"
        what = "an integer" if self.kind == "int" else "a number"
        if self.least_positive is not None:
            return f"0 or {what} in [{_num(self.least_positive)}, {_num(hi)}]"
        return f"{what} in [{_num(self.lo)}, {_num(hi)}]"

    def refuse(self, value, hi=None, why: str = ""):
        raise ValueError(f"{self.name} must be {self.range_text(hi)}{why}, got {shown(value)}")

    def coerce(self, value):
        """A raw value from JSON or a slider as this setting's type: an int from an integral
        float (sliders send floats), a float from an int. Only the type: ranges are
        ``check``'s job, run by the engine's config classes."""
        if self.kind == "int" and isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        if self.kind == "float" and _is_int(value):
            try:
                return float(value)
            except OverflowError:
                self.refuse(value)
        return value

    def check(self, value, hi=None, lo=None):
        """``value`` if it is in range, else ValueError naming the setting and its range.
        ``hi``: a lower cap set by whoever hosts the engine (max_new_tokens, prompt length);
        ``lo``: a higher floor set by a drafter (``DrafterInfo.lowest``)."""
        if lo is not None and lo != self.lo:
            return replace(self, lo=lo).check(value, hi)
        hi = self.hi if hi is None else hi
        if self.kind == "choice":
            if not isinstance(value, str) or value not in self.choices:
                self.refuse(value)
        elif self.kind == "str":
            self._check_text(value, hi)
        elif self.kind == "bool":
            if not isinstance(value, bool):
                self.refuse(value)
        elif self.kind == "int":
            if not _is_int(value) or not self.lo <= value <= hi:
                self.refuse(value, hi)
        else:
            ok = _is_number(value) and math.isfinite(value) and self.lo <= value <= hi
            if ok and self.least_positive is not None and 0 < value < self.least_positive:
                ok = False
            if not ok:
                self.refuse(value, hi)
        return value

    def _check_text(self, value, hi) -> None:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{self.name} must be a non-empty, non-blank string, got {shown(value)}")
        if len(value) > hi:
            raise ValueError(f"{self.name} must be at most {hi} characters, got {len(value)}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"{self.name} must be valid Unicode text: character {exc.start} is a lone "
                             "surrogate") from None

    # --- the command line -----------------------------------------------------------------------

    @property
    def flag(self) -> str:
        """Its command-line flag: ``--total-tokens`` for ``total_tokens``."""
        return "--" + self.name.replace("_", "-")

    def add_argument(self, parser, default=_SPEC_DEFAULT, help: str | None = None, **kw):
        """Add this setting to an ``argparse`` parser as ``flag``, with its type and choices
        and, unless told otherwise, its default. A bool is a switch (``store_true``)."""
        default = self.default if default is _SPEC_DEFAULT else default
        help = help if help is not None else (self.label or None)
        if self.kind == "bool":
            return parser.add_argument(self.flag, action="store_true", default=default, help=help, **kw)
        if self.kind == "choice":
            kw.setdefault("choices", list(self.choices))
        kind = {"int": int, "float": float}.get(self.kind, str)
        return parser.add_argument(self.flag, type=kind, default=default, help=help, **kw)

    def check_page_cap(self, value):
        """``value`` if it is within the page's cap (``page_hi``, ``page_choices``); the engine's
        range is ``check``'s. The page (and its API) then accept exactly what its control offers."""
        if self.page_choices and value not in self.page_choices:
            raise ValueError(f"{self.name} must be one of {', '.join(self.page_choices)} on this page, got {shown(value)}")
        if self.page_hi is not None and not isinstance(value, bool) and value > self.page_hi:
            self.refuse(value, self.page_hi, " on this page")
        return value


# The settings of one request, in the order the page's events (and its API) take them.
SETTINGS: tuple[Setting, ...] = (
    Setting("prompt", "str", None, hi=MAX_PROMPT_CHARS, label="Prompt"),
    Setting("method", "choice", "dynamic", choices=METHODS, page_choices=PAGE_METHODS, owner="tree", label="Method"),
    Setting("max_new_tokens", "int", 96, 1, MAX_NEW_TOKENS, label="max new tokens", step=1),
    Setting("temperature", "float", 0.0, 0.0, 100.0, least_positive=0.01, page_hi=2.0, owner="sampling",
            label="temperature (0 = greedy)", step=0.05),
    Setting("top_p", "float", 1.0, 0.01, 1.0, owner="sampling", label="top_p", step=0.01),
    Setting("seed", "int", 0, 0, MAX_SEED, owner="sampling", label="seed", step=1),
    Setting("depth", "int", 5, 1, MAX_DEPTH, methods=TREE_METHODS, owner="tree",
            label="depth (draft levels)", step=1),
    Setting("top_k", "int", 8, 1, MAX_TOP_K, methods=("dynamic",), owner="tree",
            label="top_k (branching)", step=1),
    Setting("total_tokens", "int", 24, 1, MAX_TOTAL_TOKENS, methods=TREE_METHODS, page_hi=128, owner="tree",
            label="total_tokens (nodes verified)", step=1),
    Setting("tau_high", "float", 0.5, 0.0, 1.0, methods=("threshold",), owner="tree",
            label="tau_high (threshold: 2 children)", step=0.01),
    Setting("tau_low", "float", 0.05, 0.0, 1.0, methods=("threshold",), owner="tree",
            label="tau_low (threshold: 1 child)", step=0.01),
    Setting("min_confidence", "float", 0.0, 0.0, 1.0, methods=TREE_METHODS, owner="tree",
            label="min_confidence (drop nodes below)", step=0.01),
    # Not a tree knob but a way of choosing the tree: each step, an ``app.engine.adapt.TreeAdapter``
    # picks among a few trees by the tokens/s the run has measured so far (the knobs above are
    # then unused). Output is the same either way; only speed changes.
    Setting("adapt", "bool", False, methods=("dynamic",),
            label="adapt the tree while decoding (the run picks each step's tree by measured speed)"),
    # Prompt lookup beside the head (``drafters.pld.with_lookup_branch``). Off by default for the
    # engine; the page's default tree turns it on (``app.engine.adapt.auto_lookup``), as the
    # CLI's auto tree does. Added after ``adapt``, so the earlier settings keep their places.
    Setting("lookup", "int", 0, 0, MAX_DEPTH, methods=HEAD_METHODS, owner="tree",
            label="lookup (prompt-lookup branch: up to this many tokens copied from earlier text, "
                  "verified beside the head's tree; 0 = off)", step=1),
)
SETTING: dict[str, Setting] = {s.name: s for s in SETTINGS}


def _drafters_reading(knob: str) -> tuple[str, ...]:
    return tuple(d.method for d in DRAFTERS if knob in d.knobs)


# The engine's knobs that the page does not offer.
TOP_K_SAMPLING = Setting("top_k_sampling", "int", 0, 0, MAX_TOP_K_SAMPLING, owner="sampling",
                         label="top_k_sampling (0 = no top-k truncation of the target's distribution)")
ENGINE_SETTINGS: tuple[Setting, ...] = (
    TOP_K_SAMPLING,
    Setting("ngram", "int", 3, 1, MAX_DEPTH, methods=_drafters_reading("ngram"), owner="tree",
            label="pld: longest n-gram looked up; lookahead: size N of the n-grams collected"),
    Setting("window", "int", 4, 1, MAX_DEPTH, methods=_drafters_reading("window"), owner="tree",
            label="lookahead: Jacobi guesses W"),
    Setting("pool", "int", 8, 1, MAX_POOL, methods=_drafters_reading("pool"), owner="tree",
            label="lookahead: n-grams kept per first token"),
)
# How the page runs a request (its switches beside the settings; not part of the request).
PAGE_FLAGS: tuple[Setting, ...] = (
    Setting("step_mode", "bool", False, owner="page",
            label="Step mode (classroom): pause after every step"),
    Setting("race", "bool", True, owner="page",
            label="race against plain decoding (vanilla runs alongside, for the speedup)"),
)
# Every knob, once.
SPEC: tuple[Setting, ...] = SETTINGS + ENGINE_SETTINGS + PAGE_FLAGS
KNOB: dict[str, Setting] = {s.name: s for s in SPEC}
