"""Tests of the training pipeline (app/train): prompts, feature store, loss, resume.

All on the tiny random Llama of tests/tiny.py, except the prompt-overlap checks, which use
the real prompt generator and the real evaluation sets.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from app.engine.heads.eagle import DraftHead, head_config_for
from app.train.data import FeatureShard, generate_with_features
from app.train.eval_overlap import EvalIndex, eval_questions, ngrams, normalise
from app.train.prompts import Prompt, build_prompts
from app.train.loss import LossConfig, head_loss, ttt_mask
from app.train.trainer import FeatureDataset, TrainConfig, train, validate
from tests.scripts import load_script
from tests.tiny import tiny_target


# --- prompts ---------------------------------------------------------------------------------

def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def _assert_disjoint_from_eval(prompts):
    """Brute force, independent of EvalIndex: no exact match, no trigram Jaccard >= 0.5,
    and no eval question (of >= 4 trigrams) 80 % contained in a prompt."""
    questions = eval_questions()
    exact = {normalise(q) for q in questions}
    q_grams = [ngrams(q) for q in questions]
    for p in prompts:
        assert normalise(p.text) not in exact, p.text
        grams = ngrams(p.text)
        for q, qg in zip(questions, q_grams):
            assert _jaccard(grams, qg) < 0.5, (p.text, q)
            if len(qg) >= 4:
                assert len(grams & qg) / len(qg) < 0.8, (p.text, q)
    assert len({normalise(p.text) for p in prompts}) == len(prompts)


def test_prompt_set_is_disjoint_from_every_eval_set():
    prompts = build_prompts(600, seed=0)  # the shipped set is build_prompts(12288, 0): same prefix
    _assert_disjoint_from_eval(prompts)
    assert len({p.category for p in prompts}) == 8


def test_second_generation_appends_new_families_and_keeps_the_prefix():
    """Growing the set past the first generation appends (shards on disk keep their prompts);
    the second generation brings the role-play, extraction, STEM, humanities and reasoning
    families, with the same eval-disjointness guarantee."""
    small = build_prompts(150, seed=0, first_generation=100)
    big = build_prompts(700, seed=0, first_generation=100)
    assert big[:150] == small
    assert big[:100] == build_prompts(100, seed=0)           # the first generation is unchanged
    second = big[100:]
    cats = {p.category for p in second}
    assert {"roleplay", "extraction", "stem", "humanities", "reasoning"} <= cats
    assert not cats & {"chat", "explanation", "factual", "translation"}
    _assert_disjoint_from_eval(second)


def test_overlap_detector_catches_paraphrase_and_embedding():
    questions = eval_questions()
    index = EvalIndex(questions)
    q = next(q for q in questions if len(q.split()) > 15)
    words = q.split()
    words[len(words) // 2] = "zebra"                      # one word changed
    assert index.overlaps(" ".join(words))
    assert index.overlaps("Please help me with this. " + q)  # pasted into a longer prompt
    assert index.overlaps(q.upper())                       # exact after normalisation
    assert not index.overlaps("Write a limerick about a purple giraffe who loves sourdough bread.")


# --- feature store -------------------------------------------------------------------------

def _tiny_prompts(n: int, seed: int = 0) -> list[Prompt]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        words = torch.randint(3, 256, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g)
        out.append(Prompt(id=f"t{i}", category="chat", text=" ".join(f"w{int(w)}" for w in words)))
    return out


def _tiny_shard(target, shard: int, n: int = 6, new_tokens: int = 24) -> FeatureShard:
    return generate_with_features(target.model, target.tokenizer, _tiny_prompts(n, shard), shard, new_tokens,
                                  seed=0, eos_ids=target.eos_ids, pad_id=0)


def test_recorded_features_match_a_full_forward_and_round_trip(tmp_path):
    """Features recorded while decoding (left-padded batch, KV cache) equal those of one
    plain forward over each finished conversation; the shard file round-trips exactly."""
    target = tiny_target(seed=3)
    fs = _tiny_shard(target, shard=1)  # shard 1 decodes by sampling: varied lengths
    assert len(fs) == 6 and fs.mode.startswith("sampled")
    body = target.model.model
    for s in range(len(fs)):
        tokens, feats, prompt_len = fs.conversation(s)
        assert 2 <= prompt_len < tokens.numel()
        with torch.no_grad():
            ref = body(input_ids=tokens[None]).last_hidden_state[0]
        torch.testing.assert_close(feats, ref, atol=2e-2, rtol=2e-3)  # float16 storage
    path = tmp_path / "shard.safetensors"
    fs.save(path)
    back = FeatureShard.load(path)
    assert back.mode == fs.mode
    for name in ("tokens", "features", "offsets", "prompt_lens"):
        assert torch.equal(getattr(back, name), getattr(fs, name)), name


def test_data_stage_makes_only_the_chosen_shards_in_the_chosen_order(tmp_path, monkeypatch, capsys):
    """``--stage data --shards 1,3 --reverse``: shard files 3 then 1 appear, no others, each with
    its own prompts' answers; a rerun finds them done and makes nothing."""
    import argparse

    from app.engine import loading
    from app.train.cli import run_data
    from app.train.prompts import save_prompts

    target = tiny_target(seed=2)
    monkeypatch.setattr(loading, "load_target", lambda *a, **k: target)
    save_prompts(_tiny_prompts(12), tmp_path / "prompts.jsonl")   # 4 shards of 3
    args = argparse.Namespace(shard_size=3, shards="1,3", reverse=True, time_budget_min=None, base_model=None,
                              data_dtype="float32", max_new_tokens=6, seed=0)
    run_data(args, tmp_path)
    made = sorted(p.name for p in (tmp_path / "features").iterdir())
    assert made == ["shard_00001.safetensors", "shard_00003.safetensors"]
    out = capsys.readouterr().out
    assert out.index("data shard_00003") < out.index("data shard_00001")
    assert all(len(FeatureShard.load(tmp_path / "features" / m)) == 3 for m in made)
    run_data(args, tmp_path)
    assert "data shard_" not in capsys.readouterr().out


