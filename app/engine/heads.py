"""Reading any draft head from its folder: the one place that tells the kinds apart.

    draft_head.py    the EAGLE-1/2 head and the checkpoint I/O both EAGLE kinds share
    eagle3_head.py   the EAGLE-3 head (imports draft_head)
    speculators_format.py   either kind in vLLM's speculators layout (read here, written by export-head)
    drafters/medusa.py   Medusa heads (their own layout; the draft vocabulary file below)

``load_head`` imports both EAGLE kinds, so neither of their modules needs the other's back.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from app.engine.draft_head import DraftHead, is_eagle3, read_config, read_state_dict
from app.engine.eagle3_head import Eagle3Head
from app.engine.speculators_format import is_speculators, to_eagle_layout

DRAFT_VOCAB_FILE = "draft_vocab.json"


def load_head(folder: str | Path, target_num_layers: int, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu"):
    """A draft head of either kind, told apart by its checkpoint: an EAGLE-3 head
    (``eagle3_head.Eagle3Head``) or an EAGLE-1/2 head (``DraftHead``), loaded strictly, in the
    official EAGLE layout or vLLM's speculators layout (``speculators_model_type`` in config.json).
    ``target_num_layers``: the target's layer count (an EAGLE-3 head reads three of them)."""
    folder = Path(folder)
    raw = read_config(folder)
    state = read_state_dict(folder)
    if is_speculators(raw):
        raw, state = to_eagle_layout(folder, raw, state)
    if is_eagle3(raw, state):
        head = Eagle3Head.from_checkpoint(folder, raw, state, target_num_layers)
    else:
        head = DraftHead.from_checkpoint(folder, raw, state)
    return head.to(device=device, dtype=dtype).eval()


def load_draft_vocab(folder: str | Path | None, vocab_size: int) -> torch.Tensor | None:
    """The optional reduced draft vocabulary shipped beside a head (``draft_vocab.json``:
    {"token_ids": [...], ...}). Returns None when the folder has none."""
    if folder is None:
        return None
    path = Path(folder) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    ids = json.loads(path.read_text()).get("token_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and 0 <= i < vocab_size for i in ids) \
            or len(set(ids)) != len(ids):
        raise ValueError(f"{path}: token_ids must be a non-empty list of distinct token ids in [0, {vocab_size})")
    return torch.tensor(sorted(ids), dtype=torch.long, device="cpu")   # the Engine moves it to the model
