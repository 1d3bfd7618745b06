"""Long prompts over documents made of kept answers (app/train/documents.py) and the prompt
stage that appends them."""
from __future__ import annotations

import argparse
import functools
import json
import re

import numpy as np
import pytest

from app.train.documents import CATEGORY, MIN_ANSWER_TOKENS, TASKS, document_prompts, kept_answers
from app.train.eval_overlap import EvalIndex

# (text, tokens): a unique tag per answer, so that a document's pieces can be found again
ANSWERS = [(f"[a{i}] " + "word " * (40 + 7 * (i % 30)), 40 + 7 * (i % 30)) for i in range(200)]


def _pieces(prompt: str) -> list[int]:
    return [int(m) for m in re.findall(r"\[a(\d+)\]", prompt)]


def test_documents_fall_in_the_length_window_and_carry_a_task():
    prompts = document_prompts(ANSWERS, 40, seed=3, first_id=64, min_tokens=350, max_tokens=700)
    assert [p.id for p in prompts] == [f"p{i:06d}" for i in range(64, 104)]
    assert {p.category for p in prompts} == {CATEGORY}
    for p in prompts:
        pieces = _pieces(p.text)
        tokens = sum(ANSWERS[i][1] for i in pieces) + len(pieces) - 1
        assert 350 <= tokens <= 700 and len(pieces) >= 2, (p.id, tokens)
        doc = "\n\n".join(ANSWERS[i][0] for i in pieces)
        assert any(task.format(doc=doc) == p.text for task in TASKS)
    assert len({_pieces(p.text)[0] for p in prompts}) > 20          # drawn, not the same few
    assert len({p.text.split("[a")[0] for p in prompts}) > 4         # several task forms


def test_a_run_cut_short_gives_the_first_prompts_of_the_whole_run():
    whole = document_prompts(ANSWERS, 12, seed=1, first_id=0, min_tokens=300, max_tokens=600)
    part = document_prompts(ANSWERS, 5, seed=1, first_id=0, min_tokens=300, max_tokens=600)
    rest = document_prompts(ANSWERS, 7, seed=1, first_id=5, min_tokens=300, max_tokens=600)
    assert part + rest == whole
    assert document_prompts(ANSWERS, 5, seed=2, first_id=0, min_tokens=300, max_tokens=600) != part


def test_evaluation_overlaps_are_drawn_again_and_impossible_windows_refused(tmp_path):
    first = document_prompts(ANSWERS, 1, seed=0, first_id=0)[0]
    (tmp_path / "leak.jsonl").write_text(json.dumps({"turns": [first.text]}) + "\n")
    again = document_prompts(ANSWERS, 1, seed=0, first_id=0, eval_index=EvalIndex.from_dir(tmp_path))[0]
    assert again.id == first.id and again.text != first.text
    with pytest.raises(ValueError, match="too short"):
        document_prompts(ANSWERS[:3], 1, min_tokens=350)
    with pytest.raises(RuntimeError, match="no document of 350-500 tokens"):   # one fits, two overflow
        document_prompts([(f"[a{i}] long", 300) for i in range(10)], 1, min_tokens=350, max_tokens=500)
    with pytest.raises(ValueError, match="no kept answers"):
        document_prompts([], 1)


def _id_shard(tokenizer, eos: int, answers: list[tuple[str, bool]]):
    """An id shard of conversations 'question' + answer (+ EOS where the answer ended)."""
    from app.train.token_store import IdShard

    convs, prompt_lens = [], []
    for text, ended in answers:
        prompt = tokenizer("a question", add_special_tokens=False)["input_ids"]
        response = tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos] if ended else [])
        convs.append(prompt + response)
        prompt_lens.append(len(prompt))
    return IdShard(tokens=np.array([t for c in convs for t in c], dtype=np.uint16),
                   lengths=np.array([len(c) for c in convs], dtype=np.uint32),
                   prompt_lens=np.array(prompt_lens, dtype=np.uint32), mode="greedy")


def _kept(embedded_target, ids_dir):
    """Shards 0-2 of kept ids: shard 1 is 'held out'; each has an ended long answer, an
    unended one and an ended short one."""
    tok = embedded_target.tokenizer
    eos = min(embedded_target.eos_ids)
    ids_dir.mkdir()
    for s in range(3):
        long = " ".join(f"shard{s} sentence {k} says something new." for k in range(12))
        _id_shard(tok, eos, [(long, True), (long + " cut", False), (f"shard{s} short.", True)]).save(
            ids_dir / f"shard_{s:05d}.npz")


def test_only_whole_long_answers_of_training_shards_are_documents(embedded_target, tmp_path):
    _kept(embedded_target, tmp_path / "ids")
    answers = kept_answers(tmp_path / "ids", embedded_target.tokenizer, embedded_target.eos_ids, exclude={1})
    assert [a[0].split()[0] for a in answers] == ["shard0", "shard2"]
    assert all(not a[0].endswith("cut") and a[1] >= MIN_ANSWER_TOKENS for a in answers)
    assert answers[0][1] == len(embedded_target.tokenizer(answers[0][0], add_special_tokens=False)["input_ids"])


def test_the_prompt_stage_appends_document_prompts_in_shards_of_their_own(embedded_target, tmp_path, monkeypatch):
    import app.train.cli as cli
    from app.train.prompts import load_prompts

    _kept(embedded_target, tmp_path / "ids")
    # the tiny kept set makes short documents: the window is the test's, the stage is real
    monkeypatch.setattr(cli, "document_prompts", functools.partial(document_prompts, min_tokens=60, max_tokens=400))
    args = argparse.Namespace(num_prompts=8, shard_size=8, document_prompts=3, device="cpu", data_dtype="float32",
                              base_model=None, seed=0, ids_dir=str(tmp_path / "ids"),
                              holdout=["shard_00001.safetensors"])
    cli.run_prompts(args, tmp_path)
    prompts = load_prompts(tmp_path / "prompts.jsonl")
    assert [p.category == CATEGORY for p in prompts] == [False] * 8 + [True] * 3
    assert [p.id for p in prompts] == [f"p{i:06d}" for i in range(11)]
    assert all("shard0" in p.text or "shard2" in p.text for p in prompts[8:])
    assert all("shard1" not in p.text for p in prompts[8:])               # held-out answers never used
    cli.run_prompts(args, tmp_path)                                       # done already: nothing added
    assert len(load_prompts(tmp_path / "prompts.jsonl")) == 11
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p.__dict__) + "\n" for p in prompts[:7]))
    with pytest.raises(SystemExit, match="7 prompts before them, not a multiple of --shard-size"):
        cli.run_prompts(argparse.Namespace(**{**vars(args), "num_prompts": 7}), tmp_path)
