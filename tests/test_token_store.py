"""The data's token ids, kept in git (app/train/token_store.py): their file round-trips, their
checksums catch a changed file, the features recomputed from them are the ones recorded while
answering, and the data stage resumes from them on a machine that has no features."""
from __future__ import annotations

import argparse

import numpy as np
import torch

from app.engine.sources import SHIPPED_HEADS
from app.train.data import FeatureShard, generate_with_features
from app.train.token_store import (SUMS_FILE, IdShard, check_checksums, export_ids, features_from_ids,
                                   write_checksums)
from tests.test_train import _tiny_prompts
from tests.tiny import eagle3_target

LAYERS = (2, 4, 5)
SHIPPED_DATA = SHIPPED_HEADS["eagle3"] / "data"


def _shard(target, shard: int, n: int = 7, new_tokens: int = 20) -> FeatureShard:
    return generate_with_features(target.model, target.tokenizer, _tiny_prompts(n, shard), shard, new_tokens,
                                  seed=0, eos_ids=target.eos_ids, pad_id=0, layers=LAYERS)


def test_features_recomputed_from_the_ids_equal_the_recorded_ones(tmp_path):
    """A sampled shard (varied lengths) -> ids file -> features again, in several right-padded
    batches: the same tokens, offsets and prompt lengths, and the recorded final features and
    EAGLE-3 layer inputs up to their float16 storage."""
    target = eagle3_target(0)
    fs = _shard(target, shard=1)
    path = tmp_path / "shard_00001.npz"
    IdShard.of(fs).save(path)
    ids = IdShard.load(path)
    assert ids.tokens.dtype == np.uint16 and ids.mode == fs.mode and len(ids) == len(fs)
    assert len({len(c) for c in ids.conversations()}) > 1                # lengths differ: padding is exercised
    again = features_from_ids(target.model, ids, layers=LAYERS, batch_tokens=64)   # a few rows a batch
    for name in ("tokens", "offsets", "prompt_lens"):
        assert torch.equal(getattr(again, name).long(), getattr(fs, name).long()), name
    torch.testing.assert_close(again.features.float(), fs.features.float(), atol=2e-2, rtol=2e-3)
    torch.testing.assert_close(again.layer_features.float(), fs.layer_features.float(), atol=2e-2, rtol=2e-3)
    assert again.layers == LAYERS and again.mode == fs.mode


def test_a_changed_or_unlisted_id_shard_fails_the_checksums(tmp_path):
    target = eagle3_target(0)
    for s in range(2):
        IdShard.of(_shard(target, s, n=3, new_tokens=6)).save(tmp_path / f"shard_{s:05d}.npz")
    write_checksums(tmp_path)
    assert check_checksums(tmp_path) == []
    raw = bytearray((tmp_path / "shard_00001.npz").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "shard_00001.npz").write_bytes(bytes(raw))
    assert check_checksums(tmp_path) == ["shard_00001.npz does not match its checksum"]
    (tmp_path / "shard_00001.npz").unlink()
    (tmp_path / "shard_00007.npz").write_bytes(b"x")
    assert check_checksums(tmp_path) == ["shard_00007.npz is not in SHA256SUMS",
                                         "shard_00001.npz is listed in SHA256SUMS but missing"]


def _two_machines(tmp_path, monkeypatch, shards: str, prompts: int):
    """The data stage's arguments on the tiny EAGLE-3 target, and two work dirs (a first and a
    second machine) with the same ``prompts`` prompts, sharing one ids folder."""
    from app.engine import loading
    from app.train.prompts import save_prompts

    target = eagle3_target(0)
    monkeypatch.setattr(loading, "load_target", lambda *a, **k: target)
    ids_dir = tmp_path / "ids"
    args = argparse.Namespace(shard_size=3, shards=shards, time_budget_min=None, base_model=None, arch="eagle3",
                              data_dtype="float32", max_new_tokens=6, seed=0, ids_dir=str(ids_dir))
    first, second = tmp_path / "first", tmp_path / "second"
    for work in (first, second):
        save_prompts(_tiny_prompts(prompts), work / "prompts.jsonl")
    return args, ids_dir, first, second


def test_the_data_stage_keeps_ids_and_resumes_from_them_without_answering(tmp_path, monkeypatch, capsys):
    """A first machine answers two shards and keeps their ids (with checksums); a second one,
    with the ids only, rebuilds the same feature shards without answering a prompt."""
    from app.train.cli import run_data

    args, ids_dir, first, second = _two_machines(tmp_path, monkeypatch, "0,1", 6)
    run_data(args, first)
    assert sorted(p.name for p in ids_dir.iterdir()) == [SUMS_FILE, "shard_00000.npz", "shard_00001.npz"]
    assert check_checksums(ids_dir) == []

    def no_answers(*a, **k):
        raise AssertionError("answered a prompt whose ids were kept")
    monkeypatch.setattr("app.train.cli.generate_with_features", no_answers)
    capsys.readouterr()
    run_data(args, second)
    assert "recomputed from shard_00000.npz" in capsys.readouterr().out
    for name in ("shard_00000.safetensors", "shard_00001.safetensors"):
        a, b = FeatureShard.load(first / "features" / name), FeatureShard.load(second / "features" / name)
        assert torch.equal(a.tokens, b.tokens) and a.layers == b.layers == LAYERS
        torch.testing.assert_close(b.layer_features.float(), a.layer_features.float(), atol=2e-2, rtol=2e-3)


def test_shards_kept_recomputes_the_kept_shards_and_answers_no_other(tmp_path, monkeypatch, capsys):
    """``--shards kept`` on a new machine: the features of the shards whose ids are kept, even
    where its prompt file does not reach them, and no prompt of the others answered (their
    shards are left to a run that answers them)."""
    from app.train.cli import run_data
    from app.train.prompts import save_prompts

    args, _, first, second = _two_machines(tmp_path, monkeypatch, "1", 9)   # three shards of three prompts
    run_data(args, first)                                            # only shard 1 answered and kept

    def no_answers(*a, **k):
        raise AssertionError("answered a prompt with --shards kept")
    monkeypatch.setattr("app.train.cli.generate_with_features", no_answers)
    args.shards = "kept"
    save_prompts(_tiny_prompts(3), second / "prompts.jsonl")       # its prompts end before shard 1: no matter
    run_data(args, second)
    assert sorted(p.name for p in (second / "features").glob("*.safetensors")) == ["shard_00001.safetensors"]
    assert "recomputed from shard_00001.npz" in capsys.readouterr().out


def test_ids_export_from_feature_shards_writes_only_the_missing_ones(tmp_path):
    target = eagle3_target(0)
    _shard(target, 0, n=3, new_tokens=6).save(tmp_path / "features" / "shard_00000.safetensors")
    assert [p.name for p in export_ids(tmp_path / "features", tmp_path / "ids")] == ["shard_00000.npz"]
    assert export_ids(tmp_path / "features", tmp_path / "ids") == []
    assert check_checksums(tmp_path / "ids") == []


def test_the_shipped_eagle3_data_matches_its_checksums_and_is_well_formed():
    """The committed ids: every file listed with its hash, and each a set of conversations of
    the embedded target's vocabulary whose prompts are shorter than the conversations."""
    assert check_checksums(SHIPPED_DATA) == []
    files = sorted(SHIPPED_DATA.glob("shard_*.npz"))
    assert files
    for f in files:
        ids = IdShard.load(f)
        assert int(ids.tokens.max()) < 49152 and int(ids.lengths.sum()) == ids.tokens.size
        assert (ids.prompt_lens < ids.lengths).all() and ids.mode.split("@")[0] in ("greedy", "sampled")
