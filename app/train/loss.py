"""The draft head's training loss (EAGLE-1's recipe, and EAGLE-3's training-time test).

Notation (EAGLE, 2401.15077): a conversation is tokens x[0..T-1] with target features
f[0..T-1] (last hidden state after the final norm). The head reads (f[j], emb(x[j+1])) at
position j and predicts f̂[j+1]; the target's frozen LM head turns f̂[j+1] into the draft
distribution q over x[j+2], and turns the true f[j+1] into the target's distribution p.

Loss per predicted position (EAGLE-1's recipe, with a soft classification target):

    L = w_reg * SmoothL1(f̂[j+1], f[j+1])  +  w_kl * CE(p, q)      CE(p, q) = -Σ_v p(v) log q(v)

CE(p, q) equals KL(p || q) plus the constant entropy of p; soft targets teach the head the
target's whole distribution, which both the tree (top-k branches) and sampled acceptance
use, instead of only its argmax.

Input features get Gaussian noise (std = ``noise`` × the features' own std): at inference
the head reads its *own* imperfect predictions after depth 1, so EAGLE trains it to tolerate
perturbed inputs.

Training-time test (EAGLE-3, 2503.01840), ``ttt_steps = k > 1``: the head is unrolled k
times; at step s it reads at position i its own step-(s-1) prediction of f[i] in place of
f[i], exactly as when it drafts at depth s. Its attention must see what it would see then:
true-feature keys up to position i-(s-1) (the committed context) and, for each earlier step
t in 2..s, the single key of step t at position i-(s-t) (the drafted ancestors). We feed the
steps concatenated along time, (B, s·L), with that block mask (``ttt_mask``).

This is what one training step computes; ``trainer.py`` is the loop around it (batches,
optimiser, schedule, checkpoints) and takes any loss with ``head_loss``'s signature
(``app.train.eagle3.eagle3_loss`` is the other).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class LossConfig:
    w_reg: float = 1.0       # smooth-L1 feature regression
    w_kl: float = 0.1        # soft cross-entropy to the target's p (EAGLE uses 0.1 for its CE term)
    noise: float = 0.05      # input-feature noise std, as a fraction of the features' std
    ttt_steps: int = 1       # 1 = EAGLE-1; k > 1 = EAGLE-3 training-time test unrolled k steps
    ttt_decay: float = 0.8   # weight of unroll step s is ttt_decay ** (s - 1)
    lm_head_bf16: bool = False  # LM-head matmuls in bf16 (CPU autocast): faster where bf16 is native
    kl_fraction: float = 1.0    # share of positions that get the distribution term


def _lm_precision(cfg: "LossConfig", device: torch.device):
    """bf16 autocast around the (N, H) x (H, V) LM-head matmuls, the bulk of the training cost
    (V = 49k for SmolLM2 against H = 576); softmax and losses stay in float32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.lm_head_bf16)


