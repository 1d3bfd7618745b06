"""Decoding speed on 1 and on 2 threads under each way OpenMP's waiting threads can wait,
on a quiet machine and beside one busy process: the measurement behind app/engine/threads.py.

    python scripts/wait_policy.py --out benchmarks/fast-forward/threads-wait-policy.md

libgomp reads its wait policy once, when it loads, so each policy runs in a process of its
own (``--child``). A policy is ``passive`` (OMP_WAIT_POLICY=PASSIVE: sleep at once), a
number (GOMP_SPINCOUNT: spin that many rounds, then sleep) or ``default`` (neither set:
libgomp spins 300,000 rounds, ~3 ms). In each process the embedded model decodes --prompts
prompts x --tokens tokens with vanilla and with the page's default tree (1 node, depth 1,
top-k 8, a 3-token prompt-lookup branch), on 1 then 2 threads, --repeats times; the table
gives the best tokens/s of the repeats (a burst of load lowers a repeat, never raises it).
The busy neighbour is one process spinning in Python for the whole of its rows.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PROMPTS = ("Explain how a bicycle works, in detail.",
           "Write a short story about a robot who learns to paint.")


def child(policy: str, tokens: int, repeats: int, prompts: int) -> dict:
    """Runs in a fresh process whose environment already holds ``policy``."""
    import torch

    from app.engine.config import TreeConfig
    from app.engine.factory import load_engine

    engine, _ = load_engine(dtype="auto")
    trees = {"vanilla": TreeConfig(method="vanilla"),
             "1/1/8+lookup3": TreeConfig(method="dynamic", total_tokens=1, depth=1, top_k=8, lookup=3)}
    best: dict[str, float] = {}
    for _ in range(repeats):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for name, tree in trees.items():
                seconds, count = 0.0, 0
                for prompt in PROMPTS[:prompts]:
                    t0 = None
                    for event in engine.generate(prompt, tree=tree, max_new_tokens=tokens):
                        if event.type != "step":
                            continue
                        if event.prefill:
                            t0 = time.perf_counter()      # decoding only, as the benchmark
                            continue
                        count += len(event.new_tokens)
                    seconds += time.perf_counter() - t0
                key = f"{name} @{threads}"
                best[key] = max(best.get(key, 0.0), count / seconds)
    return best


def environment(policy: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif policy != "default":
        env["GOMP_SPINCOUNT"] = policy
    return env


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default="passive,10000,100000,default",
                   help="comma-separated: passive, default, or a GOMP_SPINCOUNT")
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--neighbour", default="no,yes", help="without and/or with one busy process")
    p.add_argument("--out", help="also write the markdown table here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.tokens, args.repeats, args.prompts)))
        return 0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = []
    for neighbour in args.neighbour.split(","):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if neighbour == "yes" else None
        try:
            time.sleep(1.0 if busy else 0.0)
            for policy in args.policies.split(","):
                load0 = os.getloadavg()[0]
                out = subprocess.run([sys.executable, __file__, "--child", policy, "--tokens", str(args.tokens),
                                      "--repeats", str(args.repeats), "--prompts", str(args.prompts)],
                                     env={**environment(policy), "PYTHONPATH": root}, capture_output=True, text=True,
                                     check=True)
                best = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append((neighbour, policy, best, load0, os.getloadavg()[0]))
                print(rows[-1], file=sys.stderr, flush=True)
        finally:
            if busy:
                busy.kill()
    keys = list(rows[0][2])
    lines = [f"`python scripts/wait_policy.py {' '.join(sys.argv[1:])}`", "",
             f"- {args.prompts} prompts x {args.tokens} tokens, best of {args.repeats} repeats, tokens/s; "
             f"ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '(unset)')}", "",
             "| busy neighbour | waiting threads | " + " | ".join(keys) + " | load average |",
             "|---|---|" + "---|" * len(keys) + "---|"]
    for neighbour, policy, best, l0, l1 in rows:
        lines.append(f"| {neighbour} | {policy} | " + " | ".join(f"{best[k]:.1f}" for k in keys)
                     + f" | {l0:.2f} → {l1:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