def test_batched_answers_equal_answers_decoded_alone_while_finished_rows_leave_the_batch(monkeypatch):
    """The data stage's batch (left padding, preallocated KV buffer, finished answers dropped
    from the batch) must not change any answer: greedy, each conversation equals decoding its
    prompt alone, token for token, with the same features. An EOS that the model emits at
    different steps for different prompts makes rows end apart, so rows are dropped mid-run."""
    from app.engine import kv

    target = tiny_target(seed=5)
    prompts = _tiny_prompts(8, seed=11)
    run = lambda ps, eos: generate_with_features(target.model, target.tokenizer, ps, 0, 24, seed=0,
                                                 eos_ids=eos, pad_id=0)
    free = run(prompts, set())                          # no EOS: every answer runs 23 tokens
    first = [free.conversation(s)[0][free.conversation(s)[2]:] for s in range(len(free))]
    # the token that most rows emit, at different steps, becomes the EOS
    counts = torch.bincount(torch.cat(first), minlength=target.model.config.vocab_size)
    eos = int(counts.argmax())
    ends = sorted({int((f == eos).nonzero()[0]) for f in first if (f == eos).any()})
    assert len(ends) >= 2, "the test needs answers that end at different steps"

    drops = []
    select = kv.PreallocatedLayer.batch_select_indices
    monkeypatch.setattr(kv.PreallocatedLayer, "batch_select_indices",
                        lambda self, idx: (drops.append(idx.numel()), select(self, idx))[1])
    batched = run(prompts, {eos})
    assert drops and min(drops) < len(prompts), "finished rows were never dropped from the batch"
    for s, p in enumerate(prompts):
        alone = run([p], {eos})
        tokens, feats, plen = batched.conversation(s)
        ref_tokens, ref_feats, ref_plen = alone.conversation(0)
        assert plen == ref_plen and torch.equal(tokens, ref_tokens), f"answer {s} differs"
        torch.testing.assert_close(feats, ref_feats, atol=2e-2, rtol=2e-3)  # float16 storage


def _dataset_of_lengths(tmp_path, lengths: list[int]) -> FeatureDataset:
    """A FeatureDataset of one shard whose conversations have these lengths (2-token prompts)."""
    offsets = torch.tensor([0] + lengths).cumsum(0)
    n = int(offsets[-1])
    shard = FeatureShard(tokens=torch.zeros(n, dtype=torch.int32), features=torch.zeros(n, 4, dtype=torch.float16),
                         offsets=offsets, prompt_lens=torch.full((len(lengths),), 2))
    shard.save(tmp_path / "shard_00000.safetensors")
    return FeatureDataset([tmp_path / "shard_00000.safetensors"])


def test_long_conversations_go_fewer_to_a_batch_and_short_ones_batch_by_tokens_alone(tmp_path, monkeypatch):
    from app.train import trainer
    g = torch.Generator().manual_seed(0)
    short = torch.randint(40, 700, (150,), generator=g).tolist()        # as the template conversations
    long_ = torch.randint(1000, 1400, (40,), generator=g).tolist()      # as the document tasks
    data = _dataset_of_lengths(tmp_path, short + long_)
    budget = 4096
    batches = data.batches(0, 0, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(data)))     # each conversation once
    for b in batches:
        longest = max(int(data.lengths[i]) for i in b)
        assert len(b) * longest <= budget
        assert len(b) * longest ** 2 <= budget * trainer.ATTENTION_LENGTH
    alone = [b for b in batches if max(int(data.lengths[i]) for i in b) > 1254]
    assert alone and all(len(b) == 1 for b in alone)                            # 2 x 1,255^2 > 4,096 x 768
    only_short = _dataset_of_lengths(tmp_path / "s", short)
    capped = only_short.batches(0, 0, budget)
    monkeypatch.setattr(trainer, "ATTENTION_LENGTH", 10 ** 9)                  # the token cap alone
    assert only_short.batches(0, 0, budget) == capped