class SubsetLMHead(torch.nn.Module):
    """The target's frozen LM head restricted to a draft vocabulary: (..., H) -> (..., Vd)
    logits over the token ids ``ids`` only.

    The engine drafts only from the head's reduced vocabulary (``draft_vocab.json``), so
    that is all q needs to be trained on. With this LM head the loss compares q and p as
    distributions over those Vd tokens (the softmax renormalises p over them), and every
    LM-head matmul of the loss, the bulk of a training step, reads Vd rows instead of V
    (8,192 of 49,152 for SmolLM2; the step time it saves: benchmarks/engine-notes.md).
    """

    def __init__(self, lm_head: torch.nn.Module, ids: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", lm_head.weight.detach().index_select(0, ids).contiguous())  # (Vd, H)
        bias = getattr(lm_head, "bias", None)
        self.register_buffer("bias", None if bias is None else bias.detach().index_select(0, ids))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def ttt_mask(steps: int, length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(steps·L, steps·L) bool, True = may attend, for the head unrolled ``steps`` times.

    Query (step s, position i) sees step-1 keys at positions m <= i - (s-1) and, for
    2 <= t <= s, the step-t key at position i - (s-t). For steps = 1 this is the causal mask.
    """
    i = torch.arange(length, device=device)
    blocks = []
    for s in range(1, steps + 1):
        row = []
        for t in range(1, steps + 1):
            if t == 1:
                row.append(i[None, :] <= i[:, None] - (s - 1))        # (L, L): key m <= i-(s-1)
            elif t <= s:
                row.append(i[None, :] == i[:, None] - (s - t))        # one key per query
            else:
                row.append(torch.zeros(length, length, dtype=torch.bool, device=device))
        blocks.append(torch.cat(row, 1))
    return torch.cat(blocks, 0)


def head_loss(head, lm_head, embedding, batch: dict[str, torch.Tensor], cfg: LossConfig,
              feature_std: float, g: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The training loss of one batch and its parts (per unroll step) for logging.

    Shapes: B conversations, T tokens, L = T - 1 head positions, H hidden, V vocabulary.
    ``batch["features"]`` are the target's features f, what the head predicts. The head reads
    them too, unless ``batch["input_features"]`` (B, T, k·H) is given: several target layers
    per position, as EAGLE-3 feeds its head (only with ``ttt_steps == 1``: deeper unroll
    steps would read the head's own H-wide predictions instead).
    """
    tokens, f = batch["tokens"], batch["features"]                    # (B, T), (B, T, H)
    B, T, H = f.shape
    L = T - 1
    device = f.device
    pos = torch.arange(L, device=device)[None].expand(B, L)           # (B, L) position j
    emb = embedding(tokens[:, 1:])                                     # (B, L, H) emb(x[j+1])
    target = f[:, 1:]                                                  # (B, L, H) f[j+1]
    j = torch.arange(L, device=device)[None]
    real = j + 1 < batch["lengths"][:, None]                           # (B, L) f[j+1] exists
    f_in = f[:, :-1]                                                   # (B, L, H) f[j]
    if "input_features" in batch:
        if cfg.ttt_steps != 1:
            raise ValueError("input_features (several target layers) train with ttt_steps 1 only")
        f_in = batch["input_features"][:, :-1]                         # (B, L, k·H) at position j
    # The random numbers come from ``g``, a CPU generator (its state is in the checkpoint), and
    # move to the batch's device: a run draws the same noise on any device.
    if cfg.noise > 0:
        f_in = f_in + torch.randn(f_in.shape, generator=g, device="cpu").to(device) * (cfg.noise * feature_std)

    total = torch.zeros((), device=device)
    stats: dict[str, float] = {}
    inputs: list[torch.Tensor] = []
    valid1 = real & (j >= batch["prompt_lens"][:, None] - 1)            # (B, L) step-1 loss positions
    # the distribution term costs two (N, V) matmuls per position, the regression almost
    # nothing: with kl_fraction < 1 it is taken on a random subset of the positions
    kl_pos = valid1 & (torch.rand(valid1.shape, generator=g, device="cpu") < cfg.kl_fraction).to(device)   # (B, L)
    with torch.no_grad(), _lm_precision(cfg, device):
        p_all = torch.softmax(lm_head(target[kl_pos]).float(), -1)     # (K, V) target p, computed once
    for s in range(1, cfg.ttt_steps + 1):
        # loss positions: the chain behind this prediction starts at the true feature
        # f[j-(s-1)], which must be a committed position (>= last prompt token)
        valid = real & (j - (s - 1) >= batch["prompt_lens"][:, None] - 1)   # (B, L), within valid1
        inputs.append(f_in)
        feats_cat = torch.cat(inputs, 1)                               # (B, s·L, H)
        emb_cat = emb.repeat(1, s, 1)                                  # (B, s·L, H)
        pos_cat = pos.repeat(1, s)                                     # (B, s·L)
        mask = None if s == 1 else ttt_mask(s, L, device)[None, None].expand(B, 1, s * L, s * L)
        pred = head(emb_cat, feats_cat, pos_cat, mask)[:, -L:]         # (B, L, H) this step's f̂[j+1]
        if not bool(valid.any()):
            break
        reg = F.smooth_l1_loss(pred[valid], target[valid])             # over (N, H)
        ce_pos = valid & kl_pos                                        # (B, L)
        if not bool(ce_pos.any()):
            total = total + cfg.ttt_decay ** (s - 1) * cfg.w_reg * reg
            break
        p = p_all[ce_pos[kl_pos]]                                      # (K_s, V)
        with _lm_precision(cfg, device):
            logits_q = lm_head(pred[ce_pos]).float()                   # (K_s, V) draft logits
        ce = F.cross_entropy(logits_q, p)                              # soft targets: -Σ p log q
        weight = cfg.ttt_decay ** (s - 1)
        total = total + weight * (cfg.w_reg * reg + cfg.w_kl * ce)
        with torch.no_grad():
            acc = (logits_q.argmax(-1) == p.argmax(-1)).float().mean()    # top-1 agreement
            entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean()   # H(p): CE - H(p) = KL
        stats.update({f"reg{s}": reg.item(), f"kl{s}": (ce - entropy).item(), f"acc{s}": acc.item()})
        # next step reads f̂[j] at position j: this step's prediction shifted right by one
        f_in = torch.cat([torch.zeros_like(pred[:, :1]), pred[:, :-1]], 1)  # (B, L, H)
    stats["loss"] = total.item()
    return total, stats
