"""The training CLI's options: its flags (``add_arguments``), and ``complete``, which gives a
namespace built by hand (a test, a script) every option it leaves out at the flag's default,
so the stages read ``args.device`` instead of guessing a fallback at each use."""
from __future__ import annotations

import argparse
import functools

STAGES = ("prompts", "data", "ids", "train", "eval", "all")


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
    p.add_argument("--magpie-prompts", type=int, default=0,
                   help="stage prompts: also this many user turns written by the target itself (Magpie: fed the "
                        "chat template up to a user turn, it samples one; app/train/magpie.py), after the "
                        "--num-prompts template prompts, in shards of their own")
    p.add_argument("--document-prompts", type=int, default=0,
                   help="stage prompts: also this many tasks (summarise, list the main points, ...) over "
                        "documents of 350-1,100 tokens made of the kept answers (app/train/documents.py; "
                        "the --holdout shards' answers left out), after the other prompts, in shards of their own")
    p.add_argument("--data-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="dtype of the target while answering (features are stored as float16); auto: bfloat16 "
                        "on a GPU or a CPU with native bf16 (AMX / AVX512-BF16), else float32 (emulated bf16 "
                        "is several times slower)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="response length cap")
    p.add_argument("--reverse", action="store_true",
                   help="take shards from the last one down: a second data worker next to a forward one")
    p.add_argument("--shards", default=None,
                   help="only these shards, e.g. 128-191 (ranges and commas as in --eval-indices): the data stage "
                        "answers these, a new training run trains on these (and --holdout) only; or, for the data "
                        "stage, 'kept': the shards whose token ids are kept (recompute their features, answer no "
                        "new prompt); default: all")
    p.add_argument("--ids-dir", default=None,
                   help="where the data's token ids are kept (app/train/token_store.py): the data stage "
                        "recomputes the features of every id shard found there before it answers new prompts, "
                        "and writes the ids of each shard it answers; stage 'ids' exports the ids of the "
                        "feature shards already written. Default: models/eagle3-smollm2-135m-instruct/data "
                        "for --arch eagle3 on the embedded model (kept in git), else <work-dir>/ids")
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
                        "see --data-dtype auto; float32 elsewhere); --arch eagle3 autocasts the whole head")
    p.add_argument("--eager-loss", action="store_true",
                   help="--arch eagle3: run the per-depth soft cross-entropy eagerly instead of compiled by "
                        "inductor (app/train/fused_ce.py; same values, ~20 s to compile once, faster steps)")
    p.add_argument("--train-minutes", type=float, default=100.0,
                   help="training-time budget of the run (summed over resumes); the LR schedule follows it; "
                        "0 = no budget, --epochs alone ends the run")
    p.add_argument("--holdout", nargs="*", default=[],
                   help="feature shard file names kept out of training, for held-out acceptance by depth")
    p.add_argument("--val-batches", type=int, default=None,
                   help="held-out batches (of 2048 tokens) for validation; default all")
    p.add_argument("--validate-every", type=int, default=0,
                   help="optimiser steps between held-out measurements during training (needs --holdout; "
                        "0 = none): each is logged and kept in the run's summary, and the head saved at the "
                        "end is the best one measured")
    p.add_argument("--patience", type=int, default=0,
                   help="stop training once this many held-out measurements in a row bring no new best "
                        "(--select, +0.002); 0 = train to --train-minutes / --epochs")
    p.add_argument("--select", choices=("acc1", "chain"), default="acc1",
                   help="what makes a held-out measurement the best, whose head is kept: depth-1 acceptance, "
                        "or a top-1 chain's expected accepted drafts over the measured depths (for a head "
                        "trained deeper, e.g. --ttt-steps 5)")
    p.add_argument("--checkpoint-every", type=int, default=100, help="optimiser steps between checkpoints")
    p.add_argument("--run-name", default="main", help="checkpoint folder name under <work-dir>/runs")
    p.add_argument("--init-from", default=None, help="start training from this head folder (a fresh optimiser "
                                                      "with --warmup-steps of warm-up; --arch eagle3 carries its "
                                                      "training.json learning curve on)")
    p.add_argument("--warm-start", default=None,
                   help="--arch eagle3 without --init-from: copy into the new head every tensor of this EAGLE-1/2 "
                        "head whose shape agrees (the decoder layer's MLP, o_proj, post-attention norm); "
                        "'eagle2' = the shipped EAGLE-2 head")
    p.add_argument("--head-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the saved head's weights (bfloat16 halves a head kept in git)")
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


@functools.cache
def _defaults() -> dict:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return vars(p.parse_args([]))


def check(args: argparse.Namespace) -> None:
    """Refuse option combinations no stage can honour (ValueError, said in one line)."""
    if (args.validate_every or args.patience) and not args.holdout:
        raise ValueError("--validate-every and --patience measure held-out acceptance: give --holdout SHARD ...")
    if args.patience and not args.validate_every:
        raise ValueError("--patience counts held-out measurements: give --validate-every STEPS too")


def complete(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with every option it lacks set to the command line's default."""
    return argparse.Namespace(**{**_defaults(), **vars(args)})


def parse_indices(spec: str) -> list[int]:
    """"0-5,10,20" -> [0, 1, 2, 3, 4, 5, 10, 20]."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"bad index range {part!r}: use e.g. 0-5,10,20")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out
