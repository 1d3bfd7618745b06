"""The method comparison's event (API ``/compare_methods``, the tab *Compare methods*)."""
from __future__ import annotations

from app.ui import methods
from app.ui.blocks.api import METHODS_VIEWS, _stream, settings_validator
from app.ui.blocks.layout import Components
from app.ui.requests import Checked
from app.ui.session import Session
from app.ui.settings import AppContext, gpu


def wire_methods(c: Components, ctx: AppContext, engine_events: dict):
    """The method comparison (API ``/compare_methods``): prompt, methods, max_new_tokens.
    Validated before it starts (a refusal shows under the control it names)."""
    checked = Checked()

    def check(prompt, chosen, max_new_tokens):
        return methods.check_compare(ctx, prompt, chosen, max_new_tokens)

    def compare_methods(prompt: str, methods_list: list[str], max_new_tokens: int = methods.DEFAULT_TOKENS,
                        session: Session | None = None):
        """Run 2-4 methods on one prompt in turns; per method its tree, tau, tokens/s and the race."""
        session = session if isinstance(session, Session) else Session()
        gen = methods.compare_methods(ctx, session, prompt, methods_list, max_new_tokens,
                                      checked=checked.get([prompt, methods_list, max_new_tokens]))
        yield from _stream(gen, METHODS_VIEWS)

    names = ("prompt", "methods", "max_new_tokens", None)
    return c.methods_btn.click(gpu(compare_methods), [c.controls["prompt"], c.methods_box, c.methods_tokens, c.session],
                               c.views(METHODS_VIEWS), api_name="compare_methods",
                               validator=settings_validator(check, names, checked), **engine_events)