# --- training ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    target = tiny_target(seed=0)
    folder = tmp_path_factory.mktemp("features")
    paths = []
    for shard in range(2):
        path = folder / f"shard_{shard:05d}.safetensors"
        _tiny_shard(target, shard, n=8, new_tokens=32).save(path)
        paths.append(path)
    return target, FeatureDataset(paths)


def _head(target, seed: int = 0) -> DraftHead:
    torch.manual_seed(seed)
    return DraftHead(head_config_for(target.model.config))


def test_ttt_mask_is_causal_for_one_step_and_follows_the_draft_path():
    assert torch.equal(ttt_mask(1, 4), torch.ones(4, 4, dtype=torch.bool).tril())
    m = ttt_mask(3, 4)                                       # (12, 12)
    q = 2 * 4 + 3                                            # step 3, position 3
    assert m[q, :4].tolist() == [True, True, False, False]   # committed keys 0..1
    assert m[q, 4:8].tolist() == [False, False, True, False] # step-2 ancestor at position 2
    assert m[q, 8:].tolist() == [False, False, False, True]  # itself


@pytest.mark.parametrize("ttt_steps", [1, 2])
def test_training_lowers_the_loss(tiny_data, tmp_path, ttt_steps):
    target, data = tiny_data
    head = _head(target)
    cfg = LossConfig(ttt_steps=ttt_steps, noise=0.0)
    batch = data.collate(list(range(len(data))))
    lm_head, emb = target.model.get_output_embeddings(), target.model.get_input_embeddings()
    with torch.no_grad():
        _, before = head_loss(head, lm_head, emb, batch, cfg, data.feature_std)
    train(head, target.model, data, tmp_path / "run", LossConfig(ttt_steps=ttt_steps),
          TrainConfig(epochs=25, batch_tokens=512, lr=3e-3, warmup_steps=5), progress=False)
    with torch.no_grad():
        _, after = head_loss(head, lm_head, emb, batch, cfg, data.feature_std)
    # CE to a soft p cannot fall below H(p) (high for a random model): compare reg and KL
    for s in range(1, ttt_steps + 1):
        assert after[f"reg{s}"] < 0.7 * before[f"reg{s}"], (s, before, after)
        assert after[f"kl{s}"] < 0.9 * before[f"kl{s}"], (s, before, after)
    assert after["loss"] < before["loss"]
    assert after["acc1"] > before["acc1"] + 0.2


def test_interrupted_training_resumes_where_it_left_off(tiny_data, tmp_path):
    """Stopping at step 5 and rerunning gives exactly the weights of one run of 10 steps."""
    target, data = tiny_data
    cfg = dict(epochs=2, batch_tokens=256, lr=3e-3, warmup_steps=2, checkpoint_every=100)
    loss_cfg = LossConfig(ttt_steps=2, noise=0.05)  # noise makes the generator state matter
    straight = _head(target)
    s1 = train(straight, target.model, data, tmp_path / "a", loss_cfg, TrainConfig(**cfg), progress=False)
    interrupted = _head(target)
    s2 = train(interrupted, target.model, data, tmp_path / "b", loss_cfg,
               TrainConfig(**cfg, stop_at_step=5), progress=False)
    assert s2["step"] == 5 < s1["step"]
    resumed = _head(target, seed=99)  # different init: everything must come from the checkpoint
    s3 = train(resumed, target.model, data, tmp_path / "b", loss_cfg, TrainConfig(**cfg), progress=False)
    assert s3["step"] == s1["step"]
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_training_measures_held_out_acceptance_keeps_the_best_head_and_stops_on_a_plateau(tiny_data, tmp_path):
    """--validate-every / --patience: every measurement is recorded, the head returned is the
    best one measured (its held-out acc1 is the best point's), and a run that stops improving
    ends after `patience` measurements without a new best."""
    from pathlib import Path

    from app.train.trainer import FeatureDataset, validate

    target, data = tiny_data
    held_out = FeatureDataset([Path(data.paths[1])])
    measure = lambda h: validate(h, target.model, held_out, steps=2)      # noqa: E731
    head = _head(target)
    state = train(head, target.model, data, tmp_path / "learns", LossConfig(ttt_steps=1),
                  TrainConfig(epochs=20, batch_tokens=512, lr=3e-3, warmup_steps=5, validate_every=5),
                  progress=False, validator=measure)
    points = state["validations"]
    assert [p["step"] for p in points] == list(range(5, state["step"] + 1, 5))
    best = state["best"]
    assert best["acc1"] == max(p["acc1"] for p in points) and best["acc1"] > points[0]["acc1"]
    assert measure(head)["acc1"] == pytest.approx(best["acc1"], abs=1e-4)
    # a learning rate that wrecks the head after its first steps: the best is an early one,
    # and it is the one returned
    wrecked = _head(target)
    state = train(wrecked, target.model, data, tmp_path / "wrecked", LossConfig(ttt_steps=1),
                  TrainConfig(epochs=10, batch_tokens=512, lr=0.3, warmup_steps=1, validate_every=2),
                  progress=False, validator=measure)
    assert state["validations"][-1]["acc1"] < state["best"]["acc1"]
    assert measure(wrecked)["acc1"] == pytest.approx(state["best"]["acc1"], abs=1e-4)
    # lr 0: nothing changes, so after the first measurement none is a new best
    still = train(_head(target), target.model, data, tmp_path / "flat", LossConfig(ttt_steps=1),
                  TrainConfig(epochs=20, batch_tokens=512, lr=0.0, warmup_steps=1, validate_every=2, patience=3),
                  progress=False, validator=measure)
    assert [p["step"] for p in still["validations"]] == [2, 4, 6, 8] and still["step"] == 8
    assert still["best"]["step"] == 2


