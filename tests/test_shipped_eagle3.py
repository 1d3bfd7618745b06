"""The shipped EAGLE-3 head for the embedded model: loaded by name, lossless, and the state its
training resumes from (weights, draft vocabulary, learning curve) kept with it.

Slow: loads the real embedded SmolLM2-135M-Instruct.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from app.engine.config import SamplingConfig, TreeConfig
from app.engine.sources import SHIPPED_HEADS

pytestmark = pytest.mark.slow

HEAD = SHIPPED_HEADS["eagle3"]
DATA = HEAD / "data"
TARGET_LAYERS = (2, 15, 27)          # EAGLE-3's low, middle and high taps of the 30-layer target


def _answer(engine, tree, prompt, n=32) -> list[int]:
    events = list(engine.generate(prompt, tree=tree, sampling=SamplingConfig(temperature=0.0), max_new_tokens=n))
    return [t for e in events[:-1] for t in e.new_tokens]


def test_the_shipped_eagle3_head_is_small_and_carries_its_learning_curve():
    weights = HEAD / "model.safetensors"
    assert (HEAD / "config.json").is_file() and weights.is_file()
    assert weights.stat().st_size <= 25 * 2**20               # bf16 weights: one head's size per commit
    progress = json.loads((HEAD / "training.json").read_text())
    assert progress["arch"] == "eagle3" and progress["curve"]
    seen = [p["tokens_seen"] for p in progress["curve"]]
    assert seen == sorted(seen) and seen[-1] > 0
    assert {"acc1", "acc2", "acc3"} <= set(progress["held_out"])
    # the kept head is the best its last run measured, by the score that run judged by: a later
    # point counts as better only by the trainer's margin
    from app.train.trainer import TrainConfig, selection_score

    select = progress.get("select", "acc1")
    last_run = [p for p in progress["curve"] if p["run"] == progress["runs"]]
    best, top = selection_score(progress["best"], select), max(selection_score(p, select) for p in last_run)
    assert top - TrainConfig().min_gain - 1e-4 <= best <= top + 1e-4


def test_the_shipped_eagle3_head_loads_by_name_and_decodes_losslessly():
    """``--draft-model eagle3`` (and ``dynamic@eagle3`` on the page and in bench) names this
    folder; its trees are drafted by the EAGLE-3 head from the three target taps, and greedy
    decoding with it gives exactly the tokens of vanilla decoding."""
    from app.engine.factory import load_engine

    engine, _ = load_engine(draft_model="eagle3", device="cpu")
    assert engine.head.kind == "eagle3" and tuple(engine.head.target_layers) == TARGET_LAYERS
    assert engine.head.folder == HEAD
    prompt = "Write a short poem about the sea."
    vanilla = _answer(engine, TreeConfig(method="vanilla"), prompt)
    events = list(engine.generate(prompt, tree=TreeConfig(total_tokens=16, depth=4, top_k=4),
                                  sampling=SamplingConfig(temperature=0.0), max_new_tokens=32))
    assert [t for e in events[:-1] for t in e.new_tokens] == vanilla
    steps = [e for e in events[:-1] if not e.prefill]
    assert {e.drafter for e in steps} == {"eagle3"}
    assert len(steps) < len(vanilla) - 1               # some drafts were accepted: fewer forwards than tokens


def test_training_resumes_from_the_shipped_eagle3_head(tmp_path):
    """A new machine recomputes features from the committed token ids and continues training
    the shipped head: the run starts from its weights and its draft vocabulary, and the learning
    curve in training.json goes on from the shipped one."""
    from app.engine.heads.checkpoint import read_state_dict
    from app.engine.loading import load_target
    from app.train.cli import add_arguments, main
    from app.train.token_store import IdShard, features_from_ids

    target = load_target(None, device="cpu", dtype="float32")
    features = tmp_path / "features"
    for name in ("shard_00000", "shard_00002"):        # a few conversations of a training and the holdout shard
        ids = IdShard.load(DATA / f"{name}.npz")
        keep = 3
        n = int(ids.lengths[:keep].sum())
        part = IdShard(tokens=ids.tokens[:n], lengths=ids.lengths[:keep], prompt_lens=ids.prompt_lens[:keep],
                       mode=ids.mode)
        shard = features_from_ids(target.model, part, layers=TARGET_LAYERS)
        assert shard.layer_features.shape == (n, 3 * target.model.config.hidden_size)
        assert np.array_equal(shard.tokens.numpy(), part.tokens.astype(np.int32))
        shard.save(features / f"{name}.safetensors")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "head"
    assert main(parser.parse_args([
        "--arch", "eagle3", "--stage", "train", "--work-dir", str(tmp_path), "--init-from", str(HEAD),
        "--out", str(out), "--epochs", "1", "--batch-tokens", "1024", "--train-minutes", "0",
        "--warmup-steps", "1", "--holdout", "shard_00002.safetensors", "--val-batches", "1",
        "--validate-every", "1", "--head-dtype", "bfloat16", "--ids-dir", str(tmp_path / "ids")])) == 0
    shipped, resumed = read_state_dict(HEAD), read_state_dict(out)
    assert torch.equal(shipped["d2t"], resumed["d2t"])                       # the same draft vocabulary
    assert not torch.equal(shipped["fc.weight"], resumed["fc.weight"])       # trained on
    assert (shipped["fc.weight"].float() - resumed["fc.weight"].float()).abs().max() < 0.05   # ...from it
    first = json.loads((HEAD / "training.json").read_text())
    second = json.loads((out / "training.json").read_text())
    assert second["runs"] == first["runs"] + 1
    assert second["curve"][:len(first["curve"])] == first["curve"]
    assert second["curve"][-1]["tokens_seen"] > first["curve"][-1]["tokens_seen"]
