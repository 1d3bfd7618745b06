"""Shared fixtures: tiny random models (fast, for the algorithm) and the embedded model
(real, for a few end-to-end checks). Everything runs offline on CPU."""
from __future__ import annotations

import os
import subprocess

import pytest
import torch

# One thread: the tiny models gain nothing from more, and on a shared 2-core machine
# oversubscribed torch threads slow every process tenfold. EAGLE_LENS_TEST_THREADS overrides.
torch.set_num_threads(int(os.environ.get("EAGLE_LENS_TEST_THREADS", "1")))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Gradio's temporary folder (uploads, traces) per test process: the upload-budget tests count
# and prune what that folder holds, and another pytest-xdist worker's traces appearing or
# going there between a test's measurement and its upload made them flaky. The workers inherit
# the controller's environment, so a folder this file made in the controller is not reused:
# only a GRADIO_TEMP_DIR the user set is.
if os.environ.get("GRADIO_TEMP_DIR") in (None, os.environ.get("EAGLE_LENS_TEST_GRADIO_TEMP_DIR")):
    import atexit
    import shutil
    import tempfile

    os.environ["GRADIO_TEMP_DIR"] = tempfile.mkdtemp(prefix=f"gradio-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
    os.environ["EAGLE_LENS_TEST_GRADIO_TEMP_DIR"] = os.environ["GRADIO_TEMP_DIR"]
    atexit.register(shutil.rmtree, os.environ["GRADIO_TEMP_DIR"], ignore_errors=True)

from tests.tiny import E2E_VOCAB, tiny_target, trained_head, trained_medusa  # noqa: E402


class _TinyModels(dict):
    """{seed: (target, trained head)}, each built on first use and kept for the session."""

    def __missing__(self, seed):
        target = tiny_target(seed)
        self[seed] = (target, trained_head(target, seed))
        return self[seed]


@pytest.fixture(scope="session")
def tiny_models():
    return _TinyModels()


@pytest.fixture(scope="session")
def tiny(tiny_models):
    return tiny_models[0]


@pytest.fixture(scope="session")
def engines():
    """{seed: Engine with no EAGLE head at all, and briefly trained Medusa heads} (the drafter tests)."""
    from app.engine.engine import Engine

    out = {}
    for seed in (0, 1):
        target = tiny_target(seed)
        out[seed] = Engine(target, None, medusa=trained_medusa(target, seed=seed))
    return out


@pytest.fixture(scope="session")
def peaked():
    """A tiny target with peaked distributions and a head fitted to its sampled continuations:
    the end-to-end sampling tests' model (a 16-token vocabulary, so every joint can be enumerated)."""
    target = tiny_target(3, vocab=E2E_VOCAB, hidden=32, layers=1, eos=None, peaky=30.0)
    return target, trained_head(target, 3, steps=300, seqs=64, length=24, sampled=True)


@pytest.fixture(scope="session")
def embedded_target():
    from app.engine.loading import load_target

    return load_target(None, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def embedded_random_head_dir(embedded_target, tmp_path_factory):
    """A randomly initialised head for the embedded model, saved in the official layout:
    losslessness must not depend on the head's quality."""
    from app.engine.heads.eagle import DraftHead, head_config_for

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("random_head")
    DraftHead(head_config_for(embedded_target.model.config)).save(folder)
    return folder


@pytest.fixture(scope="session")
def kernel_build(tmp_path_factory):
    """``kernel_build(kind, *flags)``: app/engine/kernels/rowwise.c compiled for an ISA kind
    (with extra compiler flags, e.g. another register block), once per session: the .so's path."""
    from app.engine import kernels

    built = {}

    def build(kind: str, *flags: str):
        if (kind, flags) not in built:
            out = tmp_path_factory.mktemp("kernels") / f"rowwise-{kind}.so"
            cmd = kernels.command(kind, kernels.compiler(), out)
            done = subprocess.run(cmd[:1] + list(flags) + cmd[1:], capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-2000:]
            built[kind, flags] = out
        return built[kind, flags]

    return build
