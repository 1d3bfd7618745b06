"""Probe: would EAGLE-3's multi-layer features raise the head's depth-1 acceptance here?

Why: on this 2-core CPU's eager forward the fastest tree is a two-node chain (``benchmarks/README.md``,
"The eager fallback"), so the speedup is bounded by the head's top-1
acceptance at depth 1 (about 0.5 on the autotune calibration prompts, 0.68 on held-out
training data). EAGLE-3
(2503.01840) feeds its head a fusion of low, middle and high target layers instead of the
last hidden state alone. Before building that into the data stage, trainer and engine, this
probe measures the one number that matters for a two-node chain: held-out top-1 agreement at
depth 1, for two heads trained identically on the same conversations:

    final   fc reads [emb(x[j+1]); f[j]]                      (EAGLE-1/2, what we ship)
    layers  fc reads [emb(x[j+1]); f[j]; h_a[j]; h_b[j]]      (f plus two earlier layers)

Both predict the final feature f[j+1] with the shipped loss (smooth-L1 + 0.1 soft CE over the
shipped draft vocabulary on half the positions), the same seed, batches, schedule and number
of steps. Depth 1 only: deeper levels of an EAGLE-3 head read its own outputs in place of the
layers, which needs training-time test, a larger change than a probe.

    python scripts/probe_eagle3_features.py extract --out /tmp/probe [--layers 3,15]
    python scripts/probe_eagle3_features.py train --probe-dir /tmp/probe --variant final --steps 800 &
    python scripts/probe_eagle3_features.py train --probe-dir /tmp/probe --variant layers --steps 800
    python scripts/probe_eagle3_features.py report --probe-dir /tmp/probe

Result (``benchmarks/eagle3-feature-probe.md``): +0.015 on 181k training tokens, +0.004
(noise) on 382k; more data moved both by +0.07. Not the lever for this target.

``extract`` reads the conversations of the data stage's shards (``python -m app train --stage
data``) and runs the float32 target over each once to record f and the chosen layers'
hidden states. Those live on the residual stream, where a few channels reach ~660 here (the
final feature's std is ~2), so each is scaled to unit RMS (``F.rms_norm`` without a weight).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.engine.heads.eagle import DraftHead, head_config_for          # noqa: E402
from app.train.data import FeatureShard                               # noqa: E402
from app.train.loss import LossConfig   # noqa: E402
from app.train.trainer import FeatureDataset, TrainConfig, train, validate   # noqa: E402

VARIANTS = ("final", "layers")


@torch.no_grad()
def layer_features(model, tokens: torch.Tensor, layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(T,) token ids -> f (T, H), the final feature, and the chosen layers' outputs at unit
    RMS, (T, len(layers)·H). ``hidden_states[i]`` is layer i's output (0 = the embeddings)."""
    out = model.model(input_ids=tokens[None], output_hidden_states=True)
    H = out.last_hidden_state.shape[-1]
    aux = [F.rms_norm(out.hidden_states[i][0], (H,)) for i in layers]
    return out.last_hidden_state[0], torch.cat(aux, -1)


def extract(args) -> None:
    from tqdm import tqdm

    from app.engine.loading import load_target

    torch.set_num_threads(args.threads)
    target = load_target(args.base_model, device="cpu", dtype="float32")
    layers = [int(x) for x in args.layers.split(",")]
    n_layers = target.model.config.num_hidden_layers
    if not all(1 <= i < n_layers for i in layers):
        raise SystemExit(f"--layers must be in [1, {n_layers - 1}] (layer outputs before the last), got {layers}")
    src = sorted(Path(args.work_dir).glob("features/shard_*.safetensors"))
    if not src:
        raise SystemExit(f"no shards under {args.work_dir}/features: run `python -m app train --stage data` first")
    out = Path(args.out)
    (out / "shards").mkdir(parents=True, exist_ok=True)
    total = sum(int(FeatureShard.load(p).offsets[-1]) for p in src)
    bar = tqdm(total=total, unit="tok", desc="extract", mininterval=5)
    for path in src:
        dest = out / "shards" / path.name
        shard = FeatureShard.load(path)
        if dest.is_file():
            bar.update(int(shard.offsets[-1]))
            continue
        finals, auxes = [], []
        for s in range(len(shard)):
            tokens, _, _ = shard.conversation(s)
            f, aux = layer_features(target.model, tokens, layers)
            finals.append(f.half())
            auxes.append(aux.half())
            bar.update(tokens.numel())
        tmp = dest.with_suffix(".tmp")
        save_file({"tokens": shard.tokens, "features": torch.cat(finals), "aux": torch.cat(auxes),
                   "offsets": shard.offsets, "prompt_lens": shard.prompt_lens}, str(tmp),
                  metadata={"layers": ",".join(map(str, layers))})
        tmp.rename(dest)
    bar.close()
    (out / "probe.json").write_text(json.dumps({"layers": layers, "shards": [p.name for p in src]}) + "\n")


def _read_tensor(path: Path, name: str) -> torch.Tensor:
    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor(name)


