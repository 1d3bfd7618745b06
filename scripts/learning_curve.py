"""Held-out acceptance by depth against training time, for a training run as it goes.

Runs beside ``python -m app train --stage train`` (any recipe: ``--arch eagle2`` or
``eagle3``), reads the run's ``checkpoint.pt`` whenever a new one lands, and measures the
head in it on held-out shards: acc_d, the share of held-out response positions where the
head, fed its own drafts for d-1 steps, puts the target's top token first over its draft
vocabulary (on greedy answers, a depth-d chain's acceptance given its ancestors were
accepted). Each point is one line of ``<run>/curve.jsonl``: the training seconds and step
the checkpoint was taken at, and acc/ce by depth. A separate process rather than a hook in
the training loop, so the curve of a run started earlier, or on another machine, can be
taken too; it costs one validation (~8 batches of 2,048 tokens) per point.

    python scripts/learning_curve.py --work-dir W --run-name e3 --holdout shard_00002.safetensors --follow
    python scripts/learning_curve.py --table W/runs/e3/curve.jsonl W/runs/e2/curve.jsonl   # markdown
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def table(paths: list[Path], depth: int = 5) -> str:
    """A markdown table of curve files: one row per point, the run named by its folder."""
    rows = ["| run | minutes | step | " + " | ".join(f"acc{d}" for d in range(1, depth + 1)) + " |",
            "|---|---|---|" + "---|" * depth]
    for path in paths:
        for line in path.read_text().splitlines():
            p = json.loads(line)
            accs = " | ".join(f"{p[f'acc{d}']:.3f}" if f"acc{d}" in p else "–" for d in range(1, depth + 1))
            rows.append(f"| {path.parent.name} | {p['seconds'] / 60:.1f} | {p['step']} | {accs} |")
    return "\n".join(rows)


def head_from_checkpoint(saved: dict, target, layers: tuple[int, ...]):
    """The head a checkpoint holds, rebuilt from its state dict: EAGLE-3 when it has ``fc``
    over three target layers' features (``layers`` from the held-out shards), else EAGLE-1/2."""
    import torch

    state = saved["head"]
    hidden = target.model.config.hidden_size
    if state["fc.weight"].shape[1] == 3 * hidden:
        from app.train.eagle3 import new_head

        vocab = saved["vocab_ids"] if saved["vocab_ids"] is not None else torch.arange(target.model.config.vocab_size)
        head = new_head(target, vocab, layers)
    else:
        from app.engine.heads.eagle import DraftHead, head_config_for

        head = DraftHead(head_config_for(target.model.config))
    head.load_state_dict(state, strict=True)
    return head.eval()


def measure(saved: dict, target, holdout: list[Path], depth: int, max_batches: int) -> dict:
    """acc/ce by depth of the checkpoint's head on the held-out shards."""
    from safetensors import safe_open

    from app.train.evaluate import held_out_acceptance

    with safe_open(str(holdout[0]), framework="pt") as f:        # the target layers an EAGLE-3 head reads
        layers = tuple(int(i) for i in (f.metadata() or {}).get("layers", "").split(",") if i)
    head = head_from_checkpoint(saved, target, layers)
    return held_out_acceptance(head, target.model, holdout, depth, vocab_ids=saved["vocab_ids"],
                               max_batches=max_batches)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work-dir", type=Path, help="the training work dir (holds features/ and runs/)")
    p.add_argument("--run-name", default="main")
    p.add_argument("--holdout", nargs="+", default=["shard_00002.safetensors"], help="held-out shard file names")
    p.add_argument("--depth", type=int, default=5)
    p.add_argument("--val-batches", type=int, default=8, help="held-out batches of 2,048 tokens per point")
    p.add_argument("--every-min", type=float, default=10.0, help="training minutes between points")
    p.add_argument("--follow", action="store_true", help="keep polling until the run writes summary.json")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--table", nargs="+", type=Path, help="print curve files as one markdown table and exit")
    args = p.parse_args()
    if args.table:
        print(table(args.table, args.depth))
        return 0
    if args.work_dir is None:
        p.error("--work-dir is required (or --table)")

    import torch

    from app.engine.loading import load_target

    torch.set_num_threads(args.threads)
    run = args.work_dir / "runs" / args.run_name
    ckpt, curve = run / "checkpoint.pt", run / "curve.jsonl"
    shards = [args.work_dir / "features" / name for name in args.holdout]
    missing = [str(s) for s in shards if not s.is_file()]
    if missing:
        print(f"error: held-out shard not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    target = load_target(None, device="cpu", dtype="float32")
    done = [json.loads(line) for line in curve.read_text().splitlines()] if curve.is_file() else []
    last_seconds = done[-1]["seconds"] if done else -1e9
    while True:
        finished = (run / "summary.json").is_file()
        if ckpt.is_file():
            saved = torch.load(ckpt, map_location="cpu", weights_only=False)
            state = saved["state"]
            due = state["seconds"] - last_seconds >= 60 * args.every_min
            if due or (finished and state["seconds"] > last_seconds):
                point = {"step": state["step"], "seconds": round(state["seconds"], 1),
                         **{k: round(v, 4) for k, v in measure(saved, target, shards, args.depth,
                                                               args.val_batches).items()}}
                with curve.open("a") as f:
                    f.write(json.dumps(point) + "\n")
                last_seconds = state["seconds"]
                print(f"[curve {time.strftime('%H:%M:%S')}] step {point['step']}, "
                      f"{point['seconds'] / 60:.1f} min: " + " ".join(
                          f"acc{d} {point[f'acc{d}']:.3f}" for d in range(1, args.depth + 1) if f"acc{d}" in point),
                      flush=True)
        if finished or not args.follow:
            return 0
        time.sleep(30)


if __name__ == "__main__":
    sys.exit(main())
