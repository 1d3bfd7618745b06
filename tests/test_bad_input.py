"""Every bad input gets a ValueError naming the parameter and its range; the CLI exits 2."""
from __future__ import annotations

import subprocess
import sys

import pytest

from app.engine.config import SamplingConfig, TreeConfig, check_max_new_tokens, check_prompt
from app.engine.engine import Engine


@pytest.mark.parametrize("kwargs, name", [
    (dict(method="beam"), "method"),
    (dict(depth=0), "depth"), (dict(depth=17), "depth"), (dict(depth=2.5), "depth"),
    (dict(top_k=0), "top_k"), (dict(top_k=33), "top_k"),
    (dict(total_tokens=0), "total_tokens"), (dict(total_tokens=257), "total_tokens"),
    (dict(tau_low=-0.1), "tau_low"), (dict(tau_high=1.5), "tau_high"),
    (dict(method="threshold", tau_low=0.6, tau_high=0.5), "tau_low"),
    (dict(min_confidence=2.0), "min_confidence"), (dict(min_confidence=float("nan")), "min_confidence"),
])
def test_tree_config(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TreeConfig(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(temperature=-1), "temperature"), (dict(temperature=float("inf")), "temperature"),
    (dict(top_p=0), "top_p"), (dict(top_p=1.01), "top_p"),
    (dict(top_k_sampling=-1), "top_k_sampling"), (dict(seed=-5), "seed"), (dict(seed="1"), "seed"),
])
def test_sampling_config(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("prompt", ["", "   \n\t", None])
def test_blank_prompt(prompt):
    with pytest.raises(ValueError, match="prompt"):
        check_prompt(prompt)


def test_prompt_too_long():
    with pytest.raises(ValueError, match="at most"):
        check_prompt("x" * 30_000)


@pytest.mark.parametrize("n", [0, -3, 10**6, 1.5])
def test_max_new_tokens(n):
    with pytest.raises(ValueError, match="max_new_tokens"):
        check_max_new_tokens(n)


def test_context_overflow_and_missing_head(tiny):
    target, head = tiny
    engine = Engine(target, head)
    with pytest.raises(ValueError, match="max_new_tokens.*context of 512"):
        engine.generate(prompt_ids=list(range(3, 400)), max_new_tokens=200)
    with pytest.raises(ValueError, match="needs a draft head"):
        Engine(target, None).generate(prompt_ids=[5, 6], tree=TreeConfig(method="dynamic"), max_new_tokens=5)
    # vanilla needs no head
    *_, summary = Engine(target, None).generate(prompt_ids=[5, 6], tree=TreeConfig(method="vanilla"), max_new_tokens=5)
    assert summary.new_tokens == 5


# `python -m app generate ARGS`, saying on its last stderr line whether torch was imported
_CLI = ("import sys; from app.__main__ import main; rc = main(['generate', *sys.argv[1:]]); "
        "print('torch imported' if 'torch' in sys.modules else 'torch not imported', file=sys.stderr); sys.exit(rc)")


def cli(*args):
    return subprocess.run([sys.executable, "-c", _CLI, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, needle", [
    (["--prompt", "hi", "--method", "beam"], "method"),
    (["--prompt", "hi", "--depth", "0"], "depth"),
    (["--prompt", "hi", "--method", "threshold", "--tau-low", "0.9", "--tau-high", "0.1"], "tau_low"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["--prompt", "hi", "--top-p", "0"], "top_p"),
    (["--prompt", "  "], "prompt"),
    (["--prompt", "hi", "--max-new-tokens", "0"], "max_new_tokens"),
    (["--prompt", "hi", "--base-model", "/no/such/model/dir"], "does not exist"),
    (["--prompt", "hi", "--device", "tpu"], "device"),
])
def test_cli_exits_2_with_a_message(args, needle):
    """... before it imports torch: bad input is refused at once, not after ~10 s of loading."""
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1] == "torch not imported"


def test_cli_refuses_to_run_without_a_head(tmp_path):
    r = cli("--prompt", "hi", "--draft-model", str(tmp_path / "missing" / "head"), "--max-new-tokens", "3")
    assert r.returncode == 2 and "draft model folder" in r.stderr
    assert r.stderr.splitlines()[-1] == "torch not imported"
    (tmp_path / "a-file").write_text("")
    r = cli("--prompt", "hi", "--method", "medusa", "--medusa-model", str(tmp_path / "a-file"))
    assert r.returncode == 2 and "no Medusa heads at" in r.stderr


def test_cli_tree_knobs_default_to_auto_only_for_dynamic():
    import argparse

    from app.args import tree_config_from, wants_auto_tree
    from app.cli import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--prompt", "x"])
    assert wants_auto_tree(args)
    assert tree_config_from(args) == TreeConfig()          # auto starts from the defaults
    args = p.parse_args(["--prompt", "x", "--total-tokens", "9"])
    assert not wants_auto_tree(args) and tree_config_from(args).total_tokens == 9
    args = p.parse_args(["--prompt", "x", "--method", "chain"])
    assert not wants_auto_tree(args)
