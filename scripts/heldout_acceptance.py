"""Held-out acceptance by depth of any draft head (EAGLE-1/2 or EAGLE-3) on feature shards.

The number training reports at its end (``--holdout``), for a head that was trained
elsewhere, e.g. the shipped one, so that heads trained on different data or for different
times are compared on the same held-out conversations:

    .venv/bin/python scripts/heldout_acceptance.py --shard W/features/shard_00002.safetensors \\
        models/eagle-smollm2-135m-instruct W/head-eagle2 W/head-eagle3

acc_d: the share of held-out response positions where the head, fed its own drafts for d-1
steps, puts the target's top token first (over its draft vocabulary) — on greedy answers,
a depth-d chain's acceptance given its ancestors were accepted.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("heads", nargs="+", help="head folders")
    p.add_argument("--shard", action="append", required=True, help="held-out feature shard (repeatable)")
    p.add_argument("--depth", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch

    from app.engine.heads import load_head
    from app.engine.loading import load_draft_vocab, load_target
    from app.train.evaluate import held_out_acceptance

    torch.set_num_threads(args.threads)
    target = load_target(None, device="cpu", dtype="float32")
    shards = [Path(s) for s in args.shard]
    print(f"| head | kind | " + " | ".join(f"acc{d}" for d in range(1, args.depth + 1)) + " |")
    print("|---|---|" + "---|" * args.depth)
    for folder in args.heads:
        head = load_head(Path(folder), target.model.config.num_hidden_layers)
        kind = getattr(head, "kind", "eagle2")
        vocab = load_draft_vocab(Path(folder), target.model.config.vocab_size)   # EAGLE-1/2's; EAGLE-3 has its own
        stats = held_out_acceptance(head, target.model, shards, args.depth, vocab_ids=vocab)
        accs = " | ".join(f"{stats.get(f'acc{d}', float('nan')):.3f}" for d in range(1, args.depth + 1))
        print(f"| {folder} | {kind} | {accs} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
