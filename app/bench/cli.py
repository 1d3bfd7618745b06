"""`python -m app bench`: every method on the same prompts, interleaved, one table per suite.

    python -m app bench --quick                                   # 2 prompts, smoke run
    python -m app bench --suite mt_bench --limit 20 --max-new-tokens 256
    python -m app bench --suite all --methods hf,vanilla,dynamic:auto,dynamic:60/5/10 --out runs/b1

Methods run interleaved prompt by prompt (and in a rotating order) after one warm-up run
each, so that drift in machine load hits every method alike. Outputs in --out: results.md
(the tables), results.json (every run and the pooled numbers), plots.html (plotly.js from
its CDN; --plotly-js inline for a file that opens offline, none for no plots).
"""
from __future__ import annotations

import argparse
import contextlib
import subprocess
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from app.args import add_model_arguments, add_tree_arguments, thread_governor, tree_config_from
from app.bench.prompts import load_suite, parse_suites
from app.bench.runners import ALL_METHODS, compiled_peer, parse_methods, run_one
from app.engine.config import SamplingConfig, check_max_new_tokens
from app.engine.device import copy_bandwidth, cpu_class_cap
from app.engine.sources import check_before_loading
from app.engine.spec import KNOB
from app.engine.threads import REUSE_S, engine_probe

DEFAULT_METHODS = ",".join(m for m in ALL_METHODS if m not in ("hf-fp32", "medusa"))   # medusa: its own heads
QUICK = {"suite": "mt_bench", "limit": 2, "max_new_tokens": 32, "methods": "hf,vanilla,dynamic", "warmup_tokens": 8}
DEFAULTS = {"suite": "mt_bench", "limit": 10, "max_new_tokens": 256, "methods": DEFAULT_METHODS, "warmup_tokens": 16}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default=None, help="comma-separated eval sets from data/eval, or 'all' (default mt_bench)")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of each suite; 0 = all (default 10)")
    p.add_argument("--methods", default=None,
                   help=f"comma-separated, from {', '.join(ALL_METHODS)}; a tree method may carry its tree as "
                        "name:TOTAL/DEPTH/TOP_K (e.g. dynamic:60/5/10) or dynamic:auto (hardware-aware size), and an "
                        "EAGLE method another head as @HEAD (a folder, or eagle2 / eagle3 for the shipped ones, e.g. "
                        "dynamic:auto@eagle3), and +lookupN a prompt-lookup branch of N tokens beside the head "
                        "(e.g. dynamic:4/2/2+lookup3; dynamic:adaptive has one of 3 unless +lookup0); "
                        "default: all plain methods")
    p.add_argument("--max-new-tokens", type=int, default=None, help="per answer (default 256)")
    KNOB["temperature"].add_argument(p, help="0 = greedy (the only setting where outputs are compared)")
    KNOB["seed"].add_argument(p)
    add_tree_arguments(p)
    add_model_arguments(p)
    p.add_argument("--out", default=None, help="output folder (default runs/bench-YYYYmmdd-HHMMSS)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 2 mt_bench prompts, 32 tokens, hf,vanilla,dynamic (explicit flags still win)")
    p.add_argument("--warmup-tokens", type=int, default=None, help="tokens of the one warm-up run per method (default 16)")
    p.add_argument("--busy", type=int, default=0,
                   help="run N busy processes (one pure-Python loop each) beside the benchmark, to measure "
                        "what a visitor gets on a shared machine; they are stopped at the end")
    p.add_argument("--plotly-js", default="cdn", choices=("inline", "cdn", "none"),
                   help="plots.html loading plotly.js from its CDN (default, small file), with plotly.js "
                        "inline (opens offline, ~4.8 MB), or no plots.html")


def _fill_defaults(args) -> None:
    base = QUICK if args.quick else DEFAULTS
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    line = f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()}"
    cap = cpu_class_cap()
    if cap is not None:   # an emulated smaller CPU: the tables must say so
        env = " ".join(f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                          "MKL_ENABLE_INSTRUCTIONS") if os.environ.get(k))
        line += f", emulating a CPU of class {cap} ({env})"
    return line


def _load() -> str:
    try:
        return "%.2f" % os.getloadavg()[0]
    except OSError:
        return "?"


def _copy_gbps(engine) -> float | None:
    """The host's copy bandwidth now (GB/s, ``device.copy_bandwidth``) where the target runs on
    the CPU, else None."""
    return round(copy_bandwidth(), 1) if engine.target.device.type == "cpu" else None


def _command(args) -> str:
    parts = ["python -m app bench", f"--suite {args.suite}", f"--limit {args.limit}", f"--methods {args.methods}",
             f"--max-new-tokens {args.max_new_tokens}", f"--temperature {args.temperature}"]
    for flag in ("depth", "top_k", "total_tokens", "lookup"):
        if getattr(args, flag, None) is not None:
            parts.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}")
    for flag in ("base_model", "draft_model"):
        if getattr(args, flag):
            parts.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}")
    parts += [f"--device {args.device}", f"--dtype {args.dtype}"]
    if args.threads != "auto":
        parts.append(f"--threads {args.threads}")
    if args.busy:
        parts.append(f"--busy {args.busy}")
    return " ".join(parts)


