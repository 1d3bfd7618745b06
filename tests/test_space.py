"""What a Hugging Face Space needs of the app: the page says which forward decodes (and why
the fast one is off when it is), ZeroGPU's ``spaces.GPU`` wraps every engine event, and the
files a Space's build reads ask for what the fast forward needs."""
from __future__ import annotations

import sys
import types
from pathlib import Path

from app.engine import kernels
from app.engine.engine import Engine
from app.ui.blocks.layout import page_header
from app.ui.settings import AppContext, ServerConfig
from tests.tiny import tiny_target

REPO = Path(__file__).resolve().parents[1]


def test_the_header_names_the_fast_forward_or_says_why_it_is_off(monkeypatch, tmp_path):
    """With the kernels built, the header names them; with no C compiler and no cached build
    (a Space without packages.txt), it says the fast forward is not running and why — on the
    page, not only on stderr."""
    target = tiny_target(seed=5)
    fast = page_header(AppContext(Engine(target, None), ServerConfig(), "tiny"))
    assert "fast forward (our batch-invariant C kernels" in fast and "not running" not in fast
    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path))          # no cached build to find
    monkeypatch.setenv("CC", str(tmp_path / "no-such-gcc"))
    kernels.reset()
    try:
        slow = page_header(AppContext(Engine(tiny_target(seed=5), None), ServerConfig(), "tiny"))
    finally:
        monkeypatch.undo()
        kernels.reset()
    assert "The fast forward is not running" in slow and "no C compiler" in slow and "packages.txt" in slow


def test_on_zerogpu_every_engine_event_asks_spaces_for_a_gpu(monkeypatch, tiny):
    """A stand-in ``spaces`` module records what ``spaces.GPU`` decorates: on a ZeroGPU Space
    (SPACES_ZERO_GPU set) the page's engine events — the /generate API, a step, Compare
    methods — are each wrapped, and a wrapped call still runs the handler."""
    from app.ui.blocks import build_demo

    wrapped, calls = [], []

    def GPU(duration=60):
        def decorate(fn):
            wrapped.append(getattr(fn, "__name__", repr(fn)))

            def run(*args, **kwargs):
                calls.append(fn.__name__)
                return fn(*args, **kwargs)
            run.__name__, run.__signature__ = fn.__name__, getattr(fn, "__signature__", None)
            run.__wrapped__ = fn
            return run
        assert duration >= 60                 # a 128-token run on a GPU is far below it
        return decorate

    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=GPU))
    monkeypatch.setenv("SPACES_ZERO_GPU", "1")
    target, head = tiny
    demo = build_demo(AppContext(Engine(target, head), ServerConfig(), "tiny"), demos={})
    assert len(wrapped) >= 3, wrapped
    assert {"next_step", "compare_methods"} <= set(wrapped), wrapped
    api = {d.api_name: d for d in demo.fns.values() if d.api_name}
    assert "generate" in api and getattr(api["generate"].fn, "__wrapped__", None) is not None


def test_packages_txt_gives_a_space_the_fast_forwards_compiler():
    """The Spaces build installs Debian packages.txt: gcc, and the C library headers that
    rowwise's sources include (``gcc`` alone only recommends them)."""
    wanted = {line.strip() for line in (REPO / "packages.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert {"gcc", "libc6-dev"} <= wanted
    assert kernels.compiler() is not None      # and this machine, where the tests run, has one too
