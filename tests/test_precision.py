"""The dtype chooser (app/engine/precision.py): bfloat16 only where it is clearly faster."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine import precision

times = st.lists(st.floats(1.0, 1000.0), min_size=1, max_size=9)


@settings(max_examples=200, deadline=None)
@given(times, times)
def test_bf16_only_when_its_median_beats_float32_by_the_margin(fp32, bf16):
    import statistics

    pick = precision.faster_dtype({"float32": fp32, "bfloat16": bf16})
    assert pick in ("float32", "bfloat16")
    assert (pick == "bfloat16") == (statistics.median(fp32) >= precision.MIN_GAIN * statistics.median(bf16))


def test_missing_timings_keep_the_exact_dtype():
    assert precision.faster_dtype({}) == "float32"
    assert precision.faster_dtype({"float32": [10.0]}) == "float32"
    assert precision.faster_dtype({"float32": [40.0, 41.0], "bfloat16": [21.0, 20.0]}) == "bfloat16"
    assert precision.faster_dtype({"float32": [40.0], "bfloat16": [38.0]}) == "float32"   # a near tie: stay exact


def test_time_forwards_interleaves_dtypes_on_a_tiny_model(tiny):
    import copy

    import torch

    target, _ = tiny
    models = {"float32": target.model, "bfloat16": copy.deepcopy(target.model).to(torch.bfloat16)}
    ms = precision.time_forwards(models, sizes=(1, 3), prefix_len=8, repeats=2)
    assert set(ms) == {"float32", "bfloat16"} and all(len(v) == 2 and min(v) > 0 for v in ms.values())


def test_auto_picks_bfloat16_weights_wherever_the_fast_kernels_run_and_float32_on_the_eager_forward(
        tiny, monkeypatch, tmp_path):
    """The fast forward reads bfloat16 weights and multiplies in float32 where bfloat16 is not
    native, so "auto" halves the bytes on an AVX2-only CPU too; the eager forward would
    emulate bfloat16 op by op, so it keeps float32 there (and never times anything)."""
    import torch

    from app.engine import kernels

    if kernels.load() is None:
        pytest.skip(f"no fast kernels here: {kernels.why_not()}")
    target, _ = tiny
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)      # an AVX2-only CPU
    monkeypatch.setattr(precision, "_choice_path", lambda name: tmp_path / "never-written.json")
    assert precision.auto_cpu_dtype("tiny", target.model, forward="auto") == torch.bfloat16
    assert precision.auto_cpu_dtype("tiny", target.model, forward="eager") == torch.float32
    assert not (tmp_path / "never-written.json").exists()


@pytest.mark.parametrize("env,cls", [
    ({}, None),
    ({"ATEN_CPU_CAPABILITY": "avx2"}, "avx2"),
    ({"ATEN_CPU_CAPABILITY": "default"}, "none"),
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "avx2"),
    ({"ONEDNN_MAX_CPU_ISA": "avx512_core"}, "avx512"),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}, "avx512"),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "avx512bf16"),   # native bfloat16, no AMX tiles
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, None),        # a cap at AMX or above takes nothing away
])
def test_the_emulation_switches_name_a_cpu_class_that_kernels_and_precision_both_follow(env, cls, monkeypatch):
    """One environment emulates a smaller CPU for torch, oneDNN, our kernels' ISA and the
    bfloat16 choice alike: AVX2-only, or AVX-512 without native bfloat16 (a Skylake /
    Cascade Lake Xeon, common on hosted CPUs)."""
    from app.engine import device, kernels
    from app.engine.device import cpu_class_cap

    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    zen4 = {"avx2", "fma", "avx512f", "avx512bw", "avx512_bf16"}
    monkeypatch.setattr(device, "cpu_flags", lambda: zen4)
    assert cpu_class_cap() == cls
    assert kernels.isa() == {None: "avx512bf16", "avx512bf16": "avx512bf16", "avx512": "avx512", "avx2": "avx2",
                             "none": None}[cls]
    assert precision.cpu_has_native_bf16() == (cls in (None, "avx512bf16"))
    monkeypatch.setattr(device, "cpu_flags", lambda: zen4 | {"amx_tile", "amx_bf16"})      # a Sapphire Rapids Xeon
    assert kernels.isa() == {None: "amx", "avx512bf16": "avx512bf16", "avx512": "avx512", "avx2": "avx2",
                             "none": None}[cls]
    monkeypatch.setattr(device, "cpu_flags", lambda: {"avx2", "fma", "avx512f"})     # no 16-bit shuffles (Xeon Phi)
    assert kernels.isa() == (None if cls == "none" else "avx2")
