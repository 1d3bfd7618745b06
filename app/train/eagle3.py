"""Training an EAGLE-3 head (2503.01840): fused target layers, training-time test, token loss.

Notation as in app/engine/heads/eagle3.py: a conversation is tokens x[0..T-1]; the target gives
at every position j its low/mid/high layer inputs g[j] (3H, stored by the data stage with
``--arch eagle3``) and its final feature f[j], whose LM-head distribution p[j] is the
target's distribution of x[j+1].

Training-time test, unrolled over ``ttt_steps`` = k draft steps. Step s = 0..k-1 at position
j plays the head drafting at depth s+1 after the committed context x[..j+1]:

    step 0:  reads (g[j],        x[j+1])    at position j      -> q0[j] of x[j+2]
    step s:  reads (a_{s-1}[j],  x[j+1+s])  at position j + s  -> q_s[j] of x[j+2+s]

a_{s-1}[j] is the head's own hidden state of the step before: from depth 2 on the head never
sees a target feature, so it is trained on what it will read. Tokens are the true ones (the
drafted path is the accepted one). Attention matches drafting: the step-s query at j sees
step-0 keys at positions <= j (the committed pairs, which the engine keeps in the head's KV
cache) and, for 1 <= t <= s, the single step-t key at j (its drafted ancestors). The steps
are run one after another on one KV cache that keeps every step's keys, with that mask.

Loss (token loss only; EAGLE-3 drops EAGLE-1's feature regression):

    L = Σ_s 0.8^s · mean_j CE(p_d[j+1+s], q_s[j])      CE(p, q) = -Σ_v p(v) log q(v)

over the draft vocabulary (Vd tokens, the head's d2t/t2d): p_d is the target's p restricted
to those tokens and renormalised. Positions are those of the response (the chain starts at
a committed position, j >= prompt length - 1). The reference also drops positions whose
target argmax is not a draft token; that needs the full-vocabulary logits at every
position, the cost the draft vocabulary saves, for ~4% of the positions (the 8,192 most
frequent tokens cover ~96% of the responses), so every response position counts here.

The optimiser loop, schedule, checkpoints and resume are app/train/trainer.py's ``train``,
called with this loss.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache

from app.engine.heads.eagle3 import Eagle3Head, eagle3_config_for
from app.engine.heads import DRAFT_VOCAB_FILE, load_head
from app.engine.heads.checkpoint import read_state_dict
from app.engine.sources import SHIPPED_HEADS
from app.engine.precision import bf16_is_native
from app.train.data import log
from app.train.draft_vocab import describe
from app.train.fused_ce import (fused_soft_ce_and_agreement, fused_target_distribution, soft_ce_and_agreement,
                                target_distribution)
from app.train.stage import loss_vocabulary, train_config, training_inputs
from app.train.loss import SubsetLMHead
from app.train.trainer import FeatureDataset, train
from app.train.ttt_attention import structured

# default unroll: the reference trains 7 steps; each step costs one more head forward and
# LM-head matmul, so on a CPU we default to 3 (depth 3 covers most accepted length)
TTT_STEPS = 3
# written beside a trained head: its data, held-out numbers and learning curve across runs
PROGRESS_FILE = "training.json"


@dataclass
class Eagle3LossConfig:
    ttt_steps: int = TTT_STEPS  # draft steps unrolled (>= 1; 1 = no training-time test)
    ttt_decay: float = 0.8      # weight of step s is ttt_decay ** s
    bf16: bool = False          # head forward and LM head under bf16 autocast (master weights, CE in fp32)
    fused: bool = False         # the (N, Vd) softmax/CE/argmax work compiled by inductor (fused_ce.py)


class Eagle3Dataset(FeatureDataset):
    """FeatureDataset whose batches also carry ``layer_features`` (B, T, 3H): the stored
    inputs of the target layers the head reads."""

    LAYER_FEATURES = True

    def __init__(self, paths: list[Path]):
        super().__init__(paths)
        layers = {sh.layers for sh in self.shards}
        if any(sh.layer_features is None for sh in self.shards) or len(layers) != 1:
            raise ValueError("EAGLE-3 training needs shards made with `--stage data --arch eagle3`, all with "
                             f"the same target layers; these have {sorted(layers)}")
        self.layers = layers.pop()

    def collate(self, items: list[int], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        batch = super().collate(items, "cpu")
        rows = [self.shards[self.index[k][0]].layer_rows(self.index[k][1]) for k in items]
        g = torch.zeros(len(rows), batch["tokens"].shape[1], rows[0].shape[-1], device="cpu")   # (B, T, 3H)
        for i, r in enumerate(rows):
            g[i, :r.shape[0]] = r
        batch["layer_features"] = g
        return {k: v.to(device) for k, v in batch.items()}


def ttt_step_mask(step: int, length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(L, (step+1)·L) bool, True = may attend: what the step-``step`` query at position j
    sees among the keys of steps 0..step (concatenated in that order): step-0 keys at
    positions <= j, and each later step's key at j itself."""
    j = torch.arange(length, device=device)
    blocks = [j[None, :] <= j[:, None]]                                  # (L, L) causal over step 0
    blocks += [torch.eye(length, dtype=torch.bool, device=device)] * step  # (L, L) the diagonal
    return torch.cat(blocks, dim=1)


