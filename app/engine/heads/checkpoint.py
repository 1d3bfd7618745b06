"""Checkpoint I/O both EAGLE kinds share: a head folder's config.json and weights, read
strictly, and the config written back so that older readers agree on it.

    read_config       config.json as a dict (no LlamaConfig yet: the kind is not known)
    read_state_dict   model.safetensors, or pytorch_model.bin with weights_only=True
    is_eagle3         tells the two kinds apart from (config, state)
    config_from_disk  a LlamaConfig, refusing a top-level rope_theta that disagrees with rope_parameters
    config_for_disk   the config.json dict, with the top-level RoPE fields older readers look for
    check_keys        exactly the head's keys, each with its shape

Used by ``eagle.DraftHead`` and ``eagle3.Eagle3Head`` (their ``from_checkpoint`` and ``save``),
by ``load_head`` in this package's ``__init__``, by ``speculators`` when it writes either kind,
and by ``python -m app export-head``. Knows neither head class.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig


def read_config(folder: Path) -> dict:
    """config.json of a head folder, as a dict."""
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"draft head folder {folder} has no config.json")
    return json.loads(path.read_text())


def config_for_disk(config: LlamaConfig) -> dict:
    """The head's config.json: transformers' own dict plus the top-level RoPE fields that
    readers older than transformers 5 look for. transformers 5 keeps the RoPE base only in
    ``rope_parameters``; an older reader (the EAGLE reference code among them) then finds no
    ``rope_theta`` and silently falls back to base 10,000, a different position encoding
    from the one the head was trained with (SmolLM2's base is 100,000)."""
    out = config.to_dict()
    out.pop("_attn_implementation_autoset", None)
    rope = dict(out.get("rope_parameters") or {})
    if "rope_theta" in rope:
        out["rope_theta"] = rope["rope_theta"]
        kind = rope.get("rope_type", "default")
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        out["rope_scaling"] = None if kind == "default" else {**scaling, "type": kind}
    return out


def config_from_disk(folder: Path, raw: dict) -> LlamaConfig:
    """A LlamaConfig from config.json. A top-level ``rope_theta`` (older readers' field) must
    agree with ``rope_parameters`` when both are given: transformers 5 would silently keep
    the latter."""
    config = LlamaConfig.from_dict(raw)
    top, nested = raw.get("rope_theta"), (raw.get("rope_parameters") or {}).get("rope_theta")
    if top is not None and nested is not None and float(top) != float(nested):
        raise ValueError(f"draft head {folder}: config.json has rope_theta {top} but rope_parameters "
                         f"says {nested}")
    return config


def check_keys(folder: Path, head: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Every key the head has is in ``state`` with its shape, and no other key is."""
    own = head.state_dict()
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys {missing}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected}")
        kind = "EAGLE-3" if getattr(head, "kind", "eagle2") == "eagle3" else "EAGLE"
        raise KeyError(f"draft head checkpoint in {folder} does not match the {kind} layout: " + "; ".join(parts))
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[key].shape):
            raise ValueError(f"draft head key {key} has shape {tuple(tensor.shape)}, "
                             f"config expects {tuple(own[key].shape)}")


def is_eagle3(config: dict, state: dict) -> bool:
    """An EAGLE-3 checkpoint (2503.01840's layout): its architecture name, the draft-to-target
    vocabulary maps or the two-input decoder layer ``midlayer``."""
    named = any("eagle3" in str(a).lower() for a in config.get("architectures") or [])
    return named or "d2t" in state or "t2d" in state or any(k.startswith("midlayer.") for k in state)


def write_checkpoint(folder: Path, config: dict, state: dict[str, torch.Tensor],
                     dtype: torch.dtype | None = None) -> None:
    """Write ``config.json`` and ``model.safetensors`` into ``folder`` (made if missing);
    ``dtype`` casts the floating-point weights (bfloat16 halves a shipped head's bytes;
    integer and bool tables such as EAGLE-3's d2t / t2d keep their types)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Read model.safetensors, or pytorch_model.bin with weights_only=True (no code is unpickled)."""
    st = folder / "model.safetensors"
    pt = folder / "pytorch_model.bin"
    if st.is_file():
        return load_file(str(st))
    if pt.is_file():
        return torch.load(str(pt), map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"draft head folder {folder} has neither model.safetensors nor pytorch_model.bin")
