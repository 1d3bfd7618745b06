"""A reduced draft vocabulary (EAGLE-3 style) changes what is drafted, never what is output."""
from __future__ import annotations

import json

import pytest
import torch

from app.engine.config import SamplingConfig, TreeConfig
from app.engine.engine import Engine
from app.engine.loading import load_draft_vocab


def test_greedy_output_unchanged_and_drafts_stay_in_the_set(tiny):
    target, head = tiny
    vocab = torch.arange(3, 200)          # tokens 200..255 can never be drafted
    engine = Engine(target, head, draft_vocab=vocab)
    prompt = [5, 17, 33, 90, 4]
    ref = target.model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, 5:].tolist()
    for method in ("dynamic", "chain", "threshold"):
        *steps, summary = engine.generate(prompt_ids=prompt, tree=TreeConfig(method=method), max_new_tokens=40)
        assert summary.token_ids == ref
        drafted = {t for s in steps[1:] for t in s.tree.tokens}
        assert drafted and all(3 <= t < 200 for t in drafted)


def test_sampled_chain_with_reduced_vocab_is_seeded_and_in_set(tiny):
    target, head = tiny
    engine = Engine(target, head, draft_vocab=torch.arange(3, 128))
    s = SamplingConfig(temperature=1.0, seed=9)
    runs = [list(engine.generate(prompt_ids=[5, 6, 7], tree=TreeConfig(method="chain"), sampling=s,
                                 max_new_tokens=20)) for _ in range(2)]
    assert runs[0][-1].token_ids == runs[1][-1].token_ids
    assert all(3 <= t < 128 for ev in runs[0][1:-1] for t in ev.tree.tokens)


def test_load_draft_vocab_validates(tmp_path):
    assert load_draft_vocab(tmp_path, 100) is None
    (tmp_path / "draft_vocab.json").write_text(json.dumps({"token_ids": [5, 3, 9]}))
    assert load_draft_vocab(tmp_path, 100).tolist() == [3, 5, 9]
    for bad in ([], [1, 1], [100], ["a"]):
        (tmp_path / "draft_vocab.json").write_text(json.dumps({"token_ids": bad}))
        with pytest.raises(ValueError, match="token_ids"):
            load_draft_vocab(tmp_path, 100)


def test_builder_counts_response_tokens_only(tmp_path):
    from app.train.data import FeatureShard
    from app.train.draft_vocab import build

    # two conversations: prompts [7, 7, 7] and [8, 8]; responses [1, 1, 2] and [1, 3]
    tokens = torch.tensor([7, 7, 7, 1, 1, 2, 8, 8, 1, 3], dtype=torch.int32)
    shard = FeatureShard(tokens=tokens, features=torch.zeros(10, 4, dtype=torch.float16),
                         offsets=torch.tensor([0, 6, 10]), prompt_lens=torch.tensor([3, 2]))
    shard.save(tmp_path / "features" / "shard_00000.safetensors")
    info = build(tmp_path, size=2, always=(9,))
    assert 7 not in info["token_ids"] and 8 not in info["token_ids"]
    assert info["token_ids"] == [1, 9]               # most frequent response token + the forced EOS
    assert info["response_tokens_counted"] == 5
    assert info["coverage"] == pytest.approx(3 / 5)