def _ahead(t: torch.Tensor, s: int) -> torch.Tensor:
    """t[:, j + s] at every j (zeros past the end): the value ``s`` positions ahead."""
    return torch.cat([t[:, s:], t.new_zeros(t[:, :s].shape)], 1)


def ttt_forward(head, next_embeds: torch.Tensor, layer_features: torch.Tensor, steps: int):
    """The head unrolled ``steps`` draft steps: yields a_s (B, L, H) for s = 0..steps-1.

    ``next_embeds`` (B, L, H): emb(x[j+1]) at every position j; ``layer_features`` (B, L, 3H):
    g[j]. Step s reads (a_{s-1}[j], emb(x[j+1+s])) at position j+s (step 0: (g[j], emb(x[j+1])))
    with ``ttt_step_mask``; a_s[j] is the head's state for x[j+2+s] (``head.logits`` -> q).
    Every step's keys stay in one cache, as the engine's head cache holds the committed pairs
    and the drafted ancestors."""
    B, L, _ = next_embeds.shape
    j = torch.arange(L, device=next_embeds.device)[None]                  # (1, L) position j
    cache = DynamicCache()
    hidden = layer_features
    for s in range(steps):
        mask = ttt_step_mask(s, L, next_embeds.device)[None, None].expand(B, 1, L, (s + 1) * L)
        with structured(head):   # the same attention as under ``mask``, from its structure
            hidden = head(_ahead(next_embeds, s), hidden, (j + s).expand(B, L), mask, cache)   # (B, L, H)
        yield hidden


