"""bench's optional llama.cpp peer (app/bench/llama_cpp.py): found by $LLAMA_CPP_BIN or the
PATH, run on the embedded GGUF, reported in one line; absent, it is said so and nothing fails.

llama.cpp is not installed on the machines the tests run on, so ``llama-bench`` is played by
a small script that answers ``-o json`` the way llama-bench does (the fields bench reads) and
records the arguments it was given."""
from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from app.bench import llama_cpp
from app.bench.cli import _llama_cpp_peer

STAND_IN = """#!{python}
import json, sys
args = sys.argv[1:]
open({log!r}, "w").write(json.dumps(args))
if {fail}:
    print("error: failed to load model", file=sys.stderr); sys.exit(1)
n = int(args[args.index("-n") + 1]); t = int(args[args.index("-t") + 1])
print(json.dumps([{{"build_commit": "abc1234", "model_type": "llama 135M Q4_1", "n_prompt": 0, "n_gen": n,
                   "n_threads": t, "avg_ts": 111.5, "stddev_ts": 2.25}}]))
"""


def _stand_in(folder: Path, fail: bool = False) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / llama_cpp.BINARY
    path.write_text(STAND_IN.format(python=sys.executable, log=str(folder / "args.json"), fail=fail))
    path.chmod(0o755)
    return path


def test_found_by_its_variable_run_on_the_gguf_and_reported(tmp_path, monkeypatch):
    binary = _stand_in(tmp_path / "bin")
    monkeypatch.setenv("LLAMA_CPP_BIN", str(binary.parent))          # a folder holding it
    assert llama_cpp.find_llama_bench() == str(binary)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    result = llama_cpp.llama_bench(llama_cpp.find_llama_bench(), gguf, 2, 128)
    assert result == {"tokens_per_s": 111.5, "stddev": 2.25, "threads": 2, "new_tokens": 128,
                      "model": "llama 135M Q4_1", "build": "abc1234"}
    args = json.loads((binary.parent / "args.json").read_text())
    assert args[args.index("-m") + 1] == str(gguf) and args[args.index("-p") + 1] == "0"
    line = llama_cpp.peer_line(result)
    assert "111.5 ± 2.2 tokens/s" in line and "-t 2 -p 0 -n 128" in line


def test_bench_runs_it_only_on_the_embedded_model_and_says_why_not(tmp_path, monkeypatch):
    from app.engine import loading

    gguf = tmp_path / "SmolLM2.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(loading, "embedded_gguf_path", lambda: gguf)
    monkeypatch.setenv("LLAMA_CPP_BIN", str(tmp_path / "nowhere"))
    assert _llama_cpp_peer(Namespace(base_model=None, max_new_tokens=64), 2) == {
        "why_not": "no llama-bench found ($LLAMA_CPP_BIN or the PATH; optional)"}
    monkeypatch.setenv("LLAMA_CPP_BIN", str(_stand_in(tmp_path / "bin")))
    peer = _llama_cpp_peer(Namespace(base_model=None, max_new_tokens=64), 2)
    assert peer["result"]["new_tokens"] == 64 and peer["result"]["tokens_per_s"] == pytest.approx(111.5)
    assert "not the embedded model" in _llama_cpp_peer(Namespace(base_model=str(tmp_path), max_new_tokens=64),
                                                       2)["why_not"]
    monkeypatch.setenv("LLAMA_CPP_BIN", str(_stand_in(tmp_path / "broken", fail=True)))
    why = _llama_cpp_peer(Namespace(base_model=None, max_new_tokens=64), 2)["why_not"]
    assert "exited 1" in why and "failed to load model" in why