def test_a_run_can_keep_the_head_whose_chains_accept_most_rather_than_the_best_at_depth_one():
    """--select chain: a head trained to draft deeper can give up a little depth-1 acceptance for
    much more at depths 2-3; judged by a chain's expected accepted drafts it is the better head."""
    from app.train.trainer import selection_score

    shallow = {"step": 1, "acc1": 0.71, "acc2": 0.60, "acc3": 0.40}    # chain: .71 + .426 + .1704
    deep = {"step": 2, "acc1": 0.70, "acc2": 0.68, "acc3": 0.64}       # chain: .70 + .476 + .3046
    assert selection_score(shallow) > selection_score(deep)                         # acc1, the default
    assert selection_score(deep, "chain") == pytest.approx(0.70 + 0.70 * 0.68 + 0.70 * 0.68 * 0.64)
    assert selection_score(deep, "chain") > selection_score(shallow, "chain")
    with pytest.raises(ValueError, match="select"):
        selection_score(deep, "acc2")


@pytest.mark.parametrize("select, kept_step", [("acc1", 3), ("chain", 6)])
def test_a_run_keeps_the_head_of_the_measurement_its_score_judges_best(tiny_data, tmp_path, select, kept_step):
    """The run's choice among its held-out measurements follows ``select``. The measurements
    here are given (step 3 the better depth 1, step 6 the better chain, step 9 worse than both),
    so the two scores disagree; the head kept is the one trained up to the chosen step."""
    import itertools

    from app.train.trainer import BEST_HEAD

    target, data = tiny_data
    given = itertools.cycle([{"acc1": 0.71, "acc2": 0.60, "acc3": 0.40}, {"acc1": 0.70, "acc2": 0.68, "acc3": 0.64},
                             {"acc1": 0.50, "acc2": 0.40, "acc3": 0.30}])
    heads = {}

    def validator(h):
        stats = next(given)
        heads[len(heads) * 3 + 3] = {k: v.clone() for k, v in h.state_dict().items()}
        return stats

    head = _head(target)
    state = train(head, target.model, data, tmp_path / select, LossConfig(ttt_steps=1),
                  TrainConfig(epochs=10, batch_tokens=512, lr=3e-3, warmup_steps=1, validate_every=3,
                              stop_at_step=9, select=select), progress=False, validator=validator)
    assert [p["step"] for p in state["validations"]] == [3, 6, 9] and state["best"]["step"] == kept_step
    kept = torch.load(tmp_path / select / BEST_HEAD, weights_only=True)
    for name, value in heads[kept_step].items():
        torch.testing.assert_close(kept[name], value, msg=name)
        torch.testing.assert_close(head.state_dict()[name], value, msg=name)     # and returned


def test_saved_head_reloads_strictly_with_identical_outputs(tiny_data, tmp_path):
    target, data = tiny_data
    head = _head(target, seed=4).eval()
    head.save(tmp_path / "head")
    back = DraftHead.load(tmp_path / "head")
    batch = data.collate([0, 1])
    emb = target.model.get_input_embeddings()(batch["tokens"][:, 1:])
    pos = torch.arange(emb.shape[1])[None].expand(2, -1)
    with torch.no_grad():
        a = target.model.lm_head(head(emb, batch["features"][:, :-1], pos, None))
        b = target.model.lm_head(back(emb, batch["features"][:, :-1], pos, None))
    assert torch.equal(a, b)
    assert not any(k.startswith("embed_tokens") for k in back.state_dict())


