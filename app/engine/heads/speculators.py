"""EAGLE heads in vLLM's ``speculators`` layout, both ways (read by ``app.engine.heads.load_head``,
written by ``python -m app export-head``).

A speculators checkpoint is told apart by ``speculators_model_type`` in its config.json. The
config wraps one decoder layer's transformers config and says which algorithm and verifier
the head belongs to:

    {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
     "transformer_layer_config": {LlamaConfig of the draft layer, vocab_size = the target's},
     "draft_vocab_size": Vd, "norm_before_residual": false, "target_hidden_size": null,
     "eagle_aux_hidden_state_layer_ids": [low, mid, high] or null (the reader's default),
     "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
         "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, ...}],
         "verifier": {"name_or_path": ..., "architectures": [...]}}}

Weights, ours (official EAGLE layout) -> speculators:

    EAGLE-3   midlayer.*  -> layers.0.*   (fc, norm, lm_head, d2t, t2d and a carried
              embed_tokens keep their names; d2t/t2d are left out when Vd = V, where
              speculators keeps no map, and read back as the identity)
    EAGLE-1/2 fc.*        -> fusion_fc.*  (``fusion_bias`` = our ``bias`` flag)
              layers.0.*  -> transformer.*  (the decoder layer without input norm:
              ``layernorms: false``); speculators_model_type "eagle", architectures
              ["EagleSpeculator", "LlamaDecoderLayer"]

speculators 0.9.0 has only the eagle3 class (also dflash, mtp, peagle, ...): its EAGLE-1/2/HASS
class ``EagleSpeculator`` (type "eagle", fields above) was in earlier releases and vLLM no longer
reads that type. The "eagle" layout here is that earlier class's, so such heads travel and
come back, but only this app (or an older speculators) reads them.

An EAGLE-1/2 head's reduced draft vocabulary (``draft_vocab.json``) has no field in either
speculators layout (its LM head is the target's, whole): the file is copied beside the
exported head, where ``load_engine`` finds it as it does beside an official-layout head.

What our heads cannot run is refused in one line naming the field: another model type, a
speculators config for another decoder (``transformer_layer_config.model_type`` not llama), more
than one draft layer, and the EAGLE-3 variants (``norm_before_residual``, ``norm_before_fc``,
``fc_norm``, ``norm_output``) or EAGLE ``layernorms``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from app.engine.heads.checkpoint import config_for_disk, write_checkpoint

SPECULATORS_VERSION = "0.9.0"   # the library release whose config classes this layout follows
SUPPORTED = ("eagle", "eagle3")
EAGLE3_ARCH = "Eagle3Speculator"
EAGLE_ARCHS = ["EagleSpeculator", "LlamaDecoderLayer"]
DEFAULT_VERIFIER = "HuggingFaceTB/SmolLM2-135M-Instruct"
_EAGLE3_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
# one list per kind: (our prefix, speculators prefix)
_RENAMES = {"eagle3": [("midlayer.", "layers.0.")],
            "eagle": [("fc.", "fusion_fc."), ("layers.0.", "transformer.")]}
# config fields ours carries that are not the decoder layer's
_OWN_FIELDS = ("architectures", "bias", "draft_vocab_size", "eagle_config", "target_hidden_size")


def is_speculators(config: dict) -> bool:
    return "speculators_model_type" in config


def layer_ids_of(raw: dict) -> list[int] | None:
    """The target layers an EAGLE-3 config names, in either layout (None: the reader's default)."""
    ids = raw.get("eagle_aux_hidden_state_layer_ids") if is_speculators(raw) \
        else (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return [int(i) for i in ids] if ids else None


def _rename(state: dict[str, torch.Tensor], pairs, reverse: bool = False) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        for ours, theirs in pairs:
            src, dst = (theirs, ours) if reverse else (ours, theirs)
            if key.startswith(src):
                key = dst + key[len(src):]
                break
        out[key] = value
    return out


# --- speculators -> ours (the official EAGLE layout, then loaded as any other head) ------------

def to_eagle_layout(folder: Path, raw: dict, state: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """A speculators config and state dict as the official layout's (config.json dict, state)."""
    kind = raw.get("speculators_model_type")
    where = f"speculators head {folder}"
    if kind not in SUPPORTED:
        raise ValueError(f"{where}: speculators_model_type {kind!r} is not supported "
                         f"(EAGLE Lens reads {' and '.join(SUPPORTED)})")
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"{where}: config.json has no transformer_layer_config")
    if layer.get("model_type", "llama") != "llama":
        raise ValueError(f"{where}: transformer_layer_config.model_type {layer['model_type']!r} is not supported "
                         "(EAGLE Lens runs Llama-style draft layers)")
    config = {k: v for k, v in layer.items() if k not in _OWN_FIELDS}
    if kind == "eagle3":
        if layer.get("num_hidden_layers", 1) != 1:
            raise ValueError(f"{where}: {layer['num_hidden_layers']} draft layers; EAGLE Lens runs one")
        for flag in _EAGLE3_FLAGS:
            if raw.get(flag):
                raise ValueError(f"{where}: {flag} true is not supported (EAGLE Lens runs the reference EAGLE-3 layer)")
        if "draft_vocab_size" not in raw:
            raise ValueError(f"{where}: config.json has no draft_vocab_size")
        vd, vocab = int(raw["draft_vocab_size"]), int(config.get("vocab_size", 0))
        config.update(num_hidden_layers=1, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=vd)
        if raw.get("target_hidden_size") is not None:
            config["target_hidden_size"] = raw["target_hidden_size"]
        if raw.get("eagle_aux_hidden_state_layer_ids"):
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(raw["eagle_aux_hidden_state_layer_ids"])}
        state = _rename(state, _RENAMES[kind], reverse=True)
        if vd == vocab and "d2t" not in state and "t2d" not in state:   # no map kept: the identity
            state["d2t"] = torch.zeros(vd, dtype=torch.long)
            state["t2d"] = torch.ones(vocab, dtype=torch.bool)
    else:
        if raw.get("layernorms"):
            raise ValueError(f"{where}: layernorms true is not supported (EAGLE heads have no extra norms)")
        config.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], bias=bool(raw.get("fusion_bias")))
        state = _rename(state, _RENAMES[kind], reverse=True)
    return config, state


