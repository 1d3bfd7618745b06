"""Prompts the embedded target writes itself (app/train/magpie.py), the prompt stage that
appends them, and a training run restricted to some shards."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from app.train.eval_overlap import EvalIndex, normalise
from app.train.magpie import CATEGORY, magpie_prompts, user_turn_prefix

SMALL = dict(batch_size=4, max_new_tokens=48)


def test_the_prefix_is_the_template_up_to_a_user_turn(embedded_target):
    tok = embedded_target.tokenizer
    prefix = user_turn_prefix(tok)
    text = tok.decode(prefix)
    assert text.endswith("user\n") and "system" in text
    full = tok.apply_chat_template([{"role": "user", "content": "Hello there"}], tokenize=False)
    assert full.startswith(text) and full[len(text):].startswith("Hello there")


@pytest.fixture(scope="module")
def written(embedded_target):
    t = embedded_target
    return magpie_prompts(t.model, t.tokenizer, 4, t.eos_ids, seed=1, first_id=100, **SMALL)


def test_the_target_writes_whole_distinct_user_turns(written):
    assert [p.id for p in written] == [f"p{i:06d}" for i in range(100, 104)]
    assert {p.category for p in written} == {CATEGORY}
    assert len({normalise(p.text) for p in written}) == 4
    assert all(len(p.text.split()) >= 4 and "<|im_" not in p.text for p in written)


def test_eval_overlapping_and_seen_turns_are_dropped(embedded_target, written):
    t = embedded_target
    again = magpie_prompts(t.model, t.tokenizer, 4, t.eos_ids, seed=1, first_id=100, **SMALL,
                           eval_index=EvalIndex([written[0].text]), seen={normalise(written[1].text)})
    texts = [p.text for p in again]
    assert written[0].text not in texts and written[1].text not in texts
    assert written[2].text in texts                                    # the same seed: the rest comes again


def test_a_run_cut_short_continues_the_same_sequence(embedded_target):
    t = embedded_target
    whole = magpie_prompts(t.model, t.tokenizer, 6, t.eos_ids, seed=3, **SMALL)
    saved = []

    def killed_after_the_first_batch(batch):
        saved.extend(batch)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        magpie_prompts(t.model, t.tokenizer, 6, t.eos_ids, seed=3, on_batch=killed_after_the_first_batch, **SMALL)
    assert 0 < len(saved) < 6
    rest = magpie_prompts(t.model, t.tokenizer, 6 - len(saved), t.eos_ids, seed=3, first_id=len(saved),
                          seen={normalise(p.text) for p in saved}, **SMALL)
    assert [(p.id, p.text) for p in saved + rest] == [(p.id, p.text) for p in whole]


def test_the_prompt_stage_appends_target_turns_in_shards_of_their_own(tmp_path):
    from app.train.cli import run_prompts
    from app.train.prompts import load_prompts

    args = argparse.Namespace(num_prompts=8, shard_size=8, magpie_prompts=3, device="cpu", data_dtype="float32",
                              base_model=None, seed=0)
    run_prompts(args, tmp_path)
    prompts = load_prompts(tmp_path / "prompts.jsonl")
    assert [p.category == CATEGORY for p in prompts] == [False] * 8 + [True] * 3
    assert [p.id for p in prompts] == [f"p{i:06d}" for i in range(11)]
    run_prompts(args, tmp_path)                                           # done already: nothing added
    assert len(load_prompts(tmp_path / "prompts.jsonl")) == 11
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p.__dict__) + "\n" for p in prompts[:9]))
    run_prompts(args, tmp_path)                                           # one kept of three: two more
    again = load_prompts(tmp_path / "prompts.jsonl")
    assert [p.id for p in again] == [p.id for p in prompts] and again[:9] == prompts[:9]
    assert len({normalise(p.text) for p in again[8:]}) == 3
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p.__dict__) + "\n" for p in prompts[:7]))
    with pytest.raises(SystemExit, match="7 prompts before them, not a multiple of --shard-size"):
        run_prompts(argparse.Namespace(**{**vars(args), "num_prompts": 7}), tmp_path)


def test_a_training_run_takes_only_the_shards_asked_for(tmp_path):
    from app.train.stage import training_shards

    features = tmp_path / "features"
    features.mkdir()
    for i in range(6):
        (features / f"shard_{i:05d}.safetensors").write_bytes(b"")
    args = argparse.Namespace(run_name="r", shards="0,2-3", holdout=["shard_00002.safetensors", "shard_00005.safetensors"])
    run_dir, paths, holdout = training_shards(args, tmp_path)
    assert [p.name for p in paths] == ["shard_00000.safetensors", "shard_00003.safetensors"]
    assert [p.name for p in holdout] == ["shard_00002.safetensors", "shard_00005.safetensors"]
    (features / "shard_00001.safetensors").unlink()                     # a resumed run keeps its list
    again = training_shards(argparse.Namespace(run_name="r", shards=None, holdout=[]), tmp_path)
    assert [p.name for p in again[1]] == ["shard_00000.safetensors", "shard_00002.safetensors",
                                          "shard_00003.safetensors", "shard_00005.safetensors"]


def test_a_new_machine_reads_the_kept_prompts_back_from_their_ids(tmp_path, embedded_target):
    """The prompt file of a new machine holds the template prompts only; the shards kept after
    them (the target's own turns, then document tasks) are read back from their ids, with their
    ids and kinds, so that the next prompts written follow them as on the first machine."""
    from app.train.cli import run_prompts
    from app.train.data import chat_ids
    from app.train.documents import CATEGORY as DOCUMENTS, TASKS
    from app.train.prompts import Prompt, build_prompts, load_prompts
    from app.train.token_store import IdShard

    tok = embedded_target.tokenizer
    template = build_prompts(4, seed=0)
    later = [Prompt("p000004", CATEGORY, "What is a good name for a cat that likes boxes?"),
             Prompt("p000005", CATEGORY, "Write a haiku about rain on a tin roof."),
             Prompt("p000006", DOCUMENTS, TASKS[0].format(doc="Bees dance.\n\nThey tell the hive where food is.")),
             Prompt("p000007", DOCUMENTS, TASKS[2].format(doc="Rivers carve valleys over many years."))]
    ids = tmp_path / "ids"
    for shard, pair in ((1, template[2:]), (2, later[:2]), (3, later[2:])):   # shards of two prompts
        convs = [chat_ids(tok, p.text) + [42, 43, 2] for p in pair]
        IdShard(tokens=np.array(sum(convs, []), dtype=np.uint16), lengths=np.array([len(c) for c in convs], np.uint32),
                prompt_lens=np.array([len(c) - 3 for c in convs], np.uint32)).save(ids / f"shard_{shard:05d}.npz")
    work = tmp_path / "work"
    work.mkdir()
    args = argparse.Namespace(num_prompts=4, shard_size=2, magpie_prompts=2, document_prompts=2, device="cpu",
                              data_dtype="float32", base_model=None, seed=0, ids_dir=str(ids), arch="eagle3")
    run_prompts(args, work)                 # the kept turns count: the target writes nothing more
    assert load_prompts(work / "prompts.jsonl") == template + later
    other = tmp_path / "other"              # a prompt file the kept ids do not answer: nothing read back
    other.mkdir()
    run_prompts(argparse.Namespace(**{**vars(args), "seed": 1, "magpie_prompts": 0, "document_prompts": 0}), other)
    assert load_prompts(other / "prompts.jsonl") == build_prompts(4, seed=1)
