"""scripts/plot_learning_curve.py: a head's training.json drawn as acceptance by depth against
tokens seen, across runs, with reference levels; the PNG through headless chromium."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from plot_learning_curve import figure  # noqa: E402

CURVE = [{"run": 1, "step": 100, "tokens_seen": 300_000, "acc1": 0.25, "acc2": 0.21, "acc3": 0.17},
         {"run": 1, "step": 200, "tokens_seen": 600_000, "acc1": 0.32, "acc2": 0.26, "acc3": 0.22},
         {"run": 2, "step": 200, "tokens_seen": 1_400_000, "acc1": 0.47, "acc2": 0.39, "acc3": 0.36}]


def test_the_figure_draws_each_depth_against_tokens_seen_and_marks_each_run_and_level():
    fig = figure(CURVE, [("EAGLE-2", 0.686), ("target", 0.72)], "t")
    assert [t.name for t in fig.data] == ["depth 1", "depth 2", "depth 3"]
    assert list(fig.data[0].x) == [0.3, 0.6, 1.4] and list(fig.data[2].y) == [0.17, 0.22, 0.36]
    lines = fig.layout.shapes
    assert [s.x0 for s in lines if s.x0 == s.x1] == [1.4]                       # run 2 began at 1.4M tokens
    assert sorted(s.y0 for s in lines if s.y0 == s.y1) == [0.686, 0.72]
    assert fig.layout.xaxis.type == "log"
    assert [a.text for a in fig.layout.annotations if a.text.startswith("run")] == ["run 2 (resumed)"]


def test_a_run_measured_on_other_held_out_shards_says_so():
    moved = CURVE + [{"run": 3, "step": 100, "tokens_seen": 2_000_000, "acc1": 0.4,
                      "held_out": ["shard_00002", "shard_00192"]}]
    notes = [a.text for a in figure(moved, [], "t").layout.annotations if a.text.startswith("run")]
    assert notes == ["run 2 (resumed)", "run 3 (resumed)<br>held out from here: 2, 192"]


def test_the_script_writes_a_png_and_refuses_a_head_without_a_curve(tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    run = [sys.executable, str(ROOT / "scripts" / "plot_learning_curve.py"), str(head)]
    out = subprocess.run(run + ["--png", str(tmp_path / "c.png")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "training.json not found" in out.stderr
    (head / "training.json").write_text(json.dumps({"curve": CURVE}))
    bad = subprocess.run(run + ["--level", "oops"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("no /usr/bin/chromium")
    out = subprocess.run(run + ["--level", "target=0.72", "--png", str(tmp_path / "c.png")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "c.png").stat().st_size > 10_000