def test_eval_indices_parse_ranges_and_refuse_garbage():
    from app.train.options import parse_indices

    assert parse_indices("0-5,10, 20") == [0, 1, 2, 3, 4, 5, 10, 20]
    with pytest.raises(ValueError, match="bad index"):
        parse_indices("a-3")


def test_eval_stage_reports_every_set_at_a_temperature(tiny, monkeypatch, tmp_path):
    """``--stage eval``: one result per set (pooled tau, acceptance by depth), greedy or sampled,
    written as JSON. On the tiny model, with the real evaluation files."""
    import argparse
    import json

    from app.engine import loading
    from app.train.evaluate import eval_tree, run_eval

    target, head = tiny
    monkeypatch.setattr(loading, "load_target", lambda *a, **k: target)
    head.folder = tmp_path                                   # as load_draft_head sets it
    monkeypatch.setattr(loading, "load_draft_head", lambda *a, **k: head)
    out = tmp_path / "eval.json"
    args = argparse.Namespace(base_model=None, eval_set="mt_bench,gsm8k", eval_indices="0,2", eval_prompts=None,
                              eval_offset=0, eval_temperature=1.0, seed=3, eval_new_tokens=12, eval_out=str(out),
                              eval_tree="20/3/4")
    results = run_eval(args, tmp_path)
    assert list(results) == ["mt_bench", "gsm8k"] == list(json.loads(out.read_text()))
    for r in results.values():
        assert r["prompts"] == 2 and r["temperature"] == 1.0 and r["new_tokens"] == 22   # 2 x (12 - the prefill's)
        assert r["tau"] == r["new_tokens"] / r["target_forwards"] >= 1.0
        assert len(r["accepted_by_depth"]) == 3 and sum(r["accepted_length_counts"]) == r["target_forwards"]
        assert r["tree"] == "dynamic total_tokens=20 depth=3 top_k=4"
    with pytest.raises(ValueError, match="TOTAL_TOKENS/DEPTH/TOP_K"):
        eval_tree("60/5")


def test_eval_halves_pool_to_the_whole_set(tiny, tmp_path):
    """An eval split over two processes (``--eval-indices 0-39`` and ``40-79``) pools to the
    same tau and acceptance by depth as one run over all prompts."""
    from app.engine.config import SamplingConfig, TreeConfig
    from app.engine.engine import Engine
    from app.train.evaluate import measure_tau, pool

    target, head = tiny
    engine = Engine(target, head)
    tree = TreeConfig(method="dynamic", depth=3, top_k=4, total_tokens=12)
    prompts = [p.text for p in _tiny_prompts(3, seed=2)]           # words the tiny tokenizer knows
    seen = []
    whole = measure_tau(engine, prompts, tree, SamplingConfig(), 16, progress=lambda *a: seen.append(a))
    assert [s[:2] for s in seen] == [(1, 3), (2, 3), (3, 3)] and seen[-1][2] == pytest.approx(whole["tau"])
    parts = [measure_tau(engine, ps, tree, SamplingConfig(), 16) for ps in (prompts[:1], prompts[1:])]
    pooled = pool(parts[0]["per_prompt"] + parts[1]["per_prompt"], tree.depth)
    for key in ("tau", "accepted_by_depth", "accepted_length_counts", "new_tokens", "target_forwards"):
        assert pooled[key] == whole[key], key
    assert whole["tau"] > 1.0 and whole["new_tokens"] == 45     # 3 x (16 - the prefill's token)
    import json

    from app.train.evaluate import pool_files
    files = []
    for i, part in enumerate(parts):                     # as ``--eval-out`` writes them
        files.append(tmp_path / f"part{i}.json")
        files[-1].write_text(json.dumps({"mt_bench": {**part, "tree": "t", "temperature": 0.0, "max_new_tokens": 16}}))
    assert pool_files([str(f) for f in files])["mt_bench"]["tau"] == whole["tau"]


# --- the draft vocabulary in the loss ------------------------------------------------------

