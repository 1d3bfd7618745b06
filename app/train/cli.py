"""`python -m app train`: prompts -> self-distilled responses + features -> head -> tau.

Every stage is resumable: the data stage skips shards that already exist (and, with lock
files, shares the work between several workers), training resumes from its last
checkpoint. ``--stage data`` writes one shard of 64 answered prompts with their features at
a time, so whatever has finished when the run is stopped is usable for training.

Examples::

    python -m app train --stage data --time-budget-min 40      # as much data as fits in 40 min
    python -m app train --stage train --epochs 3 --ttt-steps 2 # train on all finished shards
    python -m app train --stage eval --eval-prompts 10         # tau on mt_bench first turns
    python -m app train                                        # everything, with the defaults
    python -m app train --device cuda --shard-size 256         # on a GPU: bigger answer batches
    python -m app train --arch eagle3 --work-dir W             # an EAGLE-3 head (app/train/eagle3.py)
    python -m app train --stage ids --arch eagle3 --work-dir W # the shards' token ids, for git

The defaults are release 6's recipe (models/eagle-smollm2-135m-instruct/README.md): 12,288
prompts, TTT-1, the loss's distributions over the 8,192-token draft vocabulary with the
soft cross-entropy on half the positions, lr 2e-3, 4,096-token batches, 100 training minutes.
The release also held out one shard (``--holdout shard_00002.safetensors``) to report
acceptance by depth.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from filelock import FileLock, Timeout
from transformers import AutoConfig, AutoTokenizer

from app.engine import loading
from app.engine.device import cache_dir, choose_device
from app.engine.heads.eagle3 import default_target_layers
from app.engine.loading import (DEFAULT_HEAD_DIR, DEFAULT_MEDUSA_DIR, EMBEDDED_ALIASES, EMBEDDED_NAME,
                                resolve_model_source)
from app.engine.sources import SHIPPED_HEADS
from app.engine.precision import bf16_is_native
from app.train.data import chat_ids, generate_with_features, log, shard_index, shard_name
from app.train.eagle3 import run_training as run_eagle3_training
from app.train.evaluate import run_eval
from app.train.medusa import run_medusa_training
from app.train.options import STAGES, add_arguments, check, complete, parse_indices  # noqa: F401  (add_arguments: the CLI's entry)
from app.train.eval_overlap import EVAL_DIR, EvalIndex, normalise
from app.train.documents import CATEGORY as DOCUMENTS, document_prompts, is_document_task, kept_answers
from app.train.magpie import CATEGORY as MAGPIE, magpie_prompts
from app.train.prompts import Prompt, build_prompts, load_prompts, save_prompts
from app.train.heap import kept_heap
from app.train.stage import run_training
from app.train.token_store import IdShard, export_ids, features_from_ids, id_path, kept_shards, write_checksums

def default_work_dir(name: str) -> Path:
    return cache_dir() / "train" / name.replace("/", "--")


def ids_dir(args, work: Path) -> Path:
    """Where the data's token ids live: given, or the shipped EAGLE-3 head's ``data/`` (kept in
    git) for an EAGLE-3 head of the embedded model, or ``<work>/ids``."""
    if args.ids_dir:
        return Path(args.ids_dir)
    if args.arch == "eagle3" and args.base_model in EMBEDDED_ALIASES:
        return SHIPPED_HEADS["eagle3"] / "data"
    return work / "ids"


def main(args: argparse.Namespace) -> int:
    args = complete(args)
    try:   # before any stage: a run that would fail at its first model load fails now, in one line
        choose_device(args.device)
        check(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    name = EMBEDDED_NAME if args.base_model in EMBEDDED_ALIASES else args.base_model
    work = Path(args.work_dir) if args.work_dir else default_work_dir(name)
    if args.out:
        out = Path(args.out)
    elif args.arch == "eagle3":
        out = work / "head-eagle3"     # never over the shipped EAGLE-2 head
    elif args.arch == "medusa":
        out = DEFAULT_MEDUSA_DIR if args.base_model in EMBEDDED_ALIASES else work / "medusa"
    else:
        out = DEFAULT_HEAD_DIR if args.base_model in EMBEDDED_ALIASES else work / "head"
    work.mkdir(parents=True, exist_ok=True)
    stages = {"all": ["prompts", "data", "train", "eval"], "data": ["prompts", "data"]}.get(
        args.stage, [args.stage])
    for stage in stages:
        if stage == "prompts":
            run_prompts(args, work)
        elif stage == "data":
            run_data(args, work)
        elif stage == "ids":
            new = export_ids(work / "features", ids_dir(args, work))
            log(f"ids: wrote {len(new)} id shards to {ids_dir(args, work)}")
        elif stage == "train":
            with kept_heap():   # a step's large buffers stay mapped from one step to the next
                {"eagle3": run_eagle3_training, "medusa": run_medusa_training}.get(
                    args.arch, run_training)(args, work, out)
        elif stage == "eval" and args.arch == "medusa":
            print("eval: stage eval measures EAGLE heads; for Medusa heads see training.json (held-out top-1 "
                  "by head) and `python -m app bench --methods vanilla,medusa`", file=sys.stderr)
        elif stage == "eval":
            run_eval(args, out)
    return 0


def run_prompts(args, work: Path) -> None:
    """The template prompts (``prompts.py``), then ``--magpie-prompts`` user turns written by
    the target itself (``magpie.py``), then ``--document-prompts`` tasks over documents made of
    the kept answers (``documents.py``), each kind appended in shards of its own (a run cut
    short continues where it stopped)."""
    args = complete(args)
    path = work / "prompts.jsonl"
    prompts = load_prompts(path) if path.is_file() else []
    if len(prompts) >= args.num_prompts:
        log(f"prompts: {path} exists, kept")
    else:
        prompts = build_prompts(args.num_prompts, seed=args.seed)
        save_prompts(prompts, path)
        log(f"prompts: wrote {len(prompts)} to {path}")
    prompts = _recover_kept(args, work, path, prompts)
    prompts = _append_magpie(args, path, prompts)
    _append_documents(args, work, path, prompts)


def _recover_kept(args, work: Path, path: Path, prompts: list) -> list:
    """A new machine's prompt file holds the template prompts only, but the kept ids go on past
    them (the target's own prompts, the document tasks): read those shards' prompts back from
    their ids and append them, so that more prompts are written after them, with the next ids,
    as on the machine that made them."""
    ids = ids_dir(args, work)
    first = len(prompts) // args.shard_size
    if first == 0 or len(prompts) % args.shard_size or first not in kept_shards(ids):
        return prompts
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source(args.base_model)[0])   # no weights needed
    last = prompts[-args.shard_size:]
    if [p.text for p in kept_prompts(ids, tokenizer, first - 1, args.shard_size, stop=first)] != [p.text for p in last]:
        log(f"prompts: the ids kept in {ids} do not answer this prompt file (its last shard, {first - 1}, is not "
            "theirs): no prompt read back from them")
        return prompts
    recovered = kept_prompts(ids, tokenizer, first, args.shard_size)
    with path.open("a") as f:
        f.write("".join(json.dumps(p.__dict__) + "\n" for p in recovered))
    log(f"prompts: {len(recovered)} prompts of shards {first}-{first + len(recovered) // args.shard_size - 1} "
        f"read back from their kept ids ({sum(p.category == DOCUMENTS for p in recovered)} document tasks)")
    return prompts + recovered


def kept_prompts(ids: Path, tokenizer, first: int, shard_size: int, stop: int | None = None) -> list[Prompt]:
    """The user turns of the kept shards ``first``, ``first`` + 1, ... (while they are kept and
    whole, and before ``stop``), decoded from the prompt ids between the chat template's fixed
    head and tail. A shard holds one kind of prompt (each kind starts a shard of its own): the
    document tasks are those whose turns match a ``documents.TASKS`` form, the others the
    target wrote."""
    a, b = chat_ids(tokenizer, "a"), chat_ids(tokenizer, "b")
    head = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)          # template tokens before the turn
    tail = next(i for i, (x, y) in enumerate(zip(a[::-1], b[::-1])) if x != y)   # and after it
    out = []
    index = first
    while (stop is None or index < stop) and (file := Path(ids) / f"{shard_name(index)}.npz").is_file():
        shard = IdShard.load(file)
        texts = [tokenizer.decode(conv[head:int(n) - tail].astype("int64").tolist())
                 for conv, n in zip(shard.conversations(), shard.prompt_lens)]
        kind = DOCUMENTS if 2 * sum(map(is_document_task, texts)) > len(texts) else MAGPIE
        out += [Prompt(id=f"p{index * shard_size + i:06d}", category=kind, text=t) for i, t in enumerate(texts)]
        if len(texts) < shard_size:               # a last, partial shard: nothing follows it
            break
        index += 1
    return out


def _starts_a_shard(args, path: Path, prompts: list, have: int, kind: str) -> None:
    """A new kind of prompt starts a shard of its own: refuse a prompt file that would mix it
    into the previous kind's last shard."""
    before = len(prompts) - have
    if before % args.shard_size:
        raise SystemExit(f"prompts: {kind} start a shard of their own, but {path} holds {before} prompts "
                         f"before them, not a multiple of --shard-size {args.shard_size}")


def _append_magpie(args, path: Path, prompts: list) -> list:
    have = sum(p.category == MAGPIE for p in prompts)
    if have >= args.magpie_prompts:
        return prompts
    _starts_a_shard(args, path, prompts, have, "the target's own prompts")
    target = loading.load_target(args.base_model, device=args.device, dtype=data_dtype(args))
    log(f"prompts: the target writes {args.magpie_prompts - have} more user turns (shards "
        f"{len(prompts) // args.shard_size} on)")
    start, written = time.perf_counter(), [have]

    def save(batch):                  # append each batch as it comes: a run cut short keeps what it wrote
        with path.open("a") as f:
            f.write("".join(json.dumps(p.__dict__) + "\n" for p in batch))
        written[0] += len(batch)
        log(f"prompts: {written[0]} of {args.magpie_prompts} written by the target "
            f"({(time.perf_counter() - start) / 60:.1f} min)")

    new = magpie_prompts(target.model, target.tokenizer, args.magpie_prompts - have, target.eos_ids, seed=args.seed,
                         first_id=len(prompts), batch_size=args.shard_size, eval_index=EvalIndex.from_dir(EVAL_DIR),
                         seen={normalise(p.text) for p in prompts}, on_batch=save)
    return prompts + new


def _append_documents(args, work: Path, path: Path, prompts: list) -> None:
    have = sum(p.category == DOCUMENTS for p in prompts)
    if have >= args.document_prompts:
        return
    _starts_a_shard(args, path, prompts, have, "the document prompts")
    target = loading.load_target(args.base_model, device=args.device, dtype=data_dtype(args))   # its tokenizer, EOS
    held_out = {shard_index(name) for name in args.holdout}
    answers = kept_answers(ids_dir(args, work), target.tokenizer, target.eos_ids, exclude=held_out)
    new = document_prompts(answers, args.document_prompts - have, seed=args.seed, first_id=len(prompts),
                           eval_index=EvalIndex.from_dir(EVAL_DIR), seen={normalise(p.text) for p in prompts})
    with path.open("a") as f:
        f.write("".join(json.dumps(p.__dict__) + "\n" for p in new))
    log(f"prompts: {len(new)} tasks over documents of {len(answers)} kept answers (held-out shards "
        f"{sorted(held_out) or 'none'} left out), shards {len(prompts) // args.shard_size} on")


def data_dtype(args) -> str:
    """--data-dtype, with auto resolved: bfloat16 where it is native, else float32."""
    if args.data_dtype != "auto":
        return args.data_dtype
    return "bfloat16" if bf16_is_native(args.device) else "float32"


def run_data(args, work: Path) -> None:
    """Shard by shard: the target answers the prompts and its features are recorded (float32)."""
    args = complete(args)
    prompts = load_prompts(work / "prompts.jsonl")
    n_shards = (len(prompts) + args.shard_size - 1) // args.shard_size
    start = time.perf_counter()
    target = None
    new_tokens = 0
    ids = ids_dir(args, work)
    kept_here = set(kept_shards(ids))
    # a kept shard needs no prompt: its ids say it all (the target-written prompts of a new
    # machine's prompt file, e.g., may not be there at all)
    order = sorted(set(range(n_shards)) | kept_here)
    if args.shards == "kept":          # a new machine: recompute the features of the kept ids, answer nothing
        if not kept_here:
            log(f"data: --shards kept, but no token ids are kept in {ids}")
        order = [s for s in order if s in kept_here]
    elif args.shards:
        wanted = set(parse_indices(args.shards))
        order = [s for s in order if s in wanted]
    if args.reverse:
        order.reverse()
    log(disk_estimate(work / "features", [s for s in order
                                          if not (work / "features" / f"{shard_name(s)}.safetensors").is_file()],
                      args))
    recomputed = 0
    for shard in order:
        if args.time_budget_min is not None and time.perf_counter() - start > 60 * args.time_budget_min:
            log(f"data: time budget of {args.time_budget_min} min reached before shard {shard}; rerun to continue")
            break
        path = work / "features" / f"{shard_name(shard)}.safetensors"
        if path.is_file() or not claim(path):
            continue
        if target is None:
            target = loading.load_target(args.base_model, device=args.device, dtype=data_dtype(args))
            tok = target.tokenizer
            pad = tok.pad_token_id if tok.pad_token_id is not None else 0
            layers = ()
            if args.arch == "eagle3":     # also store EAGLE-3's low/mid/high layers
                layers = default_target_layers(target.model.config.num_hidden_layers)
        t0 = time.perf_counter()
        kept = id_path(ids, path)
        if kept.is_file():                # answered on some machine before: recompute its features only
            fs = features_from_ids(target.model, IdShard.load(kept), layers=layers)
            fs.save(path)
            release(path)
            recomputed += 1
            log(f"data {shard_name(shard)}: features of {len(fs)} kept answers recomputed from {kept.name}, "
                f"{fs.tokens.numel() / (time.perf_counter() - t0):.0f} tok/s")
            continue
        batch = prompts[shard * args.shard_size:(shard + 1) * args.shard_size]
        fs = generate_with_features(target.model, tok, batch, shard, args.max_new_tokens, args.seed,
                                    target.eos_ids, pad, layers=layers)
        fs.save(path)
        IdShard.of(fs).save(kept)
        write_checksums(ids)
        release(path)
        n = int(fs.tokens.numel() - fs.prompt_lens.sum())
        new_tokens += n
        log(f"data {shard_name(shard)}: {len(fs)} answers ({fs.mode}), {n} response tokens, "
            f"{n / (time.perf_counter() - t0):.0f} tok/s")
    log(f"data: stopped after {(time.perf_counter() - start) / 60:.1f} min, {new_tokens} new response tokens, "
        f"{recomputed} shards' features recomputed from kept ids")


def disk_estimate(folder: Path, missing: list[int], args) -> str:
    """A line saying what the missing shards will take on disk, printed before the first one:
    measured from the shards already written when there are any, else bounded from above by
    every answer running to ``--max-new-tokens`` (features are float16: H values per token,
    4H with EAGLE-3's three target layers, plus the token id)."""
    done = sorted(folder.glob("shard_*.safetensors"))
    if not missing:
        return f"data: all shards are written ({len(done)} in {folder})"
    if done:
        per_shard = sum(p.stat().st_size for p in done) / len(done)
        how = f"{per_shard / 2**20:.0f} MiB per shard, the mean of the {len(done)} written"
    else:
        hidden = AutoConfig.from_pretrained(resolve_model_source(args.base_model)[0]).hidden_size
        per_token = 2 * hidden * (4 if args.arch == "eagle3" else 1) + 4
        per_shard = args.shard_size * (args.max_new_tokens + 128) * per_token   # ~128 prompt tokens, at most
        how = f"at most {per_shard / 2**20:.0f} MiB per shard, every answer at --max-new-tokens"
    return (f"data: {len(missing)} shards to write, about {len(missing) * per_shard / 2**30:.1f} GiB on disk "
            f"({how}) in {folder}")


_CLAIMS: dict[Path, FileLock] = {}   # the shards this process holds, by path


def claim(path: Path) -> bool:
    """Claim a shard for this process, so that several data workers can share the work: an OS
    lock on ``<shard>.lock`` (``filelock``), which the OS frees if the process dies, so a
    crashed worker leaves no stale claim. False when another worker holds it, or has just
    finished the shard."""
    if path in _CLAIMS:
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path.with_name(path.name + ".lock")))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    if path.is_file():               # finished by another worker between our check and the lock
        lock.release()
        return False
    _CLAIMS[path] = lock
    return True


def release(path: Path) -> None:
    lock = _CLAIMS.pop(path, None)
    if lock is not None:
        lock.release()
    path.with_name(path.name + ".lock").unlink(missing_ok=True)
