"""Build the reduced draft vocabulary shipped beside a head (``draft_vocab.json``).

The head may propose only the ``size`` tokens the target writes most often in its own
self-distilled responses (EAGLE-3 keeps a frequent-token draft vocabulary for the same
reason). On a CPU the draft's LM head reads the whole (V, H) matrix at every draft level;
with V = 49,152 that is ~113 MB in float32 per level, about as many bytes as the target's
attention layers, so cutting it to 8k tokens makes drafting several times cheaper while
the tokens left out are rare in answers. Verification never uses this set: output stays
lossless.

The training stage builds it by default (``--loss-vocab draft``: the loss is taken over these
tokens, from the training shards only, and the file is written beside the head). The command
below is for a head trained with ``--loss-vocab full``, which can still be given a vocabulary
afterwards:

    python -m app.train.draft_vocab --work-dir ~/.cache/eagle-lens/train/SmolLM2-135M-Instruct \
        --out models/eagle-smollm2-135m-instruct --size 8192
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from safetensors import safe_open

from app.engine.loading import DRAFT_VOCAB_FILE


def count_response_tokens(source: Path | list[Path]) -> Counter:
    """Token counts over the response part of every stored conversation: of every shard
    under ``source``/features, or of the given shard files."""
    counts: Counter = Counter()
    paths = sorted((Path(source) / "features").glob("shard_*.safetensors")) \
        if isinstance(source, (str, Path)) else list(source)
    for path in paths:
        with safe_open(str(path), "pt") as f:
            tokens = f.get_tensor("tokens").tolist()
            offsets = f.get_tensor("offsets").tolist()
            prompt_lens = f.get_tensor("prompt_lens").tolist()
        for s, plen in enumerate(prompt_lens):
            counts.update(tokens[offsets[s] + plen: offsets[s + 1]])
    return counts


def build(source: Path | list[Path], size: int, always: tuple[int, ...] = ()) -> dict:
    """The ``size`` most frequent response tokens (plus ``always``) of a work dir's shards or
    of a list of shard files, with the share of response tokens they cover."""
    counts = count_response_tokens(source)
    if not counts:
        raise ValueError(f"no feature shards with responses in {source}")
    chosen = [t for t, _ in counts.most_common(size)]
    for t in always:                      # e.g. EOS: the head must be able to propose the end
        if t not in chosen:
            chosen[-1:] = [t]
    return _describe(chosen, counts, "token frequencies of the target's own responses in the head's training data")


def describe(token_ids: list[int], source: Path | list[Path], origin: str) -> dict:
    """A given vocabulary (e.g. the one a head was trained over, which its LM-head rows are
    tied to) in ``build``'s format, with the share of ``source``'s response tokens it covers."""
    return _describe(token_ids, count_response_tokens(source), origin)


def _describe(chosen: list[int], counts: Counter, origin: str) -> dict:
    total = sum(counts.values())
    covered = sum(counts[t] for t in chosen)
    return {"token_ids": sorted(chosen), "size": len(chosen), "coverage": covered / max(total, 1),
            "response_tokens_counted": total, "distinct_tokens_seen": len(counts), "source": origin}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work-dir", required=True)
    p.add_argument("--out", required=True, help="the head's folder")
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--always", type=int, nargs="*", default=[2], help="token ids always included (EOS)")
    args = p.parse_args(argv)
    info = build(Path(args.work_dir), args.size, tuple(args.always))
    Path(args.out, DRAFT_VOCAB_FILE).write_text(json.dumps(info) + "\n")
    print(f"{info['size']} tokens cover {info['coverage']:.4f} of {info['response_tokens_counted']} response tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