def test_subset_lm_head_loss_is_the_full_loss_restricted_to_the_draft_tokens(tiny_data):
    """With ``SubsetLMHead`` the distribution term compares p and q renormalised over the
    draft tokens: the same numbers as full-vocabulary logits sliced to those tokens."""
    from app.train.loss import SubsetLMHead

    target, data = tiny_data
    head = _head(target, seed=1)
    lm_head, emb = target.model.get_output_embeddings(), target.model.get_input_embeddings()
    ids = torch.arange(3, target.model.config.vocab_size, 3)                   # (Vd,) every third token
    batch = data.collate(list(range(4)))
    cfg = LossConfig(noise=0.0, kl_fraction=1.0, ttt_steps=2)
    with torch.no_grad():
        loss, stats = head_loss(head, SubsetLMHead(lm_head, ids), emb, batch, cfg, data.feature_std)
        sliced = lambda x: lm_head(x)[..., ids]                                # noqa: E731
        ref_loss, ref = head_loss(head, sliced, emb, batch, cfg, data.feature_std)
        _, full = head_loss(head, lm_head, emb, batch, cfg, data.feature_std)
    assert SubsetLMHead(lm_head, ids).weight.shape == (ids.numel(), lm_head.weight.shape[1])
    torch.testing.assert_close(loss, ref_loss)
    for key in ("kl1", "kl2", "acc1", "acc2", "reg1"):
        assert stats[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-5), key
    assert stats["kl1"] != pytest.approx(full["kl1"], rel=1e-3)   # the full vocabulary is another loss


def test_training_stage_trains_on_and_ships_a_draft_vocabulary_from_the_training_shards(tmp_path, monkeypatch):
    """``--loss-vocab draft``: the run builds the vocabulary from its training shards only
    (the held-out one excluded, EOS kept), trains over it, writes it beside the head where
    the engine loads it, and refuses to resume the checkpoint with another vocabulary."""
    import argparse
    import json

    from app.engine import loading
    from app.train.draft_vocab import build
    from app.train.stage import run_training

    target = tiny_target(seed=5)
    monkeypatch.setattr(loading, "load_target", lambda *a, **k: target)
    for shard in range(2):
        _tiny_shard(target, shard, n=6, new_tokens=24).save(tmp_path / "features" / f"shard_{shard:05d}.safetensors")
    args = argparse.Namespace(
        base_model=None, run_name="dv", holdout=["shard_00001.safetensors"], val_batches=1, seed=0,
        init_from=None, w_reg=1.0, w_kl=0.1, noise=0.05, ttt_steps=1, fp32_lm_head=False, kl_fraction=1.0,
        epochs=3, batch_tokens=256, lr=3e-3, weight_decay=0.0, warmup_steps=2, clip=0.5,
        checkpoint_every=100, train_minutes=None, loss_vocab="draft", draft_vocab_size=40)
    out = tmp_path / "head"
    state = run_training(args, tmp_path, out)
    assert state["step"] > 0
    shipped = json.loads((out / "draft_vocab.json").read_text())
    expected = build([tmp_path / "features" / "shard_00000.safetensors"], 40, always=tuple(sorted(target.eos_ids)))
    assert shipped["token_ids"] == expected["token_ids"] and len(shipped["token_ids"]) == 40
    assert set(target.eos_ids) <= set(shipped["token_ids"])
    vocab = loading.load_draft_vocab(out, target.model.config.vocab_size)
    assert vocab.tolist() == sorted(shipped["token_ids"])
    summary = json.loads((tmp_path / "runs" / "dv" / "summary.json").read_text())
    assert summary["loss_vocab"]["size"] == 40 and "acc1" in summary["validation"]

    (tmp_path / "runs" / "dv" / "draft_vocab.json").write_text(json.dumps({**shipped, "token_ids": list(range(40))}))
    with pytest.raises(ValueError, match="another draft vocabulary"):
        run_training(argparse.Namespace(**{**vars(args), "epochs": 6}), tmp_path, out)


def test_eval_stage_drafts_from_the_heads_draft_vocabulary_unless_told_not_to(tiny, monkeypatch, tmp_path):
    """A head folder's draft_vocab.json is what the eval drafts from (as the CLI and app do):
    a one-token vocabulary that the greedy answers never contain accepts nothing, tau = 1;
    ``--eval-full-draft-vocab`` ignores it and the trained head is accepted again."""
    import argparse
    import json

    from app.engine import loading
    from app.engine.config import SamplingConfig
    from app.engine.engine import Engine
    from app.train import evaluate
    from app.train.evaluate import eval_tree, run_eval

    target, head = tiny
    monkeypatch.setattr(loading, "load_target", lambda *a, **k: target)
    head.folder = tmp_path                                   # as load_draft_head sets it
    monkeypatch.setattr(loading, "load_draft_head", lambda *a, **k: head)
    prompts = [p.text for p in _tiny_prompts(3, seed=2)]           # words the tiny tokenizer knows
    monkeypatch.setattr(evaluate, "first_turns", lambda *a, **k: prompts)
    tree = eval_tree("20/3/4")
    written = set()
    for prompt in [prompts[i] for i in (0, 2)]:
        for event in Engine(target, head).generate(prompt, tree=tree, sampling=SamplingConfig(), max_new_tokens=12):
            if getattr(event, "type", None) != "summary":
                written.update(event.new_tokens)
    unused = next(t for t in range(3, target.model.config.vocab_size) if t not in written)
    (tmp_path / "draft_vocab.json").write_text(json.dumps({"token_ids": [unused]}))
    args = argparse.Namespace(base_model=None, eval_set="mt_bench", eval_indices="0,2", eval_prompts=None,
                              eval_offset=0, eval_temperature=0.0, seed=0, eval_new_tokens=12, eval_out=None,
                              eval_tree="20/3/4")
    narrowed = run_eval(args, tmp_path)["mt_bench"]
    assert narrowed["draft_vocab"] == 1 and narrowed["tau"] == 1.0
    full = run_eval(argparse.Namespace(**vars(args), eval_full_draft_vocab=True), tmp_path)["mt_bench"]
    assert full["draft_vocab"] is None and full["tau"] > 1.2
    assert full["new_tokens"] == narrowed["new_tokens"]        # lossless either way