class LayerFeatureDataset(FeatureDataset):
    """The data stage's dataset, plus ``input_features`` = [f; h_a; h_b] for the layers variant."""

    def __init__(self, paths: list[Path], with_layers: bool):
        super().__init__(paths)
        self.with_layers = with_layers
        # only the extra layers: the tokens and features are already held by the parent class
        self.aux = [_read_tensor(p, "aux") for p in self.paths] if with_layers else None

    def collate(self, items: list[int], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        batch = super().collate(items)                                         # on the host
        if self.with_layers:
            B, T, H = batch["features"].shape
            aux = torch.zeros(B, T, self.aux[0].shape[-1])
            for row, k in enumerate(items):
                si, s = self.index[k]
                a, b = int(self.shards[si].offsets[s]), int(self.shards[si].offsets[s + 1])
                aux[row, :b - a] = self.aux[si][a:b].float()
            batch["input_features"] = torch.cat([batch["features"], aux], -1)  # (B, T, (1 + k)·H)
        return {k: v.to(device) for k, v in batch.items()}


def make_head(target_config, variant: str, aux_width: int, seed: int = 0) -> DraftHead:
    torch.manual_seed(seed)
    head = DraftHead(head_config_for(target_config))
    if variant == "layers":
        H = target_config.hidden_size
        head.fc = torch.nn.Linear(2 * H + aux_width, H, bias=True)         # [emb; f; layers] -> H
    return head


def split(probe_dir: Path, holdout: str) -> tuple[list[Path], list[Path]]:
    paths = sorted((probe_dir / "shards").glob("shard_*.safetensors"))
    held = [p for p in paths if p.stem == holdout]
    if not held:
        raise SystemExit(f"held-out shard {holdout} not among {[p.stem for p in paths]}")
    return [p for p in paths if p.stem != holdout], held


def run_train(args) -> None:
    from app.engine.loading import load_draft_vocab, load_target, resolve_head_source

    torch.set_num_threads(args.threads)
    probe_dir = Path(args.probe_dir)
    train_paths, held_paths = split(probe_dir, args.holdout)
    target = load_target(args.base_model, device="cpu", dtype="float32")
    vocab_ids = None if args.full_vocab else load_draft_vocab(resolve_head_source(None), target.model.config.vocab_size)
    with_layers = args.variant == "layers"
    data = LayerFeatureDataset(train_paths, with_layers)
    held = LayerFeatureDataset(held_paths, with_layers)
    aux_width = data.aux[0].shape[-1] if with_layers else 0
    head = make_head(target.model.config, args.variant, aux_width)
    per_epoch = len(data.batches(0, 0, args.batch_tokens))
    run_dir = probe_dir / f"run_{args.variant}"
    t0 = time.perf_counter()
    state = train(head, target.model, data, run_dir,
                  LossConfig(kl_fraction=0.5, noise=0.05, ttt_steps=1),
                  TrainConfig(epochs=args.steps / per_epoch, batch_tokens=args.batch_tokens, lr=args.lr,
                              warmup_steps=50, checkpoint_every=100, seed=0),
                  vocab_ids=vocab_ids)
    stats = validate(head, target.model, held, steps=1, batch_tokens=args.batch_tokens, vocab_ids=vocab_ids)
    result = {"variant": args.variant, "steps": state["step"], "epochs": state["step"] / per_epoch,
              "train_tokens": data.num_tokens, "heldout_tokens": held.num_tokens, "heldout": args.holdout,
              "train_minutes": (time.perf_counter() - t0) / 60, "heldout_acc1": stats["acc1"],
              "heldout_reg1": stats["reg1"], "heldout_kl1": stats["kl1"],
              "train_acc1_last": state["history"][-1].get("acc1") if state["history"] else None}
    (probe_dir / f"result_{args.variant}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


def report(args) -> None:
    probe_dir = Path(args.probe_dir)
    meta = json.loads((probe_dir / "probe.json").read_text())
    rows = [json.loads((probe_dir / f"result_{v}.json").read_text()) for v in VARIANTS
            if (probe_dir / f"result_{v}.json").is_file()]
    print(f"layers {meta['layers']}; held-out {rows[0]['heldout'] if rows else '-'}")
    print("| head input | steps | epochs | held-out top-1, depth 1 | held-out smooth-L1 | held-out KL |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['steps']} | {r['epochs']:.1f} | {r['heldout_acc1']:.3f} | "
              f"{r['heldout_reg1']:.3f} | {r['heldout_kl1']:.3f} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract")
    e.add_argument("--work-dir", default=None, help="the data stage's folder (default: cache_dir()/train/<model>)")
    e.add_argument("--out", required=True)
    e.add_argument("--layers", default="3,15", help="layer outputs to add, 1-based (default 3,15)")
    t = sub.add_parser("train")
    t.add_argument("--probe-dir", required=True)
    t.add_argument("--variant", choices=VARIANTS, required=True)
    t.add_argument("--holdout", default="shard_00000")
    t.add_argument("--steps", type=int, default=800)
    t.add_argument("--batch-tokens", type=int, default=4096)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--full-vocab", action="store_true", help="loss over the full vocabulary, not the shipped draft one")
    r = sub.add_parser("report")
    r.add_argument("--probe-dir", required=True)
    for q in (e, t):
        q.add_argument("--base-model", default=None)
        q.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.cmd == "extract":
        if args.work_dir is None:
            from app.engine.loading import resolve_model_source
            from app.train.cli import default_work_dir
            args.work_dir = str(default_work_dir(resolve_model_source(args.base_model)[1]))
        extract(args)
    elif args.cmd == "train":
        run_train(args)
    else:
        report(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
