"""GPU readiness check, prepared to run in one short call on a GPU.

    python scripts/gpu_check.py --device cuda --out gpu-check.json          # on a GPU (a few minutes)
    python scripts/gpu_check.py --device cpu --shape tiny                    # the same steps, small, anywhere

Three checks, each timed, results printed and written as JSON:

1. **Lossless on the device**: a tiny random Llama and a briefly trained head (tests/tiny.py)
   in float32. Greedy EAGLE-2 output must equal transformers' own ``generate`` token for
   token, and a sampled chain must run to the end.
2. **Forward-cost curve** T(n) of a random model of the chosen shape, in bfloat16 on a GPU,
   over the tree sizes autotune measures (``autotune.measure_forward_costs``: the engine's
   verify forward and LM head, with a tree mask, on a 256-token cached prefix). The default
   shape is Llama-3-8B's (32 layers, 4,096 wide, 128k vocabulary). The curve says how flat a
   GPU's cost is, and so how big a tree pays there.
3. **The training pipeline on the device** (``python -m app train --device``): one shard of
   answers with their features, a few training steps, a validation pass.

A random model needs no download. Its weights are made on the device itself: an 8B model
in bf16 is 16 GB.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repository root: app/, tests/

SHAPES = {
    # name: (layers, hidden, intermediate, heads, kv_heads, vocab)
    "llama-8b": (32, 4096, 14336, 32, 8, 128256),
    "tiny": (2, 64, 128, 4, 2, 256),
}


def lossless_check(device: torch.device) -> dict:
    from app.engine.config import SamplingConfig, TreeConfig
    from app.engine.engine import Engine
    from app.engine.loading import Target
    from tests.tiny import tiny_target, trained_head

    cpu = tiny_target(seed=0)
    head = trained_head(cpu, seed=0).to(device)
    target = Target(model=cpu.model.to(device), tokenizer=cpu.tokenizer, name="tiny", device=device,
                    dtype=torch.float32)
    engine = Engine(target, head)
    prompt = [5, 17, 33, 90]
    reference = target.model.generate(torch.tensor([prompt], device=device), max_new_tokens=40,
                                      do_sample=False)[0, len(prompt):].tolist()
    out = {}
    for name, tree in {"dynamic 24/5/8": TreeConfig(), "chain 2/2/1": TreeConfig(depth=2, top_k=1, total_tokens=2),
                       "static": TreeConfig(method="static")}.items():
        *steps, summary = engine.generate(prompt_ids=prompt, tree=tree, max_new_tokens=40)
        out[name] = {"identical_to_generate": summary.token_ids == reference, "tau": summary.mean_accepted}
    *_, sampled = engine.generate(prompt_ids=prompt, tree=TreeConfig(depth=2, top_k=1, total_tokens=2),
                                  sampling=SamplingConfig(temperature=1.0, seed=1), max_new_tokens=40)
    out["sampled chain"] = {"tokens": sampled.new_tokens, "tau": sampled.mean_accepted}
    return out


def random_target(shape: str, device: torch.device, dtype: torch.dtype):
    """A random Llama of ``shape``, made on ``device`` in ``dtype`` (no float32 copy first)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from app.engine.loading import Target

    layers, hidden, inter, heads, kv_heads, vocab = SHAPES[shape]
    cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=inter,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                      max_position_embeddings=2048)
    cfg._attn_implementation = "sdpa"
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(old)
    model.requires_grad_(False)
    return Target(model=model, tokenizer=None, name=f"random-{shape}", device=device, dtype=dtype)


def cost_curve(shape: str, device: torch.device, dtype: torch.dtype) -> dict:
    from app.engine import autotune

    target = random_target(shape, device, dtype)
    sizes = autotune.DEFAULT_SIZES if shape != "tiny" else (1, 2, 4, 8)
    curve = autotune.measure_forward_costs(target, sizes=sizes, prefix_len=256 if shape != "tiny" else 32)
    t1 = curve.ms[0]
    return {"shape": shape, "dtype": str(dtype).replace("torch.", ""), "sizes": curve.sizes,
            "ms": [round(m, 3) for m in curve.ms], "ratio_to_one_token": [round(m / t1, 3) for m in curve.ms]}


def train_check(device: torch.device, work: Path) -> dict:
    from app.engine.heads.eagle import DraftHead, head_config_for
    from app.train.data import generate_with_features
    from app.train.prompts import Prompt
    from app.train.loss import LossConfig
    from app.train.trainer import FeatureDataset, TrainConfig, train, validate
    from tests.tiny import tiny_target

    cpu = tiny_target(seed=3)
    model = cpu.model.to(device)
    prompts = [Prompt(id=f"p{i}", category="chat", text=" ".join(f"w{3 + (7 * i + j) % 250}" for j in range(6)))
               for i in range(8)]
    paths = []
    for shard in (0, 1):      # one greedy, one sampled
        fs = generate_with_features(model, cpu.tokenizer, prompts, shard, 24, seed=0, eos_ids=cpu.eos_ids, pad_id=0)
        paths.append(work / f"shard_{shard:05d}.safetensors")
        fs.save(paths[-1])
    data = FeatureDataset(paths)
    torch.manual_seed(0)
    head = DraftHead(head_config_for(model.config))
    state = train(head, model, data, work / "run", LossConfig(ttt_steps=2), TrainConfig(epochs=3, batch_tokens=256),
                  progress=False)
    val = validate(head, model, data, steps=2)
    return {"steps": state["step"], "head_device": str(next(head.parameters()).device),
            "held_in_acc1": round(val["acc1"], 3), "tokens": data.num_tokens}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default) | cpu")
    p.add_argument("--shape", default="llama-8b", choices=sorted(SHAPES), help="the cost curve's random model")
    p.add_argument("--dtype", default=None, help="the cost curve's dtype (default: bfloat16 on a GPU, float32 on CPU)")
    p.add_argument("--out", default=None, help="write the results here as JSON")
    p.add_argument("--work", default="/tmp/gpu-check", help="scratch folder for the training check")
    args = p.parse_args(argv)
    from app.engine.loading import choose_device

    try:
        device = choose_device(args.device)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if device.type == "cpu" and args.shape != "tiny":
        print(f"error: a random {args.shape} model is tens of GB; on a CPU use --shape tiny", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    results = {"device": str(device), "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for name, run in (("lossless", lambda: lossless_check(device)),
                      ("cost_curve", lambda: cost_curve(args.shape, device, dtype)),
                      ("train", lambda: train_check(device, work))):
        t0 = time.perf_counter()
        try:
            results[name] = run()
        except Exception as exc:  # noqa: BLE001 — one failing check must not hide the others' results
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results[name]["seconds"] = round(time.perf_counter() - t0, 2)
        print(f"[gpu-check] {name}: {json.dumps(results[name])}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    failed = [k for k in ("lossless", "cost_curve", "train") if "error" in results[k]]
    lossless = all(v.get("identical_to_generate", True) for v in results["lossless"].values() if isinstance(v, dict))
    return 1 if failed or not lossless else 0


if __name__ == "__main__":
    sys.exit(main())