def main(args) -> int:
    # lazy: transformers (~15 s on a loaded CPU) loads only for a run, not for `bench --help`
    from app.engine.factory import load_engine

    _fill_defaults(args)
    try:
        args.governor = thread_governor(args)
        if not 0 <= args.busy <= 16:
            raise ValueError(f"busy must be an integer in [0, 16], got {args.busy}")
        suites = parse_suites(args.suite)
        if args.limit < 0:
            raise ValueError(f"limit must be >= 0 (0 = all prompts), got {args.limit}")
        check_max_new_tokens(args.max_new_tokens)
        specs = parse_methods(args.methods, tree_config_from(args, "dynamic"))
        sampling = SamplingConfig(temperature=args.temperature, seed=args.seed)
        need_head = any(s.uses_head and not s.head for s in specs)
        need_medusa = any(s.uses_medusa for s in specs)
        check_before_loading(args.base_model, args.draft_model, args.device, head=need_head,
                             medusa=need_medusa, medusa_model=args.medusa_model)
        engine, _ = load_engine(args.base_model, args.draft_model, args.device, args.dtype,
                                head="required" if need_head else "none",
                                medusa="required" if need_medusa else "none",
                                medusa_model=args.medusa_model, forward=args.forward)
        engines = {None: engine}
        for head in dict.fromkeys(s.head for s in specs if s.head):   # @HEAD: the same target, another head
            engines[head], _ = load_engine(draft_model=head, target=engine.target, head="required")
    except (ValueError, FileNotFoundError, KeyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with busy_processes(args.busy):
        return run_benchmark(engines, args, suites, specs, sampling)


@contextlib.contextmanager
def busy_processes(n: int):
    """N processes that each keep one core busy (a pure-Python loop, as a neighbour's job or a
    browser tab would), for the duration of the block; killed on the way out."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _llama_cpp_peer(args, threads: int) -> dict:
    """{"result": llama-bench's numbers} for the embedded target's GGUF where a llama-bench is
    found (``app.bench.llama_cpp``), else {"why_not": ...}: optional, never an error."""
    from app.bench.llama_cpp import find_llama_bench, llama_bench
    from app.engine.loading import EMBEDDED_ALIASES, embedded_gguf_path

    if args.base_model not in EMBEDDED_ALIASES:
        return {"why_not": "the target is not the embedded model, whose GGUF file it decodes"}
    binary = find_llama_bench()
    if binary is None:
        return {"why_not": "no llama-bench found ($LLAMA_CPP_BIN or the PATH; optional)"}
    gguf = embedded_gguf_path()
    if gguf is None:
        return {"why_not": "the embedded model's GGUF file is not installed"}
    print(f"[bench] llama.cpp peer: {binary} on {gguf.name}, {threads} thread(s)", file=sys.stderr, flush=True)
    try:
        return {"result": llama_bench(binary, gguf, threads, args.max_new_tokens)}
    except RuntimeError as exc:
        return {"why_not": str(exc)}


def run_benchmark(engines, args, suites, specs, sampling) -> int:
    """``engines``: None -> the engine of every method without @HEAD, head name -> the engine
    (same target) of the methods with it."""
    # lazy, for `bench --help` as in main: these import transformers (report by way of autotune)
    from app.bench import report
    from app.engine.adapt import adapter_for
    from app.engine.autotune import choose_tree
    from app.engine.loading import DEFAULT_HEAD_DIR, load_target

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    t_start = time.perf_counter()
    load_start = _load()
    copy_start = _copy_gbps(engines[None])
    out = Path(args.out or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    out.mkdir(parents=True, exist_ok=True)
    prompts = [p for s in suites for p in load_suite(s, args.limit or None)]
    engine = engines[None]
    probe = engine_probe(engine)
    governor = args.governor
    governor.apply(probe)       # the auto trees are sized (and their profile looked up) at the runs' thread count
    auto_text, auto_report = None, None
    for i, spec in enumerate(specs):
        if spec.adaptive:
            lookup = spec.lookup if spec.lookup is not None else args.lookup
            start, adapter, choice = adapter_for(engines[spec.head], spec.tree, measure=True, lookup=lookup)
            specs[i] = replace(spec, tree=start, candidates=tuple(adapter.candidates), prior_tau=adapter.prior_tau)
            print(f"[bench] {spec.label}: adapts over "
                  + ", ".join(adapter._key(t) for t in adapter.candidates), file=sys.stderr)
        if spec.auto:
            print("[bench] choosing the auto tree (measures the forward cost and calibrates once, then cached)",
                  file=sys.stderr, flush=True)
            tree, choice = choose_tree(engines[spec.head], base=spec.tree)
            specs[i] = replace(spec, tree=tree)
            auto_text = f"{spec.label}: {choice.summary()}"
            auto_report = choice.to_dict()       # the cost curve and every candidate, for the JSON and plots
            print(f"[bench] {auto_text}", file=sys.stderr, flush=True)

    peers = {}                      # hf-fp32, hf-bf16, hf-compile: generate on targets of their own
    for method, dtype in (("hf-fp32", torch.float32), ("hf-bf16", torch.bfloat16)):
        if any(s.method == method for s in specs):
            if engine.target.dtype == dtype:
                peers[method] = engine.target
            else:
                peers[method] = load_target(args.base_model, device=args.device, dtype=str(dtype).replace("torch.", ""),
                                            forward="eager")
    if any(s.method == "hf-compile" for s in specs):
        print("[bench] hf-compile: compiling transformers' forward with a static cache during the warm-up "
              "(minutes on a CPU, not timed)", file=sys.stderr, flush=True)
        peers["hf-compile"] = compiled_peer(engine.target)

    # warm-up: one short run per method (first prompt), so lazy init and allocator growth
    # are not charged to the first timed prompt
    warm_ids = engine.encode_prompt(prompts[0].text)
    for spec in specs:
        governor.apply(probe)
        run_one(engines[spec.head], spec, "warmup", -1, warm_ids, sampling, args.warmup_tokens, peers)
        if spec.method == "hf-compile":     # a second shape: the compiled prefill goes dynamic now, not in a timed run
            run_one(engines[spec.head], spec, "warmup", -1, warm_ids[:-1], sampling, args.warmup_tokens, peers)

    records = []
    bar = tqdm(total=len(prompts) * len(specs), desc="bench", unit="run", file=sys.stderr, dynamic_ncols=True)
    for i, prompt in enumerate(prompts):
        ids = engine.encode_prompt(prompt.text)
        order = specs[i % len(specs):] + specs[: i % len(specs)]   # rotate: no method always runs first
        # one thread count for all of this prompt's methods (timed afresh every REUSE_S seconds,
        # between prompts): a prompt's methods are compared on the same number of cores
        count = governor.apply(probe)
        for spec in order:
            bar.set_postfix_str(f"{prompt.suite} #{prompt.question_id} {spec.label}")
            torch.set_num_threads(count)
            rec = run_one(engines[spec.head], spec, prompt.suite, prompt.question_id, ids, sampling, args.max_new_tokens,
                          peers)
            rec.threads = count
            records.append(rec)
            bar.update(1)
    bar.close()

    llama_cpp = _llama_cpp_peer(args, torch.get_num_threads())

    head = None
    if any(s.uses_head for s in specs):
        head = args.draft_model or f"shipped ({DEFAULT_HEAD_DIR.relative_to(DEFAULT_HEAD_DIR.parents[1])})"
        others = [s.head for s in specs if s.head]
        if others:
            head += "; @HEAD columns: " + ", ".join(dict.fromkeys(others))
    meta = {
        "command": _command(args), "started": started, "wall_s": time.perf_counter() - t_start,
        "machine": _machine(), "device": str(engine.target.device), "dtype": str(engine.target.dtype).replace("torch.", ""),
        "forward": engine.decoder.name,
        "threads": governor.text() if governor.fixed is not None else
        f"auto (per prompt, the same for its methods, timed every {int(REUSE_S)} s; runs): "
        + ", ".join(f"{n} thread(s) x{sum(r.threads == n for r in records)}" for n in sorted({r.threads for r in records})),
        "busy_processes": args.busy, "load_start": load_start, "load_end": _load(),
        "copy_gbps_start": copy_start, "copy_gbps_end": _copy_gbps(engine),
        "target": engine.target.name, "head": head or "none (no tree method)",
        "medusa": str(engine.medusa.folder) if engine.medusa is not None else None,
        "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "seed": args.seed,
        "suites": suites, "limit": args.limit, "methods": [s.label for s in specs], "auto_tree": auto_text,
        "auto_tree_report": auto_report,
        "torch": torch.__version__, "llama_cpp": llama_cpp,
    }
    summary = report.aggregate(records, specs, greedy=sampling.greedy)
    text = report.markdown_report(summary, meta)
    (out / "results.md").write_text(text, encoding="utf-8")
    (out / "results.json").write_text(json.dumps(report.json_document(summary, records, meta), indent=1) + "\n",
                                      encoding="utf-8")
    if args.plotly_js != "none":
        from app.bench.plots import write_plots     # lazy: plotly, only when plots.html is written

        write_plots(summary, out / "plots.html", args.plotly_js, tree_choice=auto_report)
    print(text)
    print(f"[bench] wrote {out}/results.md, results.json" + (", plots.html" if args.plotly_js != "none" else ""),
          file=sys.stderr)
    return 0
