"""Training the EAGLE draft head on stored target features: the data, the loop, checkpoints.

``FeatureDataset`` holds the feature shards (``data.py`` writes them) and packs them into
length-grouped batches; ``train`` runs the optimiser loop over them (AdamW, warm-up then
cosine decay, gradient clipping), checkpointing and resuming exactly (the noise generator's
state and the position in the epoch are saved too); ``validate`` measures held-out losses and
per-depth top-1 agreement. What one step minimises is ``loss.py``'s ``head_loss`` (EAGLE-1's
feature regression plus soft cross-entropy, with EAGLE-3's training-time test), or another
loss with its signature (``app.train.eagle3.eagle3_loss``).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from app.train.data import FeatureShard, log
from app.train.loss import LossConfig, SubsetLMHead, head_loss


# --- data ----------------------------------------------------------------------------------

# A step's attention scores are (B, heads, L, L) per layer and training-time-test step, so its
# memory grows with B·L² where the batch's tokens grow with B·L: a batch of 2 document tasks of
# 1,400 tokens held ~3x the scores of one of 13 conversations of 300, and a run on 3M tokens of
# features went out of memory on the 24 GB VM. Capping B·L² at batch_tokens x 768 leaves every
# batch of conversations up to 768 tokens as it was (all template and target-written ones here
# are shorter: 737 at most) and puts longer ones fewer to a batch (one of 1,400 tokens alone).
ATTENTION_LENGTH = 768


class FeatureDataset:
    """All conversations of a list of feature shards, held in memory as stored (float16).
    The last layer's features only: EAGLE-3's layer inputs, where a shard has them, stay on
    disk (``Eagle3Dataset`` reads them), so an EAGLE-2 head trains on EAGLE-3 data in a
    quarter of the memory."""

    LAYER_FEATURES = False

    def __init__(self, paths: list[Path]):
        if not paths:
            raise FileNotFoundError("no feature shards to train on: run `python -m app train --stage data` first")
        self.paths = [Path(p) for p in paths]
        self.shards = [FeatureShard.load(p, layer_features=self.LAYER_FEATURES) for p in self.paths]
        self.index = [(si, s) for si, sh in enumerate(self.shards) for s in range(len(sh))]
        self.lengths = torch.tensor([int(self.shards[si].offsets[s + 1] - self.shards[si].offsets[s])
                                     for si, s in self.index])
        sample = torch.cat([sh.features[:2048].float() for sh in self.shards[:8]])
        self.feature_std = float(sample.std())

    def __len__(self) -> int:
        return len(self.index)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def batches(self, epoch: int, seed: int, batch_tokens: int) -> list[list[int]]:
        """The epoch's batches: a seeded shuffle, then conversations of similar length grouped
        (sorted within windows of 64) so that padding stays small, each batch holding at most
        ``batch_tokens`` padded tokens and ``batch_tokens * ATTENTION_LENGTH`` query-key pairs
        (see ``ATTENTION_LENGTH``); the batch order is shuffled again."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        perm = torch.randperm(len(self), generator=g, device="cpu").tolist()
        out: list[list[int]] = []
        for w in range(0, len(perm), 64):
            window = sorted(perm[w:w + 64], key=lambda k: int(self.lengths[k]))
            cur: list[int] = []
            for k in window:
                longest = int(self.lengths[k])          # the window is sorted: k is the longest so far
                rows = len(cur) + 1
                if cur and (rows * longest > batch_tokens or rows * longest ** 2 > batch_tokens * ATTENTION_LENGTH):
                    out.append(cur)
                    cur = []
                cur.append(k)
            if cur:
                out.append(cur)
        order = torch.randperm(len(out), generator=g, device="cpu").tolist()
        return [out[i] for i in order]

    def collate(self, items: list[int], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """Right-padded batch on ``device``: tokens (B, T), features (B, T, H) float32, lengths,
        prompt_lens (B,). Assembled in host memory, where the shards are, then moved once."""
        convs = [self.shards[self.index[k][0]].conversation(self.index[k][1]) for k in items]
        T = max(c[0].numel() for c in convs)
        H = convs[0][1].shape[-1]
        tokens = torch.zeros((len(convs), T), dtype=torch.long, device="cpu")
        feats = torch.zeros((len(convs), T, H), device="cpu")
        for i, (tok, f, _) in enumerate(convs):
            tokens[i, :tok.numel()] = tok
            feats[i, :tok.numel()] = f
        batch = {"tokens": tokens, "features": feats,
                 "lengths": torch.tensor([c[0].numel() for c in convs], device="cpu"),
                 "prompt_lens": torch.tensor([c[2] for c in convs], device="cpu")}
        return {k: v.to(device) for k, v in batch.items()}



# --- the loop ------------------------------------------------------------------------------

def lr_at(progress: float, lr: float, warmup: int, step: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 10 % of the peak as
    ``progress`` (fraction of the run done, 0..1) goes to 1."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = min(1.0, max(0.0, progress))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@dataclass
class TrainConfig:
    epochs: float = 2.0
    batch_tokens: int = 2048
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 50
    clip: float = 0.5
    seed: int = 0
    checkpoint_every: int = 100
    max_minutes: float | None = None  # training-time budget of the run, summed over resumes
    stop_at_step: int | None = None   # stop (and checkpoint) here, as an interruption would
    validate_every: int = 0           # optimiser steps between held-out measurements (0: none)
    patience: int = 0                 # stop after this many measurements without a new best (0: never)
    min_gain: float = 0.002           # what counts as a new best: a score above the best's by this much
    select: str = "acc1"              # the score a measurement is judged by (``selection_score``)


def train(head, target_model, data: FeatureDataset, run_dir: Path, loss_cfg: LossConfig,
          cfg: TrainConfig, progress: bool = True, vocab_ids: torch.Tensor | None = None,
          loss_fn=None, validator=None) -> dict:
    """Train ``head`` in place, checkpointing to ``run_dir`` (and resuming from it).

    ``loss_fn``: ``head_loss`` (EAGLE-1/2, the default) or another loss with its signature
    (``app.train.eagle3.eagle3_loss``); ``loss_cfg`` is its config.

    ``vocab_ids``: (Vd,) token ids; when given, the loss's distributions live on these draft
    tokens only (``SubsetLMHead``). A checkpoint holds head, optimiser, step, the feature
    shards and draft vocabulary it was started on, and the noise generator's state, so a
    resumed run continues with the very next batch.
    ``validator``: head -> held-out stats with ``acc1`` (e.g. ``validate`` on held-out shards),
    run every ``cfg.validate_every`` steps. Each measurement joins ``state["validations"]``
    (the run's own learning curve, kept in its checkpoint and summary); the best one's head
    is kept in ``best-head.pt``, training stops once ``cfg.patience`` measurements in a row
    bring no new best, and the head returned is the best one measured.
    Returns the final state summary (step, epoch, recent losses, seconds, validations).
    """
    from tqdm import tqdm

    run_dir.mkdir(parents=True, exist_ok=True)
    device = target_model.get_output_embeddings().weight.device   # the head trains where the target is
    head.to(device)
    lm_head = target_model.get_output_embeddings()
    if vocab_ids is not None:
        lm_head = SubsetLMHead(lm_head, vocab_ids.to(device))
    embedding = target_model.get_input_embeddings()
    run = _Run(head, torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95)),
               torch.Generator().manual_seed(cfg.seed),   # on the host: its state is checkpointed (see head_loss)
               run_dir / "checkpoint.pt", data, vocab_ids, loss_cfg, cfg)
    per_epoch = len(data.batches(0, cfg.seed, cfg.batch_tokens))
    total_steps = max(1, int(round(cfg.epochs * per_epoch)))
    state = resume(run, total_steps)
    head.train()
    start_step, t_start = state["step"], time.perf_counter()
    seconds_before = state["seconds"]
    bar = tqdm(total=total_steps, initial=start_step, disable=not progress, dynamic_ncols=True,
               mininterval=5, desc="train")
    recent: list[dict] = []
    budget_s = None if cfg.max_minutes is None else 60 * cfg.max_minutes
    batches = _Batches(data, cfg, state, per_epoch)
    while state["step"] < total_steps:
        epoch, batch_ids = batches.next()
        set_learning_rate(run.opt, cfg, state, total_steps, budget_s)
        loss, stats = (loss_fn or head_loss)(head, lm_head, embedding, data.collate(batch_ids, device), loss_cfg,
                                             data.feature_std, run.generator)
        run.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.clip)
        run.opt.step()
        state["step"] += 1
        state["batch"] += 1
        state["seconds"] = seconds_before + time.perf_counter() - t_start
        recent = (recent + [stats])[-50:]
        _report(bar, state, epoch, recent, stats)
        out_of_time = (budget_s is not None and state["seconds"] > budget_s) \
            or (cfg.stop_at_step is not None and state["step"] >= cfg.stop_at_step)
        plateau = False
        if validator is not None and cfg.validate_every and state["step"] % cfg.validate_every == 0:
            plateau = _measure(run, state, validator)
        if state["step"] % cfg.checkpoint_every == 0 or state["step"] == total_steps or out_of_time or plateau:
            save_checkpoint(run, state)
        if out_of_time:
            log(f"train: stopped at step {state['step']} of {total_steps} (time or step limit); rerun to resume")
            break
        if plateau:
            log(f"train: held-out {cfg.select} has not improved in {cfg.patience} measurements; "
                f"stopped at step {state['step']}")
            break
    bar.close()
    best = run.ckpt.with_name(BEST_HEAD)
    if state.get("best") is not None and best.is_file():     # the head to ship is the best one measured
        head.load_state_dict(torch.load(best, map_location=device, weights_only=True))
        log(f"train: kept the head of step {state['best']['step']} (held-out acc1 {state['best']['acc1']:.3f}, "
            f"{cfg.select} {selection_score(state['best'], cfg.select):.3f})")
    head.eval()
    return state


