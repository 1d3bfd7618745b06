"""The knobs' events: a method change enables the controls that apply to it, the temperature
those of sampling, a preset moves three knobs and a knob moved by hand names the preset; an
example fills the prompt; the settings button opens the panel. No engine work, so no queue."""
from __future__ import annotations

import gradio as gr

from app.engine.config import TreeConfig
from app.engine.spec import SETTING
from app.ui.blocks.api import page_errors
from app.ui.blocks.layout import SAMPLING_ONLY, Components, sampling_note
from app.ui.requests import METHOD_KNOBS, preset_of, tree_preset


def applicability(method) -> tuple:
    """Updates for the controls of the settings that apply to some methods only (the tree
    knobs, then ``adapt``: ``METHOD_KNOBS``) when the method changes: one that does nothing
    under this method is disabled, with a note saying why (``Setting.why_not``)."""
    return tuple(gr.update(interactive=SETTING[k].applies_to(method), info=SETTING[k].why_not(method))
                 for k in METHOD_KNOBS)


def sampling_applicability(temperature) -> tuple:
    """Updates for top_p and seed when the temperature changes: disabled, with the note, at 0."""
    return tuple(gr.update(interactive=sampling_note(k, temperature) is None, info=sampling_note(k, temperature) or "")
                 for k in SAMPLING_ONLY)


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
