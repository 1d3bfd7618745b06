"""Draft heads: the trained modules that propose tokens from the target's features, and their
checkpoints. ``load_head`` here is the one place that tells the EAGLE kinds apart.

    checkpoint.py    the checkpoint I/O both EAGLE kinds share: config.json and weights read
                     strictly, configs written for older readers, ``is_eagle3``
    eagle.py         the EAGLE-1/2 head (``DraftHead``, ``head_config_for``)
    eagle3.py        the EAGLE-3 head (``Eagle3Head``; builds on eagle.py's config and embedding)
    speculators.py   either EAGLE kind in vLLM's speculators layout (read by ``load_head``,
                     written by ``python -m app export-head``)
    medusa.py        Medusa's heads (``MedusaHeads``): the weights and their published layout;
                     the drafting that reads them is ``app/engine/drafters/medusa.py``
    __init__.py      ``load_head`` (either EAGLE kind, either layout) and the draft vocabulary
                     a head may ship beside it (``draft_vocab.json``: ``load_draft_vocab``)

Imports run one way: checkpoint <- eagle <- eagle3, checkpoint <- speculators, and this file
imports those four; medusa.py imports this file (the draft vocabulary) and nothing imports it
back, so ``load_head`` never loads Medusa. Nothing here imports the engine, the drafters or
the tree: a head is a module and its files. Choosing a head's folder (the shipped ones, hub
ids) and checking it against the target is ``app/engine/loading.py``'s (``load_draft_head``,
``load_medusa_heads``).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from app.engine.heads.checkpoint import is_eagle3, read_config, read_state_dict
from app.engine.heads.eagle import DraftHead
from app.engine.heads.eagle3 import Eagle3Head
from app.engine.heads.speculators import is_speculators, to_eagle_layout

DRAFT_VOCAB_FILE = "draft_vocab.json"


def load_head(folder: str | Path, target_num_layers: int, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu"):
    """A draft head of either kind, told apart by its checkpoint: an EAGLE-3 head
    (``eagle3.Eagle3Head``) or an EAGLE-1/2 head (``eagle.DraftHead``), loaded strictly, in the
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