def test_train_defaults_are_the_shipped_release_recipe():
    """`python -m app train` with no flags must train the way the shipped head was trained:
    every recipe flag of the model card's "Reproduce release 6" command equals its default."""
    import argparse
    import re
    import shlex
    from pathlib import Path

    from app.train.cli import add_arguments

    card = (Path(__file__).resolve().parents[1] / "models" / "eagle-smollm2-135m-instruct" / "README.md").read_text()
    section = card[card.index("Reproduce release 6"):]
    command = re.search(r"python -m app train --stage train(.*?)\n\s*python", section, re.S).group(1)
    words = shlex.split(command.replace("\\\n", " "))
    flags = dict(zip(words[::2], words[1::2]))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = parser.parse_args([])
    recipe = ["--ttt-steps", "--kl-fraction", "--loss-vocab", "--draft-vocab-size", "--batch-tokens", "--lr",
              "--warmup-steps", "--epochs", "--train-minutes"]
    assert set(recipe) <= flags.keys(), sorted(flags)
    defaults.ttt_steps = defaults.ttt_steps or 1      # None: 1 for eagle2 (the default arch), 3 for eagle3
    for flag in recipe:
        value = getattr(defaults, flag[2:].replace("-", "_"))
        assert type(value)(flags[flag]) == value, f"{flag}: card {flags[flag]}, default {value}"


def test_head_loss_reads_input_features_when_given(tiny_data):
    """EAGLE-3-style probes feed the head several target layers (``input_features``) while it
    still predicts the final feature: the loss must read them, and only them, as the input."""
    target, data = tiny_data
    lm_head, emb = target.model.get_output_embeddings(), target.model.get_input_embeddings()
    cfg = LossConfig(noise=0.0)
    batch = data.collate([0, 1, 2])
    head = _head(target)
    with torch.no_grad():
        plain, _ = head_loss(head, lm_head, emb, batch, cfg, data.feature_std)
        same, _ = head_loss(head, lm_head, emb, {**batch, "input_features": batch["features"]}, cfg, data.feature_std)
    assert torch.equal(plain, same)

    H = batch["features"].shape[-1]
    wide = _head(target)
    wide.fc = torch.nn.Linear(4 * H, H)                         # [emb; f; two more layers]
    extra = torch.randn(batch["features"].shape[:2] + (2 * H,), generator=torch.Generator().manual_seed(0))
    inputs = torch.cat([batch["features"], extra], -1)           # (B, T, 3H): fc reads [emb; inputs]
    with torch.no_grad():
        a, stats = head_loss(wide, lm_head, emb, {**batch, "input_features": inputs}, cfg, data.feature_std)
        b, _ = head_loss(wide, lm_head, emb, {**batch, "input_features": torch.cat([batch["features"], 2 * extra], -1)},
                         cfg, data.feature_std)
    assert torch.isfinite(a) and "acc1" in stats and not torch.equal(a, b)   # the extra layers are read
    with pytest.raises(ValueError, match="ttt_steps 1"):
        head_loss(wide, lm_head, emb, {**batch, "input_features": inputs}, LossConfig(ttt_steps=2), data.feature_std)


