"""The self-distilled data as token ids: the part of the training state that is kept in git.

A feature shard (``data.FeatureShard``) is ~100 MB: 64 conversations with the target's
hidden states at every token (EAGLE-3: four of them). Those states are a pure function of the
token ids and the target, so only the ids need to survive a machine:

    <ids dir>/shard_00012.npz     one per feature shard, ~30 KB (np.savez_compressed)
        tokens       (N,) uint16   all conversations of the shard, concatenated
        lengths      (S,) uint32   conversation s is the next lengths[s] tokens
        prompt_lens  (S,) uint32   its first prompt_lens[s] tokens are the prompt
        mode         ()   str      how the responses were decoded, e.g. "sampled@0.7"
    <ids dir>/SHA256SUMS          ``sha256sum -c`` format, one line per shard file

On a new machine ``features_from_ids`` recomputes a shard's features in one causal forward
per batch of conversations (no decoding: several times faster than answering the prompts
again), and ``python -m app train --stage data`` does that for every committed shard before
it answers new prompts (app/train/cli.py).

The ids are uint16 because the targets we train for have vocabularies below 65,536
(SmolLM2: 49,152); ``save_ids`` refuses a token that does not fit.
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from filelock import FileLock

from app.engine.fused import layer_inputs
from app.train.data import FeatureShard, shard_index

SUMS_FILE = "SHA256SUMS"


@dataclass
class IdShard:
    """The token ids of one shard's conversations (see the module doc)."""

    tokens: np.ndarray       # (N,) uint16
    lengths: np.ndarray      # (S,) uint32
    prompt_lens: np.ndarray  # (S,) uint32
    mode: str = ""

    def __len__(self) -> int:
        return int(self.lengths.size)

    @property
    def response_tokens(self) -> int:
        return int(self.lengths.sum() - self.prompt_lens.sum())

    def conversations(self) -> list[np.ndarray]:
        """Each conversation's ids, (T_s,) uint16, in order."""
        ends = np.cumsum(self.lengths)
        return np.split(self.tokens, ends[:-1])

    @classmethod
    def of(cls, shard: FeatureShard) -> "IdShard":
        """The ids of a feature shard (its features dropped)."""
        if int(shard.tokens.max()) >= 2**16 or int(shard.tokens.min()) < 0:
            raise ValueError("token ids do not fit uint16: this target's vocabulary is too large for the id store")
        return cls(tokens=shard.tokens.numpy().astype(np.uint16),
                   lengths=torch.diff(shard.offsets).numpy().astype(np.uint32),
                   prompt_lens=shard.prompt_lens.numpy().astype(np.uint32), mode=shard.mode)

    def save(self, path: Path) -> None:
        """Write atomically (a temporary name, then a rename), as the feature shards are."""
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.savez_compressed(buf, tokens=self.tokens, lengths=self.lengths, prompt_lens=self.prompt_lens,
                            mode=np.array(self.mode))
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(buf.getvalue())
        tmp.rename(path)

    @classmethod
    def load(cls, path: Path) -> "IdShard":
        with np.load(path) as z:
            return cls(tokens=z["tokens"], lengths=z["lengths"], prompt_lens=z["prompt_lens"], mode=str(z["mode"]))


def id_path(ids_dir: Path, feature_path: Path) -> Path:
    """The id shard that belongs to a feature shard (same stem)."""
    return ids_dir / (feature_path.name.split(".")[0] + ".npz")


def kept_shards(ids_dir: Path) -> list[int]:
    """The indices of the shards whose token ids are kept in ``ids_dir`` (``shard_00012.npz`` -> 12)."""
    return sorted(shard_index(p.name) for p in Path(ids_dir).glob("shard_*.npz"))


# --- checksums -------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_checksums(ids_dir: Path) -> Path:
    """Rewrite ``SHA256SUMS`` from the shard files present (under a lock: two data workers
    may finish a shard at the same moment)."""
    sums = ids_dir / SUMS_FILE
    with FileLock(str(sums) + ".lock"):
        lines = [f"{sha256(p)}  {p.name}\n" for p in sorted(ids_dir.glob("shard_*.npz"))]
        tmp = sums.with_name(SUMS_FILE + ".tmp")
        tmp.write_text("".join(lines))
        tmp.rename(sums)
    Path(str(sums) + ".lock").unlink(missing_ok=True)
    return sums


