"""The fast kernels build. tests/test_rowwise.py skips where they cannot run (no AVX2 + FMA,
no C compiler); these make sure a kernel source that does not compile fails the suite
instead of turning those tests into skips."""
from __future__ import annotations

import pytest

from app.engine import kernels

pytestmark = pytest.mark.skipif(kernels.compiler() is None, reason="no C compiler on this machine")


def test_the_kernels_load_wherever_the_cpu_can_run_them():
    if kernels.isa() is None:
        pytest.skip("this CPU has no AVX2 + FMA")
    assert kernels.load() is not None, kernels.why_not()


@pytest.mark.parametrize("kind", sorted(kernels.FLAGS))
def test_every_isa_kind_compiles(kind, kernel_build):
    """Each kind is built by the CPUs of its class only, so compile all of them here, whatever
    this CPU runs (gcc compiles for any -m flags; the build fails the test with gcc's errors)."""
    assert kernel_build(kind).stat().st_size > 0


def test_the_build_key_covers_every_part_of_the_source(tmp_path, monkeypatch):
    """``rowwise.c`` includes its parts from ``rowwise/``; the build's key (its cached file's
    name, and the autotune caches' forward name) hashes all of them, so an edit to any part
    is a new build, never a stale library loaded for the new source."""
    import shutil

    from app.engine.kernels import builds

    parts = [p.relative_to(builds.SOURCE.parent) for p in kernels.sources()]
    assert parts[0].name == "rowwise.c" and len(parts) > 1 and all(p.parts[0] == "rowwise" for p in parts[1:])
    shutil.copy(builds.SOURCE, tmp_path / "rowwise.c")
    shutil.copytree(builds.SOURCE.parent / "rowwise", tmp_path / "rowwise")
    monkeypatch.setattr(builds, "SOURCE", tmp_path / "rowwise.c")
    key, path = kernels.source_key(), kernels.library_path("avx2")
    for part in parts[1:]:
        edited = tmp_path / part
        original = edited.read_bytes()
        edited.write_bytes(original + b"\n/* a change */\n")
        assert kernels.source_key() != key and kernels.library_path("avx2") != path, part
        edited.write_bytes(original)
    assert kernels.source_key() == key