BEST_HEAD = "best-head.pt"
SELECT = ("acc1", "chain")


def selection_score(point: dict, select: str = "acc1") -> float:
    """What makes a held-out measurement the best so far. ``acc1``: depth-1 acceptance.
    ``chain``: a top-1 chain's expected accepted drafts, sum over d of acc1 x ... x acc_d over
    the depths measured; for a head trained to draft deeper (EAGLE-3's training-time test
    unrolled further), whose gains at depths 3-5 can cost a little at depth 1."""
    if select == "acc1":
        return point["acc1"]
    if select != "chain":
        raise ValueError(f"select must be one of {SELECT}, got {select!r}")
    total, reach, d = 0.0, 1.0, 1
    while f"acc{d}" in point:          # acc1, acc2, ... as far as the validator measured
        reach *= point[f"acc{d}"]
        total += reach
        d += 1
    return total


def _measure(run: "_Run", state: dict, validator) -> bool:
    """One held-out measurement: record it, keep the head if it is the best so far; True when
    the last ``patience`` measurements brought no new best."""
    run.head.eval()
    stats = validator(run.head)
    run.head.train()
    point = {"step": state["step"], "seconds": round(state["seconds"], 1), **{k: round(v, 4) for k, v in stats.items()}}
    state.setdefault("validations", []).append(point)
    best = state.get("best")
    score = lambda p: selection_score(p, run.cfg.select)      # noqa: E731
    if best is None or score(point) > score(best) + run.cfg.min_gain:
        state["best"] = point
        tmp = run.ckpt.with_name(BEST_HEAD + ".tmp")
        torch.save({k: v.cpu() for k, v in run.head.state_dict().items()}, tmp)
        tmp.rename(run.ckpt.with_name(BEST_HEAD))
    log("train: held-out at step {step}: ".format(**point) + " ".join(
        f"acc{d} {point[f'acc{d}']:.3f}" for d in range(1, 6) if f"acc{d}" in point)
        + ("  (best)" if state["best"] is point else
           f"  (best {run.cfg.select} {score(state['best']):.3f} at step {state['best']['step']}, here {score(point):.3f})"))
    since = len(state["validations"]) - 1 - state["validations"].index(state["best"])
    return bool(run.cfg.patience) and since >= run.cfg.patience


