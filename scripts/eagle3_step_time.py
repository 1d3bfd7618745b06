"""Seconds per EAGLE-3 training step (forward, backward, AdamW) on real feature shards, for the
attention and allocator settings that the trainer's speed depends on, interleaved.

Each variant runs in its own process (the allocator's state is per process), one after the
other, ``--rounds`` times: ``dense`` is SDPA under the dense (L, (s+1)·L) TTT mask,
``structured`` the training's own ``app.train.ttt_attention``; ``+heap`` runs inside
``app.train.heap.kept_heap``; ``+fused`` computes the per-depth loss with
``app.train.fused_ce`` compiled by inductor (the trainer's default; its one compile is in
the untimed first step). Prints one JSON line per measurement and a median table.

    python scripts/eagle3_step_time.py --work-dir W --shards shard_00001,shard_00003 --threads 1
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from anywhere: the repository root

VARIANTS = ["dense", "structured+heap", "structured", "dense+heap", "structured+heap+fused"]


def one(args) -> dict:
    """Time ``args.steps`` steps of one variant in this process (after one untimed step)."""
    import torch

    torch.set_num_threads(args.threads)
    from app.engine import loading
    from app.engine.heads import load_head
    from app.engine.precision import bf16_is_native
    from app.train import eagle3
    from app.train.eagle3 import Eagle3Dataset, Eagle3LossConfig, eagle3_loss
    from app.train.heap import kept_heap
    from app.train.loss import SubsetLMHead

    if "structured" not in args.variant:   # the trainer's attention swapped back for SDPA's
        eagle3.structured = lambda head: contextlib.nullcontext(head)
    target = loading.load_target("embedded", dtype="float32")
    head_dir = Path(args.head)
    head = load_head(head_dir, target.model.config.num_hidden_layers).float()
    data = Eagle3Dataset([Path(args.work_dir) / "features" / f"{s}.safetensors" for s in args.shards.split(",")])
    batches = data.batches(0, 0, args.batch_tokens)
    lm = SubsetLMHead(target.model.lm_head, head.draft_token_ids())
    emb = target.model.get_input_embeddings()
    cfg = Eagle3LossConfig(ttt_steps=args.ttt_steps, bf16=bf16_is_native("cpu"), fused="fused" in args.variant)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-5)
    times = []
    with (kept_heap() if "heap" in args.variant else contextlib.nullcontext()):
        for i in range(args.steps + 1):
            batch = data.collate(batches[i % len(batches)])
            t0 = time.perf_counter()
            loss, _ = eagle3_loss(head, lm, emb, batch, cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if i:
                times.append(time.perf_counter() - t0)
    return {"variant": args.variant, "s_per_step": statistics.median(times), "steps": times,
            "load": os.getloadavg()[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", required=True)
    p.add_argument("--shards", default="shard_00001,shard_00003")
    p.add_argument("--head", default="models/eagle3-smollm2-135m-instruct")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--ttt-steps", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--variant", help=argparse.SUPPRESS)      # set for the child process
    args = p.parse_args()
    if args.variant:
        print(json.dumps(one(args)), flush=True)
        return 0
    results: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for v in args.variants.split(","):
            out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--variant", v],
                                 capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            row = json.loads(out)
            print(json.dumps({"round": r, **row}), flush=True)
            results.setdefault(v, []).append(row["s_per_step"])
    base = statistics.median(results[args.variants.split(",")[0]])
    print("| variant | s/step (median of rounds) | vs first |\n|---|---|---|")
    for v, ts in results.items():
        print(f"| {v} | {statistics.median(ts):.2f} | {base / statistics.median(ts):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