def test_eagle3_feature_probe_extracts_layers_and_trains_both_heads(tmp_path):
    """scripts/probe_eagle3_features.py end to end on the tiny Llama: the recorded layers are
    the target's own, and both heads train and report held-out depth-1 agreement."""
    import json

    probe = load_script("probe_eagle3_features")
    target = tiny_target(seed=0)
    target.model.save_pretrained(tmp_path / "target")
    target.tokenizer.save_pretrained(tmp_path / "target")
    (tmp_path / "work" / "features").mkdir(parents=True)
    for shard in range(2):
        _tiny_shard(target, shard, n=8, new_tokens=24).save(tmp_path / "work" / "features" / f"shard_{shard:05d}.safetensors")
    base = ["--base-model", str(tmp_path / "target")]
    probe.main(["extract", "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "p"), "--layers", "1", *base])

    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "p" / "shards" / "shard_00001.safetensors"))
    tokens = saved["tokens"][int(saved["offsets"][0]):int(saved["offsets"][1])].long()
    f, aux = probe.layer_features(target.model, tokens, [1])
    torch.testing.assert_close(saved["features"][:tokens.numel()].float(), f, atol=2e-2, rtol=2e-3)
    torch.testing.assert_close(saved["aux"][:tokens.numel()].float(), aux, atol=2e-2, rtol=2e-3)
    assert aux.shape == (tokens.numel(), 64) and torch.allclose(aux.pow(2).mean(-1), torch.ones(tokens.numel()), atol=1e-3)

    for variant in probe.VARIANTS:
        probe.main(["train", "--probe-dir", str(tmp_path / "p"), "--variant", variant, "--steps", "12",
                    "--batch-tokens", "256", "--full-vocab", *base])
        result = json.loads((tmp_path / "p" / f"result_{variant}.json").read_text())
        assert result["steps"] == 12 and 0.0 <= result["heldout_acc1"] <= 1.0 and result["heldout_tokens"] > 0
    ckpt = torch.load(tmp_path / "p" / "run_layers" / "checkpoint.pt", weights_only=False)
    assert ckpt["head"]["fc.weight"].shape == (64, 3 * 64)        # [emb; f; layer 1]


@contextlib.contextmanager
def _default_device(device: str):
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(None)


def test_every_tensor_of_data_and_training_is_made_where_it_is_meant_to_be(tiny_data, tmp_path):
    """The data and training stages say on which device every tensor is made (`--device cuda`
    must leave nothing on the host by mistake). Checked without a GPU: with torch's default
    device set to "meta" (a device with no data), a tensor made without naming its device lands
    there, and the first operation that mixes it with the model's CPU tensors fails. Under
    that setting the shard, the training steps (noise and resume state included) and the
    validation must come out exactly as with the default left alone."""
    target, data = tiny_data
    prompts = _tiny_prompts(4, seed=1)

    def shard():   # shard 1 samples: the generator matters
        return generate_with_features(target.model, target.tokenizer, prompts, 1, 16, seed=0,
                                      eos_ids=target.eos_ids, pad_id=0)

    plain_shard = shard()
    with _default_device("meta"):
        meta_shard = shard()
    assert torch.equal(plain_shard.tokens, meta_shard.tokens) and torch.equal(plain_shard.offsets, meta_shard.offsets)
    assert torch.equal(plain_shard.features, meta_shard.features) and meta_shard.features.device.type == "cpu"

    cfg = TrainConfig(epochs=1, batch_tokens=256, lr=3e-3, warmup_steps=2, stop_at_step=4)
    loss_cfg = LossConfig(ttt_steps=2, noise=0.05, kl_fraction=0.5)
    vocab = torch.arange(3, 200)
    plain, meta = _head(target), _head(target)
    train(plain, target.model, data, tmp_path / "plain", loss_cfg, cfg, progress=False, vocab_ids=vocab)
    with _default_device("meta"):
        train(meta, target.model, data, tmp_path / "meta", loss_cfg, cfg, progress=False, vocab_ids=vocab)
        val = validate(meta, target.model, data, steps=2, max_batches=2, vocab_ids=vocab)
    for (name, a), (_, b) in zip(plain.state_dict().items(), meta.state_dict().items()):
        assert b.device.type == "cpu" and torch.equal(a, b), name
    assert val == validate(plain, target.model, data, steps=2, max_batches=2, vocab_ids=vocab)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_train_refuses_a_missing_gpu_in_one_line(capsys):
    from app.__main__ import main as app_main

    assert app_main(["train", "--stage", "eval", "--device", "cuda"]) == 2
    assert capsys.readouterr().err.strip() == "error: device cuda was asked for but no CUDA GPU is available"
    assert app_main(["train", "--stage", "eval", "--device", "tpu"]) == 2


def test_bf16_is_used_for_data_and_loss_only_where_it_is_native(monkeypatch):
    """On a CPU without AMX / AVX512-BF16 torch emulates bf16 (4.5x slower than float32 on an
    AVX2 EPYC): the data stage's target and the loss's LM-head matmuls then stay float32."""
    from app.engine import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert not precision.bf16_is_native("cpu")
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert precision.bf16_is_native("cpu")


def test_validation_options_without_a_held_out_shard_are_refused_in_one_line(tmp_path, capsys):
    import argparse

    from app.train.cli import add_arguments, main

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    common = ["--stage", "train", "--work-dir", str(tmp_path)]
    assert main(parser.parse_args(common + ["--validate-every", "50"])) == 2
    assert "give --holdout" in capsys.readouterr().err
    assert main(parser.parse_args(common + ["--patience", "3", "--holdout", "shard_00002.safetensors"])) == 2
    assert "give --validate-every" in capsys.readouterr().err