# --- ours -> speculators -------------------------------------------------------------------

def verifier_config(name: str | None) -> dict:
    """speculators' VerifierConfig: the name, and the architectures from its config.json when
    ``name`` is a local folder (Llama otherwise: the only targets these heads run on)."""
    name = name or DEFAULT_VERIFIER
    archs = ["LlamaForCausalLM"]
    local = Path(name).expanduser() / "config.json"
    if local.is_file():
        archs = json.loads(local.read_text()).get("architectures") or archs
    return {"name_or_path": name, "architectures": list(archs)}


def speculators_config(head, verifier: str | None, layer_ids: list[int] | None,
                       speculative_tokens: int = 3) -> dict:
    """The speculators config.json of a loaded head (``app.engine.heads.load_head``)."""
    eagle3 = getattr(head, "kind", "eagle2") == "eagle3"
    layer = {k: v for k, v in config_for_disk(head.config).items() if k not in _OWN_FIELDS}
    layer["num_hidden_layers"] = 1
    algorithm = "eagle3" if eagle3 else "eagle"
    out = {
        "speculators_model_type": algorithm,
        "speculators_version": SPECULATORS_VERSION,
        "architectures": [EAGLE3_ARCH] if eagle3 else list(EAGLE_ARCHS),
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": algorithm,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": verifier_config(verifier),
        },
    }
    if eagle3:
        out.update(draft_vocab_size=int(head.config.draft_vocab_size), norm_before_residual=False,
                   norm_before_fc=False, fc_norm=False, norm_output=False, embed_requires_grad=False,
                   target_hidden_size=None,
                   eagle_aux_hidden_state_layer_ids=list(layer_ids) if layer_ids else None)
    else:
        out.update(transformer_layer_architecture="LlamaDecoderLayer", layernorms=False,
                   fusion_bias=bool(getattr(head.config, "bias", True)))
    return out


def speculators_state(head) -> dict[str, torch.Tensor]:
    eagle3 = getattr(head, "kind", "eagle2") == "eagle3"
    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    if eagle3 and head.config.draft_vocab_size == head.config.vocab_size \
            and torch.equal(head.draft_token_ids().cpu(), torch.arange(head.config.vocab_size)):
        state.pop("d2t"), state.pop("t2d")        # speculators keeps no map for a full vocabulary
    return _rename(state, _RENAMES["eagle3" if eagle3 else "eagle"])


def save(head, folder: str | Path, fmt: str, *, verifier: str | None = None,
         layer_ids: list[int] | None = None, source: str | Path | None = None,
         dtype: torch.dtype | None = None) -> Path:
    """Write a loaded head in ``fmt`` ("speculators" or "eagle", the official layout).
    ``layer_ids``: an EAGLE-3 head's target layers as its source config gave them (None: the
    reader's default). ``source``: the head's folder, whose draft_vocab.json is copied along.
    ``dtype``: the weights' dtype on disk (None: as loaded), e.g. the source's bfloat16."""
    folder = Path(folder)
    if fmt == "speculators":
        write_checkpoint(folder, speculators_config(head, verifier, layer_ids), speculators_state(head), dtype)
    elif fmt == "eagle":
        config = config_for_disk(head.config)
        config["num_hidden_layers"] = 1
        if getattr(head, "kind", "eagle2") == "eagle3":
            config.pop("bias", None)
            config["architectures"] = ["LlamaForCausalLMEagle3"]
            config["draft_vocab_size"] = int(head.config.draft_vocab_size)
            if layer_ids:
                config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}
        else:
            config["bias"] = bool(getattr(head.config, "bias", True))
            config["architectures"] = ["LlamaForCausalLM"]
        write_checkpoint(folder, config, {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()},
                         dtype)
    else:
        raise ValueError(f"format must be speculators or eagle, got {fmt!r}")
    vocab = Path(source) / "draft_vocab.json" if source is not None else None
    if vocab is not None and vocab.is_file() and getattr(head, "kind", "eagle2") != "eagle3":
        shutil.copyfile(vocab, folder / "draft_vocab.json")
    return folder
