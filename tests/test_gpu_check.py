"""scripts/gpu_check.py, the GPU readiness check, runs its three steps on the CPU with the
tiny shape, so that it keeps working where no GPU is present (on a GPU it runs with
--device cuda and the Llama-8B shape)."""
from __future__ import annotations

import json

import pytest
import torch

from tests.scripts import load_script



def _load():
    return load_script("gpu_check")


def test_gpu_check_runs_all_three_steps_on_cpu(tmp_path):
    gpu_check = _load()
    out = tmp_path / "gpu-check.json"
    assert gpu_check.main(["--device", "cpu", "--shape", "tiny", "--out", str(out), "--work", str(tmp_path / "w")]) == 0
    r = json.loads(out.read_text())
    assert r["device"] == "cpu"
    for tree in ("dynamic 24/5/8", "chain 2/2/1", "static"):
        assert r["lossless"][tree]["identical_to_generate"] is True and r["lossless"][tree]["tau"] > 1.0
    assert r["lossless"]["sampled chain"]["tokens"] > 0
    curve = r["cost_curve"]
    assert curve["sizes"] == [1, 2, 4, 8] and len(curve["ms"]) == 4 and curve["ratio_to_one_token"][0] == 1.0
    assert r["train"]["steps"] > 0 and r["train"]["head_device"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_gpu_check_says_when_there_is_no_gpu(capsys):
    assert _load().main(["--device", "cuda"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_gpu_check_refuses_the_big_shape_on_a_cpu(capsys):
    assert _load().main(["--device", "cpu", "--shape", "llama-8b"]) == 2
    assert "use --shape tiny" in capsys.readouterr().err
