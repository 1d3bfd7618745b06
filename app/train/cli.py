"""`python -m app train`: prompts -> self-distilled responses + features -> head -> tau.

Every stage is resumable: the data stage skips shards that already exist (and, with lock
files, shares the work between several workers), training resumes from its last
checkpoint. ``--stage data`` writes one shard of 64 answered prompts with their features at
a time, so whatever has finished when the run is stopped is usable for training.

Examples::

    python -m app train --stage data --time-budget-min 40      # as much data as fits in 40 min
    python -m app train --stage train --epochs 3 --ttt-steps 2 # train on all finished shards
    python -m app train --stage eval --eval-prompts 10         # tau on mt_bench first turns
    python -m app train                                        # everything, with the defaults
    python -m app train --device cuda --shard-size 256         # on a GPU: bigger answer batches
    python -m app train --arch eagle3 --work-dir W             # an EAGLE-3 head (app/train/eagle3.py)

The defaults are release 6's recipe (models/eagle-smollm2-135m-instruct/README.md): 12,288
prompts, TTT-1, the loss's distributions over the 8,192-token draft vocabulary with the
soft cross-entropy on half the positions, lr 2e-3, 4,096-token batches, 100 training minutes.
The release also held out one shard (``--holdout shard_00002.safetensors``) to report
acceptance by depth.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from filelock import FileLock, Timeout

STAGES = ("prompts", "data", "train", "eval", "all")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--medusa-heads", type=int, default=3, help="--arch medusa: number of heads (offsets 2..k+1)")
    p.add_argument("--medusa-layers", type=int, default=1, help="--arch medusa: residual blocks per head")
    p.add_argument("--stage", choices=STAGES, default="all",
                   help="one stage ('data' = responses + features, shard by shard) or 'all' (default)")
    p.add_argument("--base-model", default=None, help="target: hub id or folder (default: the embedded model)")
    p.add_argument("--work-dir", default=None,
                   help="where prompts, responses, features and checkpoints go (default: cache_dir()/train/<model>)")
    p.add_argument("--out", default=None, help="folder for the trained head (default: models/eagle-<model> for "
                                                 "the embedded model, else <work-dir>/head)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1 is fastest on a shared 2-core machine: idle OpenMP threads spin)")
    p.add_argument("--device", default="cpu",
                   help="cpu (default) | cuda[:N] | auto: where the target answers (data), the head trains and the "
                        "eval decodes. Shards and checkpoints are the same files either way")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", choices=["eagle2", "eagle3", "medusa"], default="eagle2",
                   help="medusa: Medusa heads on the features (app/train/medusa.py; stage eval is EAGLE's only); "
                        "eagle2 (default): the head reads the last hidden state and regresses it; eagle3: "
                        "it reads target layers 2, L/2, L-3 (the data stage stores them: use a work dir of "
                        "its own), trains with training-time test and a token loss, and ships its own draft "
                        "vocabulary (default --out <work-dir>/head-eagle3)")
    # data
    p.add_argument("--num-prompts", type=int, default=12288, help="size of the prompt set")
    p.add_argument("--shard-size", type=int, default=64, help="prompts per shard = generation batch")
    p.add_argument("--data-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="dtype of the target while answering (features are stored as float16); auto: bfloat16 "
                        "on a GPU or a CPU with native bf16 (AMX / AVX512-BF16), else float32 (emulated bf16 "
                        "is several times slower)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="response length cap")
    p.add_argument("--reverse", action="store_true",
                   help="take shards from the last one down: a second data worker next to a forward one")
    p.add_argument("--shards", default=None,
                   help="only these shards, e.g. 128-191 (ranges and commas as in --eval-indices); default: all")
    p.add_argument("--time-budget-min", type=float, default=None,
                   help="data stages start no new shard after this many minutes")
    # training
    p.add_argument("--epochs", type=float, default=30.0,
                   help="passes over the finished shards, at most (--train-minutes usually ends the run first)")
    p.add_argument("--batch-tokens", type=int, default=4096,
                   help="padded tokens per optimiser step (the (N, vocab) loss tensors bound memory)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--clip", type=float, default=0.5, help="gradient norm clip")
    p.add_argument("--w-reg", type=float, default=1.0, help="weight of the smooth-L1 feature loss")
    p.add_argument("--w-kl", type=float, default=0.1, help="weight of the soft cross-entropy to p")
    p.add_argument("--noise", type=float, default=0.05, help="input-feature noise, as a fraction of feature std")
    p.add_argument("--ttt-steps", type=int, default=None,
                   help="training-time-test unroll: 1 = plain EAGLE-1, k = also train on k-1 own predictions "
                        "(default: 1 for eagle2, 3 for eagle3)")
    p.add_argument("--kl-fraction", type=float, default=0.5,
                   help="share of positions (random) that get the soft cross-entropy; the rest only regression")
    p.add_argument("--loss-vocab", choices=["draft", "full"], default="draft",
                   help="'draft' (default): the loss's distributions, and the head's draft_vocab.json, over the "
                        "--draft-vocab-size most frequent response tokens (the engine drafts only from those; "
                        "each step ~2x faster for SmolLM2); 'full': the whole vocabulary")
    p.add_argument("--draft-vocab-size", type=int, default=8192, help="tokens in the draft vocabulary")
    p.add_argument("--fp32-lm-head", action="store_true",
                   help="LM-head matmuls of the loss in float32 (default: bf16 autocast where bf16 is native, "
                        "see --data-dtype auto; float32 elsewhere)")
    p.add_argument("--train-minutes", type=float, default=100.0,
                   help="training-time budget of the run (summed over resumes); the LR schedule follows it; "
                        "0 = no budget, --epochs alone ends the run")
    p.add_argument("--holdout", nargs="*", default=[],
                   help="feature shard file names kept out of training, for held-out acceptance by depth")
    p.add_argument("--val-batches", type=int, default=None,
                   help="held-out batches (of 2048 tokens) for validation; default all")
    p.add_argument("--checkpoint-every", type=int, default=100, help="optimiser steps between checkpoints")
    p.add_argument("--run-name", default="main", help="checkpoint folder name under <work-dir>/runs")
    p.add_argument("--init-from", default=None, help="start training from this head folder")
    # eval
    p.add_argument("--eval-prompts", type=int, default=10, help="number of first turns used by stage eval")
    p.add_argument("--eval-offset", type=int, default=0, help="first prompt index used by stage eval")
    p.add_argument("--eval-indices", default=None,
                   help="comma-separated first-turn indices, ranges allowed (e.g. 0-5,10,20): "
                        "instead of --eval-offset/--eval-prompts")
    p.add_argument("--eval-set", default="mt_bench", help="comma-separated sets from data/eval, or 'all'")
    p.add_argument("--eval-temperature", type=float, default=0.0, help="0 = greedy; sampled with --seed")
    p.add_argument("--eval-out", default=None, help="write the eval result as JSON here")
    p.add_argument("--eval-new-tokens", type=int, default=256)
    p.add_argument("--eval-full-draft-vocab", action="store_true",
                   help="draft from the whole vocabulary, ignoring the head's draft_vocab.json")
    p.add_argument("--eval-tree", default="60/5/10",
                   help="TOTAL_TOKENS/DEPTH/TOP_K of the dynamic tree (default: the papers' 60/5/10; the "
                        "reference code's depth=5 drafts 6 levels, which is 60/6/10 here)")


def default_work_dir(name: str) -> Path:
    from app.engine.loading import cache_dir

    return cache_dir() / "train" / name.replace("/", "--")


def main(args: argparse.Namespace) -> int:
    from app.engine.loading import DEFAULT_HEAD_DIR, DEFAULT_MEDUSA_DIR, EMBEDDED_ALIASES, EMBEDDED_NAME, choose_device

    try:   # before any stage: a run that would fail at its first model load fails now, in one line
        choose_device(args.device)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    name = EMBEDDED_NAME if args.base_model in EMBEDDED_ALIASES else args.base_model
    work = Path(args.work_dir) if args.work_dir else default_work_dir(name)
    if args.out:
        out = Path(args.out)
    elif getattr(args, "arch", "eagle2") == "eagle3":
        out = work / "head-eagle3"     # never over the shipped EAGLE-2 head
    elif args.arch == "medusa":
        out = DEFAULT_MEDUSA_DIR if args.base_model in EMBEDDED_ALIASES else work / "medusa"
    else:
        out = DEFAULT_HEAD_DIR if args.base_model in EMBEDDED_ALIASES else work / "head"
    work.mkdir(parents=True, exist_ok=True)
    stages = {"all": ["prompts", "data", "train", "eval"], "data": ["prompts", "data"]}.get(
        args.stage, [args.stage])
    for stage in stages:
        if stage == "prompts":
            run_prompts(args, work)
        elif stage == "data":
            run_data(args, work)
        elif stage == "train" and getattr(args, "arch", "eagle2") == "eagle3":
            from app.train.eagle3 import run_training as run_eagle3_training

            run_eagle3_training(args, work, out)
        elif stage == "train" and args.arch == "medusa":
            from app.train.medusa import run_medusa_training

            run_medusa_training(args, work, out)
        elif stage == "train":
            from app.train.trainer import run_training

            run_training(args, work, out)
        elif stage == "eval" and args.arch == "medusa":
            print("eval: stage eval measures EAGLE heads; for Medusa heads see training.json (held-out top-1 "
                  "by head) and `python -m app bench --methods vanilla,medusa`", file=sys.stderr)
        elif stage == "eval":
            from app.train.evaluate import run_eval

            run_eval(args, out)
    return 0


def run_prompts(args, work: Path) -> None:
    from app.train.data import log
    from app.train.prompts import build_prompts, load_prompts, save_prompts

    path = work / "prompts.jsonl"
    if path.is_file() and len(load_prompts(path)) >= args.num_prompts:
        log(f"prompts: {path} exists, kept")
        return
    prompts = build_prompts(args.num_prompts, seed=args.seed)
    save_prompts(prompts, path)
    log(f"prompts: wrote {len(prompts)} to {path}")


def run_data(args, work: Path) -> None:
    """Shard by shard: the target answers the prompts and its features are recorded (float32)."""
    from app.engine.loading import load_target
    from app.train.data import generate_with_features, log, shard_name
    from app.train.prompts import load_prompts

    prompts = load_prompts(work / "prompts.jsonl")
    n_shards = (len(prompts) + args.shard_size - 1) // args.shard_size
    start = time.perf_counter()
    target = None
    new_tokens = 0
    order = list(range(n_shards))
    if getattr(args, "shards", None):
        from app.train.evaluate import parse_indices
        wanted = set(parse_indices(args.shards))
        order = [s for s in order if s in wanted]
    if args.reverse:
        order.reverse()
    for shard in order:
        if args.time_budget_min is not None and time.perf_counter() - start > 60 * args.time_budget_min:
            log(f"data: time budget of {args.time_budget_min} min reached before shard {shard}; rerun to continue")
            break
        path = work / "features" / f"{shard_name(shard)}.safetensors"
        if path.is_file() or not claim(path):
            continue
        if target is None:
            dtype = args.data_dtype
            if dtype == "auto":
                from app.engine.precision import bf16_is_native

                dtype = "bfloat16" if bf16_is_native(getattr(args, "device", "cpu")) else "float32"
            target = load_target(args.base_model, device=getattr(args, "device", "cpu"), dtype=dtype)
            tok = target.tokenizer
            pad = tok.pad_token_id if tok.pad_token_id is not None else 0
            layers = ()
            if getattr(args, "arch", "eagle2") == "eagle3":     # also store EAGLE-3's low/mid/high layers
                from app.engine.eagle3_head import default_target_layers

                layers = default_target_layers(target.model.config.num_hidden_layers)
        t0 = time.perf_counter()
        batch = prompts[shard * args.shard_size:(shard + 1) * args.shard_size]
        fs = generate_with_features(target.model, tok, batch, shard, args.max_new_tokens, args.seed,
                                    target.eos_ids, pad, layers=layers)
        fs.save(path)
        release(path)
        n = int(fs.tokens.numel() - fs.prompt_lens.sum())
        new_tokens += n
        log(f"data {shard_name(shard)}: {len(fs)} answers ({fs.mode}), {n} response tokens, "
            f"{n / (time.perf_counter() - t0):.0f} tok/s")
    log(f"data: stopped after {(time.perf_counter() - start) / 60:.1f} min, {new_tokens} new response tokens")


_CLAIMS: dict[Path, FileLock] = {}   # the shards this process holds, by path


def claim(path: Path) -> bool:
    """Claim a shard for this process, so that several data workers can share the work: an OS
    lock on ``<shard>.lock`` (``filelock``), which the OS frees if the process dies, so a
    crashed worker leaves no stale claim. False when another worker holds it, or has just
    finished the shard."""
    if path in _CLAIMS:
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path.with_name(path.name + ".lock")))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    if path.is_file():               # finished by another worker between our check and the lock
        lock.release()
        return False
    _CLAIMS[path] = lock
    return True


def release(path: Path) -> None:
    lock = _CLAIMS.pop(path, None)
    if lock is not None:
        lock.release()
    path.with_name(path.name + ".lock").unlink(missing_ok=True)