@dataclass
class _Run:
    """What a checkpoint saves and restores, besides the loop's ``state`` dict."""

    head: torch.nn.Module
    opt: torch.optim.Optimizer
    generator: torch.Generator
    ckpt: Path
    data: FeatureDataset
    vocab_ids: torch.Tensor | None
    loss_cfg: LossConfig
    cfg: TrainConfig


# --- checkpoint -------------------------------------------------------------------------------

def resume(run: _Run, total_steps: int) -> dict:
    """The loop's state: fresh, or restored (with head, optimiser and noise generator) from
    the run's checkpoint, which must have been made on the same shards and draft vocabulary."""
    if not run.ckpt.is_file():
        return {"step": 0, "seconds": 0.0, "history": []}
    saved = torch.load(run.ckpt, map_location="cpu", weights_only=False)
    if [str(p) for p in saved["shards"]] != [str(p) for p in run.data.paths]:
        raise ValueError(f"checkpoint {run.ckpt} was trained on other feature shards; "
                         "use a new --run-name (and --init-from) to train on more data")
    saved_ids = saved.get("vocab_ids")
    if (saved_ids is None) != (run.vocab_ids is None) or (
            saved_ids is not None and not torch.equal(saved_ids, run.vocab_ids)):
        raise ValueError(f"checkpoint {run.ckpt} was trained on another draft vocabulary; use a new --run-name")
    run.head.load_state_dict(saved["head"], strict=True)
    run.opt.load_state_dict(saved["optimizer"])
    run.generator.set_state(saved["generator"])
    state = saved["state"]
    log(f"train: resumed {run.ckpt} at step {state['step']} of {total_steps}")
    return state


