"""A/B: pin the run on screen as A (API ``/pin``); the comparison panel follows the run on
screen, B (``handlers.compare_view``)."""
from __future__ import annotations

from app.ui import handlers
from app.ui.blocks.api import COMPARE_VIEWS, _once
from app.ui.blocks.layout import Components
from app.ui.session import Session


def wire_compare(c: Components) -> None:
    """Pin this run as A: kept in the visitor's session (one pinned run); the next run on
    screen is B and the comparison panel follows it (``handlers.compare_view``)."""
    def pin(session: Session):
        return _once(lambda: handlers.pin(session), COMPARE_VIEWS)

    c.pin_btn.click(pin, [c.session], c.views(COMPARE_VIEWS), api_name="pin")
