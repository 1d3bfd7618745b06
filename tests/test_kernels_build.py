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