def check_checksums(ids_dir: Path) -> list[str]:
    """What is wrong with the id store, one line each ([] when every shard file is listed in
    ``SHA256SUMS`` with its hash and every listed file is present)."""
    sums = ids_dir / SUMS_FILE
    if not sums.is_file():
        return [f"{sums} is missing"]
    listed = {}
    for line in sums.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name.strip()] = digest
    problems = []
    present = {p.name for p in ids_dir.glob("shard_*.npz")}
    for name in sorted(present - listed.keys()):
        problems.append(f"{name} is not in {SUMS_FILE}")
    for name, digest in sorted(listed.items()):
        if name not in present:
            problems.append(f"{name} is listed in {SUMS_FILE} but missing")
        elif sha256(ids_dir / name) != digest:
            problems.append(f"{name} does not match its checksum")
    return problems


def export_ids(features_dir: Path, ids_dir: Path) -> list[Path]:
    """Write the id shard of every feature shard that has none yet; returns the new files."""
    new = []
    for fp in sorted(features_dir.glob("shard_*.safetensors")):
        ip = id_path(ids_dir, fp)
        if not ip.is_file():
            IdShard.of(FeatureShard.load(fp)).save(ip)
            new.append(ip)
    if new or not (ids_dir / SUMS_FILE).is_file():
        write_checksums(ids_dir)
    return new


# --- features from ids ----------------------------------------------------------------------

@torch.no_grad()
def features_from_ids(model, ids: IdShard, layers: tuple[int, ...] = (), batch_tokens: int = 8192) -> FeatureShard:
    """The feature shard of ``ids``, recomputed: the target's final feature f (and, with
    ``layers``, EAGLE-3's layer inputs) at every token, as the data stage recorded them while
    answering. Causal attention makes the state at token j depend on tokens <= j only, so a
    batch of right-padded conversations needs no attention mask and its pads change nothing.
    Conversations go through in length order, ``batch_tokens`` padded tokens a forward.

    The values agree with the recorded ones up to the dtype's rounding (the batch shapes
    differ), far below the input noise training adds."""
    lm_head = model.get_output_embeddings()
    device = lm_head.weight.device
    body = getattr(model, model.base_model_prefix)                  # decoder stack + final norm
    convs = ids.conversations()
    order = sorted(range(len(convs)), key=lambda s: len(convs[s]))
    feats: list[torch.Tensor | None] = [None] * len(convs)
    taps: list[torch.Tensor | None] = [None] * len(convs)
    i = 0
    while i < len(order):
        j = i + 1                                                    # take rows while the padded batch fits
        while j < len(order) and (j - i + 1) * len(convs[order[j]]) <= batch_tokens:
            j += 1
        rows = order[i:j]
        width = len(convs[rows[-1]])
        batch = torch.zeros(len(rows), width, dtype=torch.long)      # (b, T) right-padded with id 0
        for r, s in enumerate(rows):
            batch[r, :len(convs[s])] = torch.from_numpy(convs[s].astype(np.int64))
        out = body(input_ids=batch.to(device), use_cache=False, output_hidden_states=bool(layers))
        g = layer_inputs(out.hidden_states, layers) if layers else None     # (b, T, 3H)
        for r, s in enumerate(rows):
            n = len(convs[s])
            feats[s] = out.last_hidden_state[r, :n].to("cpu", torch.float16)   # (T_s, H)
            if layers:
                taps[s] = g[r, :n].to("cpu", torch.float16)                           # (T_s, 3H)
        i = j
    offsets = torch.zeros(len(convs) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(torch.from_numpy(ids.lengths.astype(np.int64)), 0)
    return FeatureShard(tokens=torch.from_numpy(ids.tokens.astype(np.int32)), features=torch.cat(feats),
                        offsets=offsets, prompt_lens=torch.from_numpy(ids.prompt_lens.astype(np.int64)),
                        mode=ids.mode, layer_features=torch.cat(taps) if layers else None, layers=tuple(layers))