def eagle3_loss(head, lm_head, embedding, batch: dict[str, torch.Tensor], cfg: Eagle3LossConfig,
                feature_std: float = 1.0, g: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one batch and its parts per depth (``loss``, ``ce{d}``, ``acc{d}`` for d = 1..k;
    acc_d is the top-1 agreement with the target over the draft vocabulary at depth d).

    ``lm_head``: the target's frozen LM head over the draft vocabulary, in the head's draft-id
    order (``app.train.loss.SubsetLMHead``), so ``softmax(lm_head(f))`` is p_d. ``feature_std`` and
    ``g`` are unused (EAGLE-3 adds no input noise: training-time test shows the head its own
    errors instead); they keep trainer.train's call.
    """
    tokens, f, layers = batch["tokens"], batch["features"], batch["layer_features"]   # (B,T), (B,T,H), (B,T,3H)
    B, T, _ = f.shape
    L = T - 1
    device = f.device
    j = torch.arange(L, device=device)[None]                              # (1, L) position j
    # p only where some step reads it: the rows j that predict a response token x[j+2] (a
    # step s at j reads row j+s, itself such a row). Prompt and padding rows, ~40% of a
    # batch here, are neither multiplied by the LM head nor copied for each step.
    read = (j + 1 < batch["lengths"][:, None]) & (j >= batch["prompt_lens"][:, None] - 1)   # (B, L)
    slot = torch.full((B, L), -1, dtype=torch.long, device=device)        # row (b, j) -> its row in p
    slot[read] = torch.arange(int(read.sum()), device=device)
    # bf16 autocast where bf16 is native: the matmuls (decoder layer, fc, the Vd-row LM heads
    # of the head and of the target's p) are nearly all of a step, and VDPBF16PS does twice
    # the multiply-adds of fp32 FMA (only those: softmax, the loss and the stats run in fp32)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16)
    distribution = fused_target_distribution if cfg.fused else target_distribution
    with torch.no_grad():
        with autocast:
            target_logits = lm_head(f[:, 1:][read])                      # (R, Vd)
        p_read, p_top = distribution(target_logits)                     # (R, Vd) p_d of x[j+2], (R,) its top token
    total = torch.zeros((), device=device)
    stats: dict[str, float] = {}
    ce_and_acc = fused_soft_ce_and_agreement if cfg.fused else soft_ce_and_agreement
    with autocast:
        steps = ttt_forward(head, embedding(tokens[:, 1:]), layers[:, :-1], cfg.ttt_steps)
    for s in range(cfg.ttt_steps):
        with autocast:
            hidden = next(steps)                                           # (B, L, H) a_s[j]
        valid = (j + 1 + s < batch["lengths"][:, None]) & (j >= batch["prompt_lens"][:, None] - 1)   # (B, L)
        if not bool(valid.any()):
            break
        with autocast:
            logits = head.logits(hidden[valid])                            # (N, Vd) q_s of x[j+2+s]
        rows = _ahead(slot, s)[valid]                                      # (N,) row j+s of p
        ce, acc = ce_and_acc(logits, p_read, rows, p_top)                  # soft targets: -Σ p log q
        total = total + cfg.ttt_decay ** s * ce
        stats[f"ce{s + 1}"] = ce.item()
        stats[f"acc{s + 1}"] = acc.item()
    stats["loss"] = total.item()
    return total, stats


@torch.no_grad()
def validate(head, target_model, data: Eagle3Dataset, steps: int, vocab_ids: torch.Tensor,
             batch_tokens: int = 2048, max_batches: int | None = None) -> dict[str, float]:
    """Held-out ce and top-1 agreement at each depth (as in training, without gradients):
    acc_s is the acceptance rate of a depth-s chain given its ancestors were accepted."""
    head.eval()

    lm_head = target_model.get_output_embeddings()
    device = lm_head.weight.device
    lm = SubsetLMHead(lm_head, vocab_ids.to(device))
    sums: dict[str, float] = {}
    batches = data.batches(0, 12345, batch_tokens)[:max_batches]
    for ids in batches:
        _, stats = eagle3_loss(head, lm, target_model.get_input_embeddings(), data.collate(ids, device),
                               Eagle3LossConfig(ttt_steps=steps))
        for k, v in stats.items():
            sums[k] = sums.get(k, 0.0) + v / len(batches)
    return sums


def new_head(target, vocab_ids: torch.Tensor, layers: tuple[int, ...]):
    """A freshly initialised EAGLE-3 head for ``target`` over the draft tokens ``vocab_ids``.

    Its output end starts as the target's: ``norm`` from the target's final norm and
    ``lm_head`` from the target's LM-head rows of the draft tokens, so from the first step a
    hidden state shaped like the target's last feature already reads as the target's
    distribution, and training moves the decoder layer towards that before it adjusts the
    LM head. (EAGLE-3 trains both; the warm start matters when data and time are short.)"""

    head = Eagle3Head(eagle3_config_for(target.model.config, vocab_ids.numel()), layers)
    head.set_draft_vocab(vocab_ids)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.model.get_output_embeddings().weight[vocab_ids.to(head.lm_head.weight.device)])
        head.norm.weight.copy_(target.model.model.norm.weight)
    return head


def warm_start(head, eagle2_folder: Path) -> list[str]:
    """Copy into an EAGLE-3 head every tensor of an EAGLE-1/2 head whose name and shape agree
    (its ``layers.0.*`` are our ``midlayer.*``); returns the names copied.

    What agrees for a target of hidden size H: the decoder layer's MLP, ``o_proj`` and
    post-attention norm. The attention's q/k/v read 2H here ([emb; g]) against fc's mixed H
    in EAGLE-1/2, and ``fc`` fuses 3H target features against (emb, f), so those stay as
    initialised; the output end already starts as the target's (``new_head``)."""
    raw = read_state_dict(Path(eagle2_folder))
    mine = head.state_dict()
    copied = []
    with torch.no_grad():
        for name, tensor in raw.items():
            ours = "midlayer." + name[len("layers.0."):] if name.startswith("layers.0.") else name
            if ours in mine and mine[ours].shape == tensor.shape and ours not in ("lm_head.weight", "norm.weight"):
                mine[ours].copy_(tensor.to(mine[ours].dtype))
                copied.append(ours)
    return sorted(copied)


def learning_curve(state: dict, tokens_per_step: float, before: dict | None,
                   held_out: list[str] | None = None) -> list[dict]:
    """The run's held-out measurements as one learning curve across machines and resumes: each
    point with ``tokens_seen`` (training tokens read so far, padding excluded) and the
    minutes trained, both counted on from ``before`` (the curve of the head this run started
    from, its training.json), whose points come first, and the ``held_out`` shards it was
    measured on (runs may change them: a curve's level moves with its data)."""
    prior = (before or {}).get("curve", [])
    base_tokens = prior[-1]["tokens_seen"] if prior else 0
    base_minutes = prior[-1]["minutes"] if prior else 0.0
    run = (before or {}).get("runs", 0) + 1
    points = [{"run": run, "step": v["step"], "tokens_seen": int(base_tokens + v["step"] * tokens_per_step),
               "minutes": round(base_minutes + v["seconds"] / 60, 1),
               **{k: v[k] for k in sorted(v) if k.startswith("acc")},
               **({"held_out": held_out} if held_out else {})}
              for v in state.get("validations", [])]
    return prior + points


def run_training(args, work: Path, out: Path) -> dict:
    """Stage *train* with ``--arch eagle3``: train on every finished shard (they must carry the
    target-layer features), save the head to ``out`` in the official EAGLE-3 layout."""
    args, target, run_dir, paths, holdout = training_inputs(args, work)
    data = Eagle3Dataset(paths)
    log(f"train eagle3: {len(data)} conversations, {data.num_tokens} tokens in {len(paths)} shards, "
        f"target layers {list(data.layers)}")
    if args.init_from:
        # a head's LM-head rows belong to its draft vocabulary, so a continued head keeps it
        # (counted afresh on this run's shards); a resumed run finds it in the run folder
        head = load_head(Path(args.init_from), target.model.config.num_hidden_layers)
        if not (run_dir / DRAFT_VOCAB_FILE).is_file():
            vocab = describe(head.draft_token_ids().tolist(), paths, f"the draft vocabulary of {args.init_from}")
            (run_dir / DRAFT_VOCAB_FILE).write_text(json.dumps(vocab) + "\n")
            log(f"train eagle3: continuing {args.init_from}: its {vocab['size']} draft tokens cover "
                f"{vocab['coverage']:.4f} of this run's response tokens")
    vocab = loss_vocabulary(args, run_dir, paths, target)
    V = target.model.config.vocab_size
    vocab_ids = torch.arange(V) if vocab is None else torch.tensor(vocab["token_ids"], dtype=torch.long)
    torch.manual_seed(args.seed)  # the head's initial weights
    if args.init_from:
        if not torch.equal(head.draft_token_ids(), vocab_ids):
            raise ValueError(f"--init-from {args.init_from} drafts over another vocabulary than run "
                             f"{run_dir.name}'s ({DRAFT_VOCAB_FILE})")
    else:
        head = new_head(target, vocab_ids, data.layers)
        if args.warm_start:
            source = SHIPPED_HEADS["eagle2"] if args.warm_start == "eagle2" else Path(args.warm_start)
            log(f"train eagle3: warm start from {source}: " + ", ".join(warm_start(head, source)))
    steps = args.ttt_steps if args.ttt_steps else TTT_STEPS
    loss_cfg = Eagle3LossConfig(ttt_steps=steps, bf16=not args.fp32_lm_head and bf16_is_native(args.device),
                                fused=not args.eager_loss)
    cfg = train_config(args)
    validator = None
    if holdout and args.validate_every:
        held_out = Eagle3Dataset(holdout)
        validator = lambda h: validate(h, target.model, held_out, max(steps, 5), vocab_ids,   # noqa: E731
                                       max_batches=args.val_batches)
    state = train(head, target.model, data, run_dir, loss_cfg, cfg, vocab_ids=vocab_ids, loss_fn=eagle3_loss,
                  validator=validator)
    head.save(out, dtype=getattr(torch, args.head_dtype))
    val = None
    if holdout:
        val = validate(head, target.model, Eagle3Dataset(holdout), max(steps, 5), vocab_ids,
                       max_batches=args.val_batches)
        log("train eagle3: held-out " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(val.items())))
    (run_dir / "summary.json").write_text(json.dumps(
        {"arch": "eagle3", "state": state, "tokens": data.num_tokens, "conversations": len(data),
         "shards": len(paths), "holdout": [str(p) for p in holdout], "validation": val,
         "target_layers": list(data.layers),
         "loss_vocab": None if vocab is None else {k: v for k, v in vocab.items() if k != "token_ids"},
         "loss_config": loss_cfg.__dict__, "train_config": cfg.__dict__}, indent=1))
    before = None
    if args.init_from and (Path(args.init_from) / PROGRESS_FILE).is_file():
        before = json.loads((Path(args.init_from) / PROGRESS_FILE).read_text())
    per_step = data.num_tokens / max(1, len(data.batches(0, args.seed, args.batch_tokens)))
    progress = {"arch": "eagle3", "runs": (before or {}).get("runs", 0) + 1,
                "data": {"conversations": len(data), "tokens": data.num_tokens, "shards": len(paths),
                         "holdout": [p.name for p in holdout]},
                "held_out": None if val is None else {k: round(v, 4) for k, v in sorted(val.items())},
                "best": state.get("best"), "select": cfg.select, "warm_start": args.warm_start, "init_from": args.init_from,
                "ttt_steps": steps, "lr": args.lr, "batch_tokens": args.batch_tokens,
                "curve": learning_curve(state, per_step, before, [p.stem for p in holdout])}
    (out / PROGRESS_FILE).write_text(json.dumps(progress, indent=1) + "\n")
    log(f"train eagle3: saved head to {out} after step {state['step']} ({state['seconds'] / 60:.1f} min)")
    return state
