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

from tests.tiny import tiny_target, trained_head  # noqa: E402


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
