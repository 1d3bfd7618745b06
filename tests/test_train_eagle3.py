"""EAGLE-3 training (app/train/eagle3.py): the data stage's target-layer features, the
training-time-test mask, a training step that learns, exact resume, and the CLI from data to
a loadable head in the official layout. On the tiny 8-layer Llama of tests/tiny.py."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from app.train.data import FeatureShard, generate_with_features
from app.train.eagle3 import Eagle3Dataset, Eagle3LossConfig, eagle3_loss, new_head, ttt_step_mask
from app.train.loss import SubsetLMHead
from app.train.trainer import TrainConfig, train
from tests.scripts import load_script
from tests.test_train import _tiny_prompts
from tests.tiny import eagle3_target

LAYERS = (2, 4, 5)


def _shard(target, shard: int, n: int = 8, new_tokens: int = 32) -> FeatureShard:
    return generate_with_features(target.model, target.tokenizer, _tiny_prompts(n, shard), shard, new_tokens,
                                  seed=0, eos_ids=target.eos_ids, pad_id=0, layers=LAYERS)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    target = eagle3_target(0)
    folder = tmp_path_factory.mktemp("features3")
    paths = []
    for shard in range(2):
        paths.append(folder / f"shard_{shard:05d}.safetensors")
        _shard(target, shard).save(paths[-1])
    return target, Eagle3Dataset(paths)


def test_the_data_stage_stores_the_target_layers_of_every_token(tmp_path):
    """Layer inputs recorded while decoding (left-padded batch, KV cache) equal those of one
    plain forward over each finished conversation, and round-trip through the shard file."""
    target = eagle3_target(3)
    fs = _shard(target, 1, n=6, new_tokens=24)            # shard 1 samples: varied lengths
    back_path = tmp_path / "shard.safetensors"
    fs.save(back_path)
    back = FeatureShard.load(back_path)
    assert back.layers == LAYERS and torch.equal(back.layer_features, fs.layer_features)
    for s in range(len(back)):
        tokens, _, _ = back.conversation(s)
        with torch.no_grad():
            hs = target.model.model(input_ids=tokens[None], output_hidden_states=True).hidden_states
        ref = torch.cat([hs[i][0] for i in LAYERS], -1)    # (T, 3H)
        torch.testing.assert_close(back.layer_rows(s), ref, atol=2e-2, rtol=2e-3)   # float16 storage


def test_eagle2_shards_are_refused_for_eagle3_training(tmp_path):
    from tests.test_train import _tiny_shard

    path = tmp_path / "shard_00000.safetensors"
    _tiny_shard(eagle3_target(0), 0, n=2, new_tokens=6).save(path)
    with pytest.raises(ValueError, match="--arch eagle3"):
        Eagle3Dataset([path])


def test_an_eagle2_head_trains_on_eagle3_shards_without_their_layer_inputs(data):
    """The same shards serve both heads (a fair comparison trains them on the same data):
    EAGLE-2's dataset holds the same tokens and last-layer features, and leaves the layer
    inputs (3/4 of an EAGLE-3 shard) on disk."""
    from app.train.trainer import FeatureDataset

    _, e3 = data
    e2 = FeatureDataset(e3.paths)
    assert all(sh.layer_features is None for sh in e2.shards)
    assert all(sh.layer_features is not None for sh in e3.shards)
    for a, b in zip(e2.shards, e3.shards):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.features, b.features)
    batch = e2.collate(e2.batches(0, 0, 256)[0])
    assert "layer_features" not in batch and batch["features"].shape[-1] == e3.shards[0].features.shape[-1]


def test_ttt_step_mask_sees_the_committed_pairs_and_the_drafted_ancestors():
    assert torch.equal(ttt_step_mask(0, 4), torch.ones(4, 4, dtype=torch.bool).tril())
    m = ttt_step_mask(2, 4)                                  # (4, 12): step-0, step-1, step-2 keys
    assert m[2, :4].tolist() == [True, True, True, False]    # committed pairs at positions <= 2
    assert m[2, 4:8].tolist() == [False, False, True, False] # the depth-2 ancestor, same j
    assert m[2, 8:].tolist() == [False, False, True, False]  # itself


def _fresh(target, data, seed=0):
    torch.manual_seed(seed)
    return new_head(target, torch.arange(3, 256), data.layers)


@pytest.mark.parametrize("fused", [False, True], ids=["eager", "fused"])
def test_each_step_is_scored_against_the_targets_p_of_the_token_it_drafts(data, fused):
    """Step s at position j drafts x[j+2+s]: its soft target is p at row j+s (the target's
    distribution after x[j+1+s]), for response positions whose row exists (the last one is
    the target's distribution after the final token). The loss computes p on those rows
    only; this spells the rule out position by position."""
    from app.train.eagle3 import ttt_forward

    target, ds = data
    head = _fresh(target, ds, seed=1)
    batch = ds.collate(list(range(len(ds))))
    lm = SubsetLMHead(target.model.lm_head, head.draft_token_ids())
    emb = target.model.get_input_embeddings()
    steps = 3
    with torch.no_grad():
        _, stats = eagle3_loss(head, lm, emb, batch, Eagle3LossConfig(ttt_steps=steps, fused=fused))
        tokens, f = batch["tokens"], batch["features"]
        states = list(ttt_forward(head, emb(tokens[:, 1:]), batch["layer_features"][:, :-1], steps))
        B, L = tokens.shape[0], tokens.shape[1] - 1
        for s in range(steps):
            ces, hits = [], []
            for b in range(B):
                for j in range(L):
                    if j + 1 + s < int(batch["lengths"][b]) and j >= int(batch["prompt_lens"][b]) - 1:
                        p = torch.softmax(lm(f[b, 1 + j + s]).float(), -1)           # p of x[j+2+s]
                        logq = torch.log_softmax(head.logits(states[s][b, j]).float(), -1)
                        ces.append(-(p * logq).sum())
                        hits.append(float(logq.argmax() == p.argmax()))
            assert stats[f"ce{s + 1}"] == pytest.approx(float(torch.stack(ces).mean()), rel=1e-4), s
            assert stats[f"acc{s + 1}"] == pytest.approx(sum(hits) / len(hits), abs=1e-6), s


def test_the_fused_loss_gives_the_eager_loss_gradients(data):
    """The loss compiled by inductor (fused_ce.py) back-propagates what the eager one does:
    the same gradient on every parameter of the head, over a batch of varied lengths."""
    target, ds = data
    batch = ds.collate(list(range(len(ds))))
    grads = {}
    for fused in (False, True):
        head = _fresh(target, ds, seed=2)
        lm = SubsetLMHead(target.model.lm_head, head.draft_token_ids())
        loss, _ = eagle3_loss(head, lm, target.model.get_input_embeddings(), batch,
                              Eagle3LossConfig(ttt_steps=3, fused=fused))
        loss.backward()
        grads[fused] = {n: p.grad for n, p in head.named_parameters() if p.grad is not None}
    assert grads[True].keys() == grads[False].keys() and len(grads[True]) > 5
    for name, g in grads[False].items():
        torch.testing.assert_close(grads[True][name], g, atol=1e-6, rtol=1e-4, msg=name)


def test_training_lowers_the_token_loss_at_every_depth(data, tmp_path):
    target, ds = data
    head = _fresh(target, ds)
    cfg = Eagle3LossConfig(ttt_steps=3)
    batch = ds.collate(list(range(len(ds))))
    lm = SubsetLMHead(target.model.lm_head, head.draft_token_ids())
    emb = target.model.get_input_embeddings()
    with torch.no_grad():
        _, before = eagle3_loss(head, lm, emb, batch, cfg)
    state = train(head, target.model, ds, tmp_path / "run", cfg, TrainConfig(epochs=20, batch_tokens=512, lr=3e-3,
                  warmup_steps=5), progress=False, vocab_ids=head.draft_token_ids(), loss_fn=eagle3_loss)
    with torch.no_grad():
        _, after = eagle3_loss(head, lm, emb, batch, cfg)
    assert state["step"] > 20 and after["loss"] < before["loss"]
    for d in (1, 2, 3):                                       # depth 3 reads two of its own states
        assert after[f"ce{d}"] < before[f"ce{d}"] - 0.05, (d, before, after)
        assert after[f"acc{d}"] > before[f"acc{d}"] + 0.2, (d, before, after)


def test_interrupted_training_resumes_exactly(data, tmp_path):
    """Stopping at step 4 and rerunning gives exactly the weights of one uninterrupted run."""
    target, ds = data
    cfg = dict(epochs=2, batch_tokens=256, lr=3e-3, warmup_steps=2, checkpoint_every=100)
    loss_cfg = Eagle3LossConfig(ttt_steps=3)
    ids = torch.arange(3, 256)
    straight = _fresh(target, ds)
    s1 = train(straight, target.model, ds, tmp_path / "a", loss_cfg, TrainConfig(**cfg), progress=False,
               vocab_ids=ids, loss_fn=eagle3_loss)
    s2 = train(_fresh(target, ds), target.model, ds, tmp_path / "b", loss_cfg, TrainConfig(**cfg, stop_at_step=4),
               progress=False, vocab_ids=ids, loss_fn=eagle3_loss)
    assert s2["step"] == 4 < s1["step"]
    resumed = _fresh(target, ds, seed=99)                    # other init: all must come from the checkpoint
    s3 = train(resumed, target.model, ds, tmp_path / "b", loss_cfg, TrainConfig(**cfg), progress=False,
               vocab_ids=ids, loss_fn=eagle3_loss)
    assert s3["step"] == s1["step"]
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_the_cli_trains_an_eagle3_head_from_data_to_eval(tmp_path, monkeypatch, capsys):
    """``python -m app train --arch eagle3``: the data stage stores layers 2, L/2, L-3, training
    builds the draft vocabulary from the training shards, saves the head in the official
    layout outside the shipped EAGLE-2 folder, and the eval stage decodes with it."""
    from app.engine import loading
    from app.engine.loading import DEFAULT_HEAD_DIR
    from app.train.cli import add_arguments, main
    from app.train.prompts import save_prompts

    target = eagle3_target(5)
    monkeypatch.setattr(loading, "load_target", lambda *a, **k: target)
    save_prompts(_tiny_prompts(12), tmp_path / "prompts.jsonl")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    common = ["--arch", "eagle3", "--work-dir", str(tmp_path), "--num-prompts", "12", "--ids-dir", str(tmp_path / "ids")]
    assert main(parser.parse_args(common + ["--stage", "data", "--shard-size", "6", "--data-dtype", "float32",
                                            "--max-new-tokens", "20"])) == 0
    assert FeatureShard.load(tmp_path / "features" / "shard_00001.safetensors").layers == LAYERS
    said = capsys.readouterr().out       # the disk it will take, said before the first shard
    assert "data: 2 shards to write, about" in said and "every answer at --max-new-tokens" in said
    main(parser.parse_args(common + ["--stage", "data", "--shard-size", "6"]))
    assert "data: all shards are written (2 in" in capsys.readouterr().out
    assert main(parser.parse_args(common + ["--stage", "train", "--epochs", "4", "--batch-tokens", "256",
                                            "--train-minutes", "0", "--draft-vocab-size", "40", "--warmup-steps", "2",
                                            "--holdout", "shard_00001.safetensors", "--val-batches", "1",
                                            "--validate-every", "4", "--head-dtype", "bfloat16"])) == 0
    out = tmp_path / "head-eagle3"
    assert out != DEFAULT_HEAD_DIR and (out / "model.safetensors").is_file()
    head = loading.load_draft_head(str(out), target)
    vocab = json.loads((tmp_path / "runs" / "main" / "draft_vocab.json").read_text())
    assert head.kind == "eagle3" and head.draft_token_ids().tolist() == vocab["token_ids"]
    summary = json.loads((tmp_path / "runs" / "main" / "summary.json").read_text())
    assert summary["arch"] == "eagle3" and summary["loss_config"]["ttt_steps"] == 3
    assert summary["target_layers"] == list(LAYERS) and "acc3" in summary["validation"]
    # the learning-curve script rebuilds the head from the final checkpoint and measures what training did
    curve = _learning_curve_script()
    saved = torch.load(tmp_path / "runs" / "main" / "checkpoint.pt", map_location="cpu", weights_only=False)
    point = curve.measure(saved, target, [tmp_path / "features" / "shard_00001.safetensors"], 5, 1)
    assert point == pytest.approx({k: summary["validation"][k] for k in point}, abs=1e-5)
    # a continued head keeps the vocabulary its LM-head rows belong to, whatever this run would build
    assert main(parser.parse_args(common + ["--stage", "train", "--epochs", "1", "--batch-tokens", "256",
                                            "--train-minutes", "0", "--draft-vocab-size", "30", "--run-name", "more",
                                            "--init-from", str(out), "--out", str(tmp_path / "head-more"),
                                            "--holdout", "shard_00001.safetensors", "--val-batches", "1",
                                            "--validate-every", "1"])) == 0
    more = json.loads((tmp_path / "runs" / "more" / "summary.json").read_text())["state"]
    assert [p["step"] for p in more["validations"]] == list(range(1, more["step"] + 1))
    assert more["best"]["acc1"] == max(p["acc1"] for p in more["validations"]) and "acc5" in more["best"]
    kept = json.loads((tmp_path / "runs" / "more" / "draft_vocab.json").read_text())
    assert kept["token_ids"] == vocab["token_ids"] and str(out) in kept["source"]
    assert loading.load_draft_head(str(tmp_path / "head-more"), target).draft_token_ids().tolist() == vocab["token_ids"]
    # the learning curve goes on across runs: the continued head's training.json starts with the first's points
    first = json.loads((out / "training.json").read_text())
    second = json.loads((tmp_path / "head-more" / "training.json").read_text())
    assert first["runs"] == 1 and first["curve"] and second["runs"] == 2
    assert second["curve"][:len(first["curve"])] == first["curve"]
    seen = [p["tokens_seen"] for p in second["curve"]]
    assert seen == sorted(seen) and seen[-1] > seen[len(first["curve"]) - 1] and second["curve"][-1]["run"] == 2
    assert all(p["held_out"] == ["shard_00001"] for p in second["curve"][len(first["curve"]):])  # what each measured
    from safetensors import safe_open
    with safe_open(str(out / "model.safetensors"), "pt") as f:      # --head-dtype bfloat16; d2t stays integer
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16 and f.get_tensor("d2t").dtype == torch.long
    assert main(parser.parse_args(common + ["--stage", "eval", "--eval-indices", "0", "--eval-new-tokens", "8",
                                            "--eval-tree", "10/3/2", "--eval-out", str(tmp_path / "e.json")])) == 0
    result = json.loads((tmp_path / "e.json").read_text())["mt_bench"]
    assert result["prompts"] == 1 and result["draft_vocab"] == 40


def _learning_curve_script():
    return load_script("learning_curve")


def test_a_warm_start_copies_the_eagle2_tensors_whose_shapes_agree(data, tmp_path):
    """``--warm-start``: the EAGLE-1/2 head's MLP, o_proj and post-attention norm land in the
    EAGLE-3 midlayer; everything else keeps its initialisation (q/k/v read 2H here)."""
    from app.engine.heads.eagle import DraftHead, head_config_for
    from app.train.eagle3 import warm_start

    target, ds = data
    torch.manual_seed(1)
    eagle2 = DraftHead(head_config_for(target.model.config))
    eagle2.save(tmp_path / "e2")
    head = new_head(target, torch.arange(50), ds.layers)
    q_before = head.midlayer.self_attn.q_proj.weight.clone()
    copied = warm_start(head, tmp_path / "e2")
    assert copied == sorted(["midlayer.mlp.down_proj.weight", "midlayer.mlp.gate_proj.weight",
                             "midlayer.mlp.up_proj.weight", "midlayer.post_attention_layernorm.weight",
                             "midlayer.self_attn.o_proj.weight"])
    e2 = eagle2.state_dict()
    for name in copied:
        assert torch.equal(head.state_dict()[name], e2["layers.0." + name[len("midlayer."):]]), name
    assert torch.equal(head.midlayer.self_attn.q_proj.weight, q_before)


def test_a_new_head_starts_from_the_targets_output_end(data):
    """norm and lm_head start as the target's final norm and its LM-head rows of the draft tokens."""
    target, ds = data
    ids = torch.tensor([5, 3, 200, 17])
    head = new_head(target, ids, ds.layers)
    assert torch.equal(head.lm_head.weight, target.model.lm_head.weight[ids])
    assert torch.equal(head.norm.weight, target.model.model.norm.weight)


def test_without_a_compiler_the_fused_loss_runs_eagerly_and_says_so(tmp_path):
    """A machine without a C++ compiler (a Space image without gcc) still trains: inductor's
    build fails, the loss runs eagerly with the same values, and one line says why."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import torch\n"
        "from app.train.fused_ce import fused_soft_ce_and_agreement, soft_ce_and_agreement\n"
        "torch.manual_seed(0)\n"
        "q = torch.randn(7, 33); p = torch.softmax(torch.randn(9, 33), -1)\n"
        "rows = torch.randint(0, 9, (7,)); top = p.argmax(-1)\n"
        "a = fused_soft_ce_and_agreement(q, p, rows, top); b = soft_ce_and_agreement(q, p, rows, top)\n"
        "print(float(a[0]) == float(b[0]) and float(a[1]) == float(b[1]))\n")
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
    assert "the fused loss could not be compiled" in out.stderr and "running it eagerly" in out.stderr
