"""Training Medusa heads (``python -m app train --arch medusa``) on the stored target features.

The data is the EAGLE head's: the target's own greedy answers with its last hidden states
(``--stage data``). A conversation is tokens x[0..T-1] with features f[0..T-1]; the target's
LM head on f[j] gives x[j+1]. Medusa head k (1-based) on f[j] is trained to give x[j+1+k]:

    L = sum_k  decay^(k-1) * CE(head_k(f[j]), x[j+1+k])     over the response's targets

the Medusa-1 recipe: the target stays frozen, hard labels (here they are the target's own
greedy tokens, i.e. self-distillation), later heads weighted down (``decay`` 0.8), residual
blocks started at zero and LM heads from the target's (``MedusaHeads.from_target``). With a
draft vocabulary (``--loss-vocab draft``) each head's LM head has only those tokens' rows,
and a target outside them is left out of the loss (the head could never propose it).

Resumable like the EAGLE trainer: a checkpoint (heads, optimiser, step, position in the
data) every ``--checkpoint-every`` steps and at the end of the ``--train-minutes`` budget.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from app.engine import loading
from app.engine.heads.medusa import MedusaHeads
from app.engine.loading import EMBEDDED_ALIASES, EMBEDDED_HUB_ID
from app.train.data import log
from app.train.draft_vocab import build
from app.train.trainer import FeatureDataset, lr_at

DECAY = 0.8


def medusa_loss(heads: MedusaHeads, batch: dict[str, torch.Tensor], decay: float = DECAY,
                row_of: torch.Tensor | None = None) -> tuple[torch.Tensor, list[float]]:
    """Weighted cross-entropy of every head; also each head's top-1 accuracy on its targets.

    batch: tokens (B, T), features (B, T, H), lengths (B,), prompt_lens (B,).
    ``row_of`` (V,): a token id's row in the heads' draft vocabulary, -100 outside it."""
    tokens, feats = batch["tokens"], batch["features"].float()
    B, T = tokens.shape
    pos = torch.arange(T, device=tokens.device)[None]                                    # (1, T)
    total = feats.new_zeros(())
    accuracy: list[float] = []
    for k, head in enumerate(heads, start=1):
        span = T - 1 - k                       # positions j with a target x[j+1+k] inside the batch
        if span <= 0:
            accuracy.append(float("nan"))
            continue
        target = tokens[:, 1 + k:]                                                       # (B, span)
        where = pos[:, 1 + k:]                                                           # the target's position
        valid = (where < batch["lengths"][:, None]) & (where >= batch["prompt_lens"][:, None])
        if row_of is not None:
            target = row_of[target]
            valid &= target >= 0
        target = target.masked_fill(~valid, -100)
        logits = head(feats[:, :span])                                                   # (B, span, V or Vd)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=-100)
        total = total + decay ** (k - 1) * loss
        with torch.no_grad():
            hits = (logits.argmax(-1) == target) & valid
            accuracy.append(float(hits.sum()) / max(1, int(valid.sum())))
    return total, accuracy


def rows_of(vocab_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor | None:
    if vocab_ids is None:
        return None
    row_of = torch.full((vocab_size,), -100, dtype=torch.long)
    row_of[vocab_ids] = torch.arange(len(vocab_ids))
    return row_of


def run_medusa_training(args, work: Path, out: Path) -> dict:
    run_dir = work / "runs" / f"medusa-{args.run_name}"
    run_dir.mkdir(parents=True, exist_ok=True)
    shards_file = run_dir / "shards.json"
    if shards_file.is_file():                    # a resumed run keeps the shards it started with
        paths = [Path(p) for p in json.loads(shards_file.read_text())]
    else:
        paths = sorted((work / "features").glob("shard_*.safetensors"))
        shards_file.write_text(json.dumps([str(p) for p in paths], indent=1))
    holdout = [p for p in paths if p.name in set(args.holdout)]
    paths = [p for p in paths if p not in holdout]
    data = FeatureDataset(paths)
    target = loading.load_target(args.base_model, device=args.device, dtype="float32")
    vocab_size = target.model.config.vocab_size
    vocab_ids = None
    if args.loss_vocab == "draft" and args.draft_vocab_size < vocab_size:
        vocab_path = run_dir / "draft_vocab.json"
        if not vocab_path.is_file():
            vocab_path.write_text(json.dumps(build(paths, args.draft_vocab_size, always=tuple(sorted(target.eos_ids)))))
        vocab_ids = torch.tensor(json.loads(vocab_path.read_text())["token_ids"], dtype=torch.long)
    heads = MedusaHeads.from_target(target.model, args.medusa_heads, args.medusa_layers, vocab_ids)
    if args.base_model in EMBEDDED_ALIASES:      # its hub id, not the path of this machine's unpacked copy
        heads.base_model = EMBEDDED_HUB_ID
    device = target.device
    heads.to(device)
    row_of = rows_of(vocab_ids, vocab_size)
    row_of = row_of.to(device) if row_of is not None else None
    opt = torch.optim.AdamW(heads.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))
    per_epoch = len(data.batches(0, args.seed, args.batch_tokens))
    total_steps = max(1, int(round(args.epochs * per_epoch)))
    state = {"step": 0, "seconds": 0.0, "epoch": 0, "batch": 0, "history": []}
    ckpt = run_dir / "checkpoint.pt"
    if ckpt.is_file():
        saved = torch.load(ckpt, map_location="cpu", weights_only=False)
        heads.load_state_dict(saved["heads"], strict=True)
        opt.load_state_dict(saved["optimizer"])
        state = saved["state"]
        log(f"medusa: resumed {ckpt} at step {state['step']}")

    def save() -> None:
        tmp = ckpt.with_name("checkpoint.pt.tmp")
        torch.save({"heads": {k: v.cpu() for k, v in heads.state_dict().items()},
                    "optimizer": opt.state_dict(), "state": state}, tmp)
        tmp.rename(ckpt)

    log(f"medusa: {args.medusa_heads} heads, {len(data)} conversations, {data.num_tokens} tokens, "
        f"{'draft vocabulary of ' + str(len(vocab_ids)) if vocab_ids is not None else 'full vocabulary'}")
    budget_s = 60 * args.train_minutes if args.train_minutes else None
    t_start, seconds_before = time.perf_counter(), state["seconds"]
    batches = data.batches(state["epoch"], args.seed, args.batch_tokens)
    heads.train()
    while state["step"] < total_steps:
        if budget_s is not None and state["seconds"] >= budget_s:
            break
        if state["batch"] >= len(batches):
            state["epoch"], state["batch"] = state["epoch"] + 1, 0
            batches = data.batches(state["epoch"], args.seed, args.batch_tokens)
        progress = state["step"] / total_steps
        if budget_s is not None:
            progress = max(progress, state["seconds"] / budget_s)
        for group in opt.param_groups:
            group["lr"] = lr_at(progress, args.lr, args.warmup_steps, state["step"])
        loss, acc = medusa_loss(heads, data.collate(batches[state["batch"]], device), row_of=row_of)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(heads.parameters(), args.clip)
        opt.step()
        state["step"] += 1
        state["batch"] += 1
        state["seconds"] = seconds_before + time.perf_counter() - t_start
        state["history"] = state["history"][-199:] + [{"step": state["step"], "loss": float(loss.detach()), "top1": acc}]
        if state["step"] % 10 == 0:
            log(f"medusa step {state['step']}: loss {float(loss.detach()):.3f}, top-1 by head "
                + " ".join(f"{a:.2f}" for a in acc))
        if state["step"] % args.checkpoint_every == 0:
            save()
    save()
    heads.eval()
    result = {"step": state["step"], "seconds": state["seconds"], "tokens": data.num_tokens}
    if holdout:
        result["holdout_top1"] = evaluate(heads, FeatureDataset(holdout), device, row_of)
        log(f"medusa: held-out top-1 by head {result['holdout_top1']}")
    heads.save(out, dtype=torch.float16)      # half the bytes; the engine casts to the target's dtype
    (out / "training.json").write_text(json.dumps(result, indent=1) + "\n")
    log(f"medusa: saved {out}")
    return result


@torch.no_grad()
def evaluate(heads: MedusaHeads, data, device, row_of=None, batch_tokens: int = 2048) -> list[float]:
    """Top-1 accuracy of each head over a dataset (targets in the draft vocabulary only)."""
    hits = [0.0] * heads.num_heads
    count = [0] * heads.num_heads
    for ids in data.batches(0, 0, batch_tokens):
        batch = data.collate(ids, device)
        _, acc = medusa_loss(heads, batch, row_of=row_of)
        n = int(batch["lengths"].sum() - batch["prompt_lens"].sum())
        for k, a in enumerate(acc):
            if not math.isnan(a):
                hits[k] += a * n
                count[k] += n
    return [round(h / c, 4) if c else float("nan") for h, c in zip(hits, count)]