def save_checkpoint(run: _Run, state: dict) -> None:
    """Write the checkpoint atomically (a temporary file, then a rename): an interruption
    mid-write leaves the previous checkpoint intact."""
    tmp = run.ckpt.with_name("checkpoint.pt.tmp")
    torch.save({"head": {k: v.cpu() for k, v in run.head.state_dict().items()}, "optimizer": run.opt.state_dict(),
                "generator": run.generator.get_state(),
                "state": state, "shards": [str(p) for p in run.data.paths], "vocab_ids": run.vocab_ids,
                "loss_config": run.loss_cfg.__dict__, "train_config": run.cfg.__dict__}, tmp)
    tmp.rename(run.ckpt)


# --- schedule -------------------------------------------------------------------------------

class _Batches:
    """Where in the data the run is: (epoch, batch within it), kept in ``state`` so a resumed
    run takes the very next batch. Epochs differ slightly in their number of batches (the
    packing follows the shuffle), so steps do not map to them."""

    def __init__(self, data: FeatureDataset, cfg: TrainConfig, state: dict, per_epoch: int):
        self.data, self.cfg, self.state = data, cfg, state
        state.setdefault("epoch", state["step"] // per_epoch)
        state.setdefault("batch", state["step"] % per_epoch)
        self.epoch_batches = data.batches(state["epoch"], cfg.seed, cfg.batch_tokens)

    def next(self) -> tuple[int, list[int]]:
        """(epoch, item ids) of the step about to run; ``state["batch"]`` is advanced by the loop."""
        state = self.state
        if state["batch"] >= len(self.epoch_batches):
            state["epoch"], state["batch"] = state["epoch"] + 1, 0
            self.epoch_batches = self.data.batches(state["epoch"], self.cfg.seed, self.cfg.batch_tokens)
        return state["epoch"], self.epoch_batches[state["batch"]]


def set_learning_rate(opt: torch.optim.Optimizer, cfg: TrainConfig, state: dict, total_steps: int,
                      budget_s: float | None) -> None:
    """``lr_at`` for this step. With a time budget the schedule follows whichever runs out
    first, steps or time, so a run cut short by its budget still ends with a decayed rate."""
    progress = state["step"] / total_steps
    if budget_s is not None:
        progress = max(progress, state["seconds"] / budget_s)
    for group in opt.param_groups:
        group["lr"] = lr_at(progress, cfg.lr, cfg.warmup_steps, state["step"])


def _report(bar, state: dict, epoch: int, recent: list[dict], stats: dict) -> None:
    """The progress bar's running means, and every 10 steps a line of the history."""
    bar.update(1)
    bar.set_postfix({key: f"{sum(r.get(key, 0.0) for r in recent) / len(recent):.3f}"
                     for key in ("loss", "reg1", "kl1", "acc1", "acc2") if key in stats})
    if state["step"] % 10 == 0:
        state["history"].append({"step": state["step"], "epoch": epoch, **{
            key: sum(r.get(key, 0.0) for r in recent) / len(recent) for key in stats}})


@torch.no_grad()
def validate(head, target_model, data: FeatureDataset, steps: int = 5, batch_tokens: int = 2048,
             max_batches: int | None = None, vocab_ids: torch.Tensor | None = None) -> dict[str, float]:
    """Held-out losses and top-1 agreement at each unroll depth (no noise, float32 LM head).

    acc_s is the chance that the head, fed its own features for s-1 steps (as when drafting
    at depth s) but the true tokens, puts the target's argmax first: on greedy responses,
    the acceptance rate of a depth-s chain given its ancestors were accepted. With
    ``vocab_ids`` both argmaxes are taken over those draft tokens, as the engine drafts.
    """
    head.eval()
    cfg = LossConfig(noise=0.0, ttt_steps=steps)
    lm_head, embedding = target_model.get_output_embeddings(), target_model.get_input_embeddings()
    device = lm_head.weight.device
    if vocab_ids is not None:
        lm_head = SubsetLMHead(lm_head, vocab_ids.to(device))
    sums: dict[str, float] = {}
    batches = data.batches(0, 12345, batch_tokens)[:max_batches]
    for ids in batches:
        _, stats = head_loss(head, lm_head, embedding, data.collate(ids, device), cfg, data.feature_std)
        for k, v in stats.items():
            sums[k] = sums.get(k, 0.0) + v / len(batches)
    return sums

