"""Medusa's heads (Cai et al., 2401.10774): k extra decoding heads on the target's last hidden
state, as weights and their published layout. The drafting that reads them (which feature,
which tree) is ``app/engine/drafters/medusa.py``; ``app/train/medusa.py`` trains them.

Head k (1-based) reads the target's feature h[t] and predicts the token k + 1 positions later
(the target's own LM head predicts the next one). Each head, in the published layout
(FasterDecoding/Medusa, ``medusa_lm_head``):

    h ─► ResBlock: h + SiLU(W1 h + b1)  (x medusa_num_layers)  ─► Linear(H, V, no bias) ─► logits

saved as ``{k}.{l}.linear.weight`` / ``{k}.{l}.linear.bias`` for the residual blocks and
``{k}.{L}.weight`` for the LM head (k = head, l = block, L = medusa_num_layers), with a
config.json holding ``medusa_num_heads`` and ``medusa_num_layers``. The published recipe
initialises W1 to zero and each LM head from the target's, so an untrained head starts as
the target's own next-token head.

One extension: a head's LM head may cover only a draft vocabulary (``draft_vocab.json``
beside the weights, as the shipped EAGLE head has): its rows are then those tokens' rows,
which makes the heads several times smaller and cheaper on a CPU. Keys are unchanged.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from app.engine.heads import load_draft_vocab

WEIGHTS_FILE = "medusa_lm_head.safetensors"
LEGACY_WEIGHTS_FILE = "medusa_lm_head.pt"          # the Medusa-1 release's torch.save of the same state dict


class ResBlock(nn.Module):
    """h + SiLU(W h + b): Medusa's residual block (W starts at zero: the identity)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.ModuleList):
    """``medusa_num_heads`` heads, each ``nn.Sequential(ResBlock x L, Linear(H, V))``.

    A ModuleList, so the state dict's keys are exactly the published ``{k}.{l}...`` ones.
    ``vocab_ids`` (Vd,) maps LM-head rows to token ids when the heads cover a draft
    vocabulary (None: row = token id); it is not a weight and is saved beside them."""

    def __init__(self, hidden: int, vocab: int, num_heads: int, num_layers: int = 1,
                 vocab_ids: torch.Tensor | None = None):
        super().__init__([nn.Sequential(*[ResBlock(hidden) for _ in range(num_layers)],
                                        nn.Linear(hidden, vocab, bias=False)) for _ in range(num_heads)])
        self.hidden, self.vocab, self.num_layers = hidden, vocab, num_layers
        self.vocab_ids = vocab_ids
        self.base_model = ""

    @property
    def num_heads(self) -> int:
        return len(self)

    def forward(self, features: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """(..., H) features -> (K, ..., V or Vd) logits of the first ``heads`` heads."""
        return torch.stack([head(features) for head in list(self)[: heads or len(self)]])

    @classmethod
    def from_target(cls, target_model, num_heads: int, num_layers: int = 1,
                    vocab_ids: torch.Tensor | None = None) -> "MedusaHeads":
        """The published initialisation: zero residual blocks, LM heads copied from the target's."""
        weight = target_model.get_output_embeddings().weight.detach()                     # (V, H)
        if vocab_ids is not None:
            weight = weight.index_select(0, vocab_ids.to(weight.device))
        heads = cls(weight.shape[1], weight.shape[0], num_heads, num_layers, vocab_ids)
        with torch.no_grad():
            for head in heads:
                for block in list(head)[:-1]:
                    block.linear.weight.zero_()
                    block.linear.bias.zero_()
                head[-1].weight.copy_(weight.float())
        heads.base_model = getattr(target_model.config, "_name_or_path", "")
        return heads

    # --- checkpoint I/O in the published layout -----------------------------------------------

    def config(self) -> dict:
        return {"medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers,
                "hidden_size": self.hidden, "vocab_size": self.vocab, "base_model_name_or_path": self.base_model}

    def save(self, folder: str | Path, dtype: torch.dtype | None = None) -> None:
        """config.json + the weights (``dtype``: e.g. float16 to ship them at half the size;
        ``load`` casts to the target's dtype) + draft_vocab.json when the heads have one."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.config(), indent=2, sort_keys=True) + "\n")
        state = {k: v.detach().cpu().to(dtype or v.dtype).contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        if self.vocab_ids is not None:
            (folder / "draft_vocab.json").write_text(json.dumps({"token_ids": self.vocab_ids.tolist()}) + "\n")

    @classmethod
    def load(cls, folder: str | Path, dtype: torch.dtype = torch.float32, device="cpu",
             target_vocab: int | None = None) -> "MedusaHeads":
        """Strict load: every key of the layout present, no other key, every shape as configured."""
        folder = Path(folder)
        config_path = folder / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"Medusa heads folder {folder} has no config.json")
        raw = json.loads(config_path.read_text())
        for key in ("medusa_num_heads", "hidden_size", "vocab_size"):
            if not isinstance(raw.get(key), int) or raw[key] < 1:
                raise ValueError(f"{config_path}: {key} must be a positive integer, got {raw.get(key)!r}")
        if (folder / WEIGHTS_FILE).is_file():
            state = load_file(str(folder / WEIGHTS_FILE))
        elif (folder / LEGACY_WEIGHTS_FILE).is_file():
            state = torch.load(str(folder / LEGACY_WEIGHTS_FILE), map_location="cpu", weights_only=True)
        else:
            raise FileNotFoundError(f"Medusa heads folder {folder} has neither {WEIGHTS_FILE} nor {LEGACY_WEIGHTS_FILE}")
        vocab_ids = None
        if (folder / "draft_vocab.json").is_file():
            vocab_ids = load_draft_vocab(folder, target_vocab or 2**31 - 1)
            if len(vocab_ids) != raw["vocab_size"]:
                raise ValueError(f"{folder}: draft_vocab.json has {len(vocab_ids)} tokens, vocab_size is {raw['vocab_size']}")
        heads = cls(raw["hidden_size"], raw["vocab_size"], raw["medusa_num_heads"],
                    int(raw.get("medusa_num_layers", 1)), vocab_ids)
        heads.base_model = raw.get("base_model_name_or_path", "")
        own = heads.state_dict()
        missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
        if missing or unexpected:
            raise KeyError(f"Medusa heads in {folder} do not match the published layout: "
                           f"missing keys {missing}, unexpected keys {unexpected}")
        for key, tensor in state.items():
            if tuple(tensor.shape) != tuple(own[key].shape):
                raise ValueError(f"Medusa key {key} has shape {tuple(tensor.shape)}, config expects {tuple(own[key].shape)}")
        heads.load_state_dict(state, strict=True)
        heads = heads.to(device=device, dtype=dtype).eval()
        if heads.vocab_ids is not None:
            heads.vocab_ids = heads.vocab_ids.to(device)
        return heads
