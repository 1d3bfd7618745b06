"""The shipped draft head for the embedded model: layout, size, default loading, acceptance.

Slow: loads the real embedded SmolLM2-135M-Instruct and decodes with the EAGLE-2 tree.
"""
from __future__ import annotations

import pytest

from app.engine.config import SamplingConfig, TreeConfig
from app.engine.loading import DEFAULT_HEAD_DIR

pytestmark = pytest.mark.slow


def test_shipped_head_files_are_in_the_official_layout():
    from app.engine.heads.checkpoint import read_state_dict

    weights = DEFAULT_HEAD_DIR / "model.safetensors"
    assert (DEFAULT_HEAD_DIR / "config.json").is_file() and weights.is_file()
    assert weights.stat().st_size <= 25 * 2**20
    keys = set(read_state_dict(DEFAULT_HEAD_DIR))
    assert "fc.weight" in keys and not any(k.startswith("embed_tokens") for k in keys)
    assert (DEFAULT_HEAD_DIR / "README.md").is_file()


def test_shipped_head_loads_by_default_and_is_accepted():
    """tau > 2 on three prompts, one each from three evaluation sets (greedy, 60/5/10). The
    shipped head measures 3.05 on all 80 mt_bench first turns at 256 tokens (its model card);
    an untrained or broken head gets about 1.0-1.2 here.
    """
    from app.engine.engine import Engine
    from app.engine.loading import load_draft_head, load_target
    from app.train.evaluate import first_turns, measure_tau

    target = load_target(None)
    engine = Engine(target, load_draft_head(None, target))
    prompts = [first_turns(name, 1)[0] for name in ("mt_bench", "alpaca", "gsm8k")]
    result = measure_tau(engine, prompts, TreeConfig(method="dynamic", depth=5, top_k=10, total_tokens=60),
                         SamplingConfig(temperature=0.0), max_new_tokens=40)
    assert result["tau"] > 2.0, result
