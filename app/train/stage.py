"""The *train* stage of ``python -m app train`` for an EAGLE-1/2 head: from the CLI's options
to the training library's calls (``trainer.train``, ``trainer.validate``), the run folder's
shard list and its draft vocabulary."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from app.engine import loading
from app.engine.heads.eagle import DraftHead, head_config_for
from app.engine.heads import DRAFT_VOCAB_FILE
from app.engine.precision import bf16_is_native
from app.train.data import log, shard_name
from app.train.draft_vocab import build
from app.train.options import complete, parse_indices
from app.train.loss import LossConfig
from app.train.trainer import FeatureDataset, TrainConfig, train, validate


def training_shards(args, work: Path) -> tuple[Path, list[Path], list[Path]]:
    """(run folder, training shards, held-out shards) of ``--run-name``. A resumed run keeps
    the shards it started with (listed in its shards.json), so new shards written meanwhile
    never change what it trains on."""
    run_dir = work / "runs" / args.run_name
    shards_file = run_dir / "shards.json"
    if shards_file.is_file():
        paths = [Path(p) for p in json.loads(shards_file.read_text())]
    else:
        paths = sorted((work / "features").glob("shard_*.safetensors"))
        if args.shards and args.shards != "kept":      # --shards: train on these shards only (and hold out --holdout)
            wanted = {shard_name(i) for i in parse_indices(args.shards)}
            paths = [p for p in paths if p.stem in wanted or p.name in set(args.holdout)]
        run_dir.mkdir(parents=True, exist_ok=True)
        shards_file.write_text(json.dumps([str(p) for p in paths], indent=1))
    holdout = [p for p in paths if p.name in set(args.holdout)]
    return run_dir, [p for p in paths if p not in holdout], holdout


def training_inputs(args, work: Path):
    """What every head's *train* stage starts from: the completed options, the float32 target,
    and the run folder with its training and held-out shards."""
    args = complete(args)
    target = loading.load_target(args.base_model, device=args.device, dtype="float32")
    run_dir, paths, holdout = training_shards(args, work)
    return args, target, run_dir, paths, holdout


def run_training(args, work: Path, out: Path) -> dict:
    """Stage *train* of the CLI: train on every finished feature shard, save the head to ``out``."""
    args, target, run_dir, paths, holdout = training_inputs(args, work)
    data = FeatureDataset(paths)
    log(f"train: {len(data)} conversations, {data.num_tokens} tokens in {len(paths)} shards, "
        f"feature std {data.feature_std:.3f}")
    torch.manual_seed(args.seed)  # the head's initial weights (nn.Linear's own initialisers)
    head = DraftHead.load(args.init_from) if args.init_from else DraftHead(head_config_for(target.model.config))
    loss_cfg = LossConfig(w_reg=args.w_reg, w_kl=args.w_kl, noise=args.noise, ttt_steps=args.ttt_steps or 1,
                          lm_head_bf16=not args.fp32_lm_head and bf16_is_native(args.device), kl_fraction=args.kl_fraction)
    cfg = train_config(args)
    vocab = loss_vocabulary(args, run_dir, paths, target)
    vocab_ids = None if vocab is None else torch.tensor(vocab["token_ids"], dtype=torch.long)
    validator = None
    if holdout and args.validate_every:
        held_out = FeatureDataset(holdout)
        validator = lambda h: validate(h, target.model, held_out, max_batches=args.val_batches,   # noqa: E731
                                       vocab_ids=vocab_ids)
    state = train(head, target.model, data, run_dir, loss_cfg, cfg, vocab_ids=vocab_ids, validator=validator)
    head.save(out, dtype=getattr(torch, args.head_dtype))
    if vocab is not None:  # the engine drafts from the vocabulary the head was trained on
        (out / DRAFT_VOCAB_FILE).write_text(json.dumps(vocab) + "\n")
    val = None
    if holdout:
        val = validate(head, target.model, FeatureDataset(holdout), max_batches=args.val_batches,
                       vocab_ids=vocab_ids)
        log("train: held-out " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(val.items())))
    (run_dir / "summary.json").write_text(json.dumps(
        {"state": state, "tokens": data.num_tokens, "conversations": len(data), "shards": len(paths),
         "holdout": [str(p) for p in holdout], "validation": val,
         "loss_vocab": None if vocab is None else {k: v for k, v in vocab.items() if k != "token_ids"},
         "loss_config": loss_cfg.__dict__, "train_config": cfg.__dict__}, indent=1))
    log(f"train: saved head to {out} after step {state['step']} ({state['seconds'] / 60:.1f} min)")
    return state


def train_config(args) -> TrainConfig:
    """The optimiser loop's settings from the command line (every head kind's)."""
    args = complete(args)
    return TrainConfig(epochs=args.epochs, batch_tokens=args.batch_tokens, lr=args.lr,
                       weight_decay=args.weight_decay, warmup_steps=args.warmup_steps, clip=args.clip,
                       seed=args.seed, checkpoint_every=args.checkpoint_every, max_minutes=args.train_minutes or None,
                       validate_every=args.validate_every, patience=args.patience,
                       select=args.select)


def loss_vocabulary(args, run_dir: Path, paths: list[Path], target) -> dict | None:
    """The draft vocabulary of a run (``--loss-vocab draft``): the ``--draft-vocab-size``
    most frequent response tokens of the training shards (held-out shards excluded) plus
    the target's end-of-sequence ids, built once and kept in the run folder so that a
    resumed run uses the same one. None (full vocabulary) for ``--loss-vocab full`` or when
    the target's vocabulary is no larger than the requested size."""
    if complete(args).loss_vocab != "draft":
        return None
    path = run_dir / "draft_vocab.json"
    if path.is_file():
        return json.loads(path.read_text())
    if args.draft_vocab_size >= target.model.config.vocab_size:
        return None
    vocab = build(paths, args.draft_vocab_size, always=tuple(sorted(target.eos_ids)))
    path.write_text(json.dumps(vocab) + "\n")
    log(f"train: draft vocabulary of {vocab['size']} tokens covers {vocab['coverage']:.4f} of "
        f"{vocab['response_tokens_counted']} response tokens")
    return vocab
