"""Held-out acceptance by depth of any draft head (EAGLE-1/2 or EAGLE-3) on feature shards.

The number training reports at its end (``--holdout``), for a head that was trained
elsewhere, e.g. the shipped one, so that heads trained on different data or for different
times are compared on the same held-out conversations:

    .venv/bin/python scripts/heldout_acceptance.py --shard W/features/shard_00002.safetensors \\
        models/eagle-smollm2-135m-instruct W/head-eagle2 W/head-eagle3

acc_d: the share of held-out response positions where the head, fed its own drafts for d-1
steps, puts the target's top token first (over its draft vocabulary) — on greedy answers,
a depth-d chain's acceptance given its ancestors were accepted.

``--suite NAME`` measures the same on an evaluation set's own greedy answers instead (its
first ``--limit`` first turns, answered here by the target, nothing written to disk): the
gap between a training shard and the suites is the part of acceptance that the training
prompts' variety, not the head's size or training time, decides.

    .venv/bin/python scripts/heldout_acceptance.py --suite all --limit 8 models/eagle3-smollm2-135m-instruct
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("heads", nargs="+", help="head folders")
    p.add_argument("--shard", action="append", default=[], help="held-out feature shard (repeatable)")
    p.add_argument("--suite", action="append", default=[],
                   help="an evaluation set of data/eval (repeatable, or 'all'): measure on its greedy answers")
    p.add_argument("--limit", type=int, default=8, help="--suite: first turns a set")
    p.add_argument("--max-new-tokens", type=int, default=128, help="--suite: answer length")
    p.add_argument("--depth", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    if not args.shard and not args.suite:
        p.error("give --shard (feature shards) or --suite (evaluation sets to answer here)")

    import torch

    from app.engine.loading import load_target

    torch.set_num_threads(args.threads)
    target = load_target(None, device="cpu", dtype="float32")
    with tempfile.TemporaryDirectory(prefix="suite-acceptance-") as tmp:   # the suites' answers, removed after
        data = {"held-out shards": [Path(s) for s in args.shard]} if args.shard else {}
        from app.train.evaluate import EVAL_SETS

        for name in (EVAL_SETS if "all" in args.suite else args.suite):
            data[name] = [suite_shard(target, name, args.limit, args.max_new_tokens, Path(tmp))]
        report(target, data, args.heads, args.depth)
    return 0


def report(target, data: dict[str, list[Path]], folders: list[str], depth: int) -> None:
    """One table row per (data, head): acc1..acc_depth."""
    from app.engine.heads import load_head
    from app.engine.loading import load_draft_vocab
    from app.train.evaluate import held_out_acceptance

    heads = [(folder, load_head(Path(folder), target.model.config.num_hidden_layers),
              load_draft_vocab(Path(folder), target.model.config.vocab_size))   # EAGLE-1/2's; EAGLE-3 has its own
             for folder in folders]
    print("| data | head | kind | " + " | ".join(f"acc{d}" for d in range(1, depth + 1)) + " |")
    print("|---|---|---|" + "---|" * depth)
    for label, shards in data.items():
        for folder, head, vocab in heads:
            stats = held_out_acceptance(head, target.model, shards, depth, vocab_ids=vocab)
            accs = " | ".join(f"{stats.get(f'acc{d}', float('nan')):.3f}" for d in range(1, depth + 1))
            print(f"| {label} | {folder} | {getattr(head, 'kind', 'eagle2')} | {accs} |", flush=True)


def suite_shard(target, name: str, limit: int, max_new_tokens: int, folder: Path) -> Path:
    """Answer the first ``limit`` first turns of evaluation set ``name`` greedily (shard 0's
    mode), with the target's features and EAGLE-3's layer inputs, into a shard file."""
    from app.engine.heads.eagle3 import default_target_layers
    from app.train.data import MODES, generate_with_features
    from app.train.evaluate import first_turns
    from app.train.prompts import Prompt

    assert MODES[0][0] == "greedy"
    prompts = [Prompt(id=f"{name}{i}", category=name, text=t) for i, t in enumerate(first_turns(name, limit))]
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    fs = generate_with_features(target.model, tok, prompts, 0, max_new_tokens, 0, target.eos_ids, pad,
                                layers=default_target_layers(target.model.config.num_hidden_layers))
    path = folder / f"{name}.safetensors"
    fs.save(path)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
