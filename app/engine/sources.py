"""Where models come from, decided from their names alone: the embedded target's aliases, the
shipped heads' folders, the rule that tells a local folder from a hub id, and the device
names we accept.

Nothing here imports torch or transformers, so the command line can refuse a misspelt device
or a folder that does not exist in a fraction of a second, before it pays ~5-10 s of imports
and model loading (``check_before_loading``). ``loading`` applies the same rules when it loads.
"""
from __future__ import annotations

import re
from pathlib import Path

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_ALIASES = (None, "", "embedded", EMBEDDED_NAME, EMBEDDED_HUB_ID)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_HEAD_DIR = REPO_ROOT / "models" / "eagle-smollm2-135m-instruct"
DEFAULT_MEDUSA_DIR = REPO_ROOT / "models" / "medusa-smollm2-135m-instruct"
# Heads shipped for the embedded model, by the name a user may give instead of a folder.
SHIPPED_HEADS = {"eagle2": DEFAULT_HEAD_DIR, "eagle3": REPO_ROOT / "models" / "eagle3-smollm2-135m-instruct"}
DEFAULTS = (None, "", "default")        # "the shipped one" for --draft-model and --medusa-model

_DEVICE = re.compile(r"auto|cpu(:\d+)?|cuda(:\d+)?")


def check_device_name(device: str | None) -> None:
    """ValueError unless ``device`` is auto, cpu or cuda[:N] (None and "" mean auto)."""
    if device not in (None, "") and not _DEVICE.fullmatch(device):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {device!r}")


def local_folder(name: str, what: str) -> Path | None:
    """The folder ``name`` names, or None when it reads as a hub id ("org/name").

    A name that exists must be a folder; one that looks like a path (starts with / ./ ../ ~
    or has two slashes) and does not exist raises FileNotFoundError, since asking the hub
    for it would only fail later and less clearly. ``what`` names it in the message."""
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise FileNotFoundError(f"{what} path {name} is not a folder")
        return path
    if name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:
        raise FileNotFoundError(f"{what} folder {name} does not exist")
    return None


def shipped_head_folder(name: str | None) -> Path | None:
    """The shipped head ``name`` stands for (the default, or "eagle2" / "eagle3"), None for
    any other name; FileNotFoundError, saying how to get one, when it is not on disk."""
    if name not in DEFAULTS and name not in SHIPPED_HEADS:
        return None
    folder = SHIPPED_HEADS.get(name, DEFAULT_HEAD_DIR)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no trained draft head at {folder}: train one with `python -m app train` "
                                "or pass --draft-model FOLDER_OR_HUB_ID")
    return folder


def medusa_folder(name: str | None) -> Path:
    """The Medusa heads' folder (the shipped ones by default); FileNotFoundError when it holds none."""
    folder = DEFAULT_MEDUSA_DIR if name in DEFAULTS else Path(name).expanduser()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no Medusa heads at {folder}: train them with `python -m app train --arch medusa` "
                                "or pass --medusa-model FOLDER")
    return folder


def check_before_loading(base_model: str | None, draft_model: str | None, device: str | None, *,
                         head: bool, medusa: bool, medusa_model: str | None = None) -> None:
    """Every check that needs no import and no download: the device's spelling, and that the
    local folders named (target, head when ``head``, Medusa heads when ``medusa``) exist.
    Raises what loading would raise, only sooner."""
    check_device_name(device)
    if base_model not in EMBEDDED_ALIASES:
        local_folder(base_model, "model")
    if head and shipped_head_folder(draft_model) is None:
        local_folder(draft_model, "draft model")
    if medusa:
        medusa_folder(medusa_model)
