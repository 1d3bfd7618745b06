"""Heads in vLLM's speculators layout (app/engine/heads/speculators.py, `python -m app export-head`):
the round trip ours -> speculators -> ours is lossless (same tensors, same drafts, same output),
a speculators-layout head drafts exactly as the same head in the original layout, the real
``speculators`` library (0.9.0, installed --no-deps beside our pins: requirements-speculators.txt)
loads our EAGLE-3 export with its own loader and computes what our head computes, and a head
we cannot run fails in one line naming why.

EAGLE-3 on the tiny 8-layer Llama of tests/tiny.py; EAGLE-2 on the tiny 2-layer one and the
shipped head with the embedded SmolLM2-135M-Instruct.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from app.__main__ import main as cli
from app.engine.heads import speculators as sf
from app.engine.config import TreeConfig
from app.engine.factory import load_engine
from app.engine.loading import DEFAULT_HEAD_DIR
from app.export_head import export
from tests.tiny import eagle3_target, trained_eagle3_head

PROMPT = [5, 17, 33, 90, 4]
TREE = TreeConfig(method="dynamic", depth=3, top_k=3, total_tokens=8)


@pytest.fixture(scope="module")
def e3_target():
    return eagle3_target(0)


@pytest.fixture(scope="module")
def e3_official(e3_target, tmp_path_factory):
    """A briefly trained EAGLE-3 head (its drafts get accepted) in the official layout."""
    folder = tmp_path_factory.mktemp("e3_official")
    trained_eagle3_head(e3_target).save(folder)
    return folder


@pytest.fixture(scope="module")
def e2_official(tiny, tmp_path_factory):
    folder = tmp_path_factory.mktemp("e2_official")
    tiny[1].save(folder)
    return folder


@pytest.fixture(scope="module")
def library():
    try:
        import speculators  # noqa: F401
        from speculators import SpeculatorModel, SpeculatorsConfig
        from speculators.models.eagle3 import Eagle3SpeculatorConfig
    except Exception as exc:  # noqa: BLE001  (any import failure: say which)
        pytest.skip(f"speculators library not importable: {type(exc).__name__}: {exc}")
    return SpeculatorModel, SpeculatorsConfig, Eagle3SpeculatorConfig


def drafts(engine, prompt=PROMPT, n=30):
    """Everything the head decides in a greedy run: each step's tree (tokens, shape, q) and
    what was accepted, plus the output."""
    *steps, summary = engine.generate(prompt_ids=prompt, tree=TREE, max_new_tokens=n)
    trees = [(s.tree.tokens, s.tree.parents, s.tree.q, s.accepted) for s in steps if s.tree is not None]
    return trees, summary.token_ids


def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


# --- (a) round trip and (b) layouts agree ---------------------------------------------------

def test_eagle3_round_trip_keeps_tensors_and_drafts(e3_target, e3_official, tmp_path):
    spec = export(str(e3_official), "speculators", tmp_path / "spec", verifier="tiny-8-layer-llama")
    back = export(str(spec), "eagle", tmp_path / "back")
    config = json.loads((spec / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["speculators_config"]["verifier"]["name_or_path"] == "tiny-8-layer-llama"
    assert set(load_file(spec / "model.safetensors")) == {k.replace("midlayer.", "layers.0.")
                                                          for k in load_file(e3_official / "model.safetensors")}
    assert load_file(back / "model.safetensors").keys() == load_file(e3_official / "model.safetensors").keys()
    engines = [load_engine(draft_model=str(f), target=e3_target)[0] for f in (e3_official, spec, back)]
    assert all(e.head.kind == "eagle3" and e.target_layers == (2, 4, 5) for e in engines)
    for e in engines[1:]:
        same_state(engines[0].head, e.head)
    runs = [drafts(e) for e in engines]
    assert runs[0] == runs[1] == runs[2]
    assert runs[0][1] == e3_target.model.generate(torch.tensor([PROMPT]), max_new_tokens=30,
                                                  do_sample=False)[0, len(PROMPT):].tolist()
    assert sum(len(t[3]) for t in runs[0][0]) > 0        # drafts were accepted: the trees mattered


def test_eagle2_round_trip_keeps_tensors_and_drafts(tiny, e2_official, tmp_path):
    target = tiny[0]
    spec = export(str(e2_official), "speculators", tmp_path / "spec", verifier="tiny-llama")
    back = export(str(spec), "eagle", tmp_path / "back")
    config = json.loads((spec / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle" and config["fusion_bias"] is True
    assert {"fusion_fc.weight", "fusion_fc.bias"} <= set(load_file(spec / "model.safetensors"))
    assert (back / "model.safetensors").read_bytes() == (e2_official / "model.safetensors").read_bytes()
    engines = [load_engine(draft_model=str(f), target=target)[0] for f in (e2_official, spec, back)]
    for e in engines[1:]:
        same_state(engines[0].head, e.head)
    runs = [drafts(e) for e in engines]
    assert runs[0] == runs[1] == runs[2] and sum(len(t[3]) for t in runs[0][0]) > 0


def test_the_shipped_head_travels_with_its_draft_vocabulary(embedded_target, tmp_path):
    """The shipped EAGLE-2 head, exported by the CLI with its defaults: draft_vocab.json goes
    along, and the embedded target drafts and decodes the same with either folder; back in
    the original layout it is the shipped files byte for byte."""
    assert cli(["export-head", "--format", "speculators", "--out", str(tmp_path / "spec")]) == 0
    assert cli(["export-head", "--format", "eagle", "--head", str(tmp_path / "spec"),
                "--out", str(tmp_path / "back")]) == 0
    for name in ("model.safetensors", "draft_vocab.json"):
        assert (tmp_path / "back" / name).read_bytes() == (DEFAULT_HEAD_DIR / name).read_bytes()
    verifier = json.loads((tmp_path / "spec" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct", "architectures": ["LlamaForCausalLM"]}
    shipped, _ = load_engine(draft_model=str(DEFAULT_HEAD_DIR), target=embedded_target)
    spec, _ = load_engine(draft_model=str(tmp_path / "spec"), target=embedded_target)
    assert torch.equal(shipped.draft_vocab, spec.draft_vocab)
    same_state(shipped.head, spec.head)
    prompt = embedded_target.tokenizer("The capital of France is")["input_ids"]
    assert drafts(shipped, prompt, 12) == drafts(spec, prompt, 12)


# --- the real library ------------------------------------------------------------------------

def test_the_speculators_library_loads_our_eagle3_export_and_computes_the_same(library, e3_target, e3_official,
                                                                                tmp_path):
    """speculators' own SpeculatorModel.from_pretrained (verifier: the tiny target saved as a
    folder) reads our export into its Eagle3DraftModel with every tensor equal to ours, and its
    first decoder layer + norm + lm_head give our head's logits exactly.

    Not checked: the library's own fill-in of embed_tokens from the verifier. It fills it only
    where its NaN "not loaded" marker survives, and under our transformers 5.24 (it declares
    <= 5.19) the loader's init of missing weights overwrote that marker: the embeddings came out
    random here, whatever the checkpoint. vLLM takes them from the target model."""
    SpeculatorModel, SpeculatorsConfig, Eagle3SpeculatorConfig = library
    e3_target.model.save_pretrained(tmp_path / "verifier")
    spec = export(str(e3_official), "speculators", tmp_path / "spec", verifier=str(tmp_path / "verifier"))
    config = Eagle3SpeculatorConfig.from_pretrained(str(spec))
    assert config.draft_vocab_size == 197 and config.eagle_aux_hidden_state_layer_ids == [2, 4, 5]
    assert config.norm_before_residual is False and config.speculators_config.verifier.architectures == [
        "LlamaForCausalLM"]
    theirs = SpeculatorModel.from_pretrained(str(spec))
    assert type(theirs).__name__ == "Eagle3DraftModel"
    ours = load_engine(draft_model=str(spec), target=e3_target)[0].head
    state = theirs.state_dict()
    for k, v in sf.speculators_state(ours).items():      # every tensor we wrote (embed_tokens is the
        assert torch.equal(v, state[k]), k                 # target's: not ours to check, see below)

    theirs.config.transformer_layer_config._attn_implementation = "sdpa"   # flex attention is for GPUs
    torch.manual_seed(1)
    emb, hidden, pos = torch.randn(1, 6, 64), torch.randn(1, 6, 64), torch.arange(6)[None]
    with torch.no_grad():
        x = torch.cat([emb, hidden], -1)
        a = theirs.layers[0](x, attention_mask=None, position_ids=pos, position_embeddings=theirs.rotary_emb(x, pos))
        b = ours.midlayer(emb, hidden, None, ours.rotary_emb(hidden, pos))
        assert torch.equal(theirs.lm_head(theirs.norm(a)), ours.logits(b))


def test_a_head_the_library_saved_drafts_as_ours(library, e3_target, e3_official, tmp_path):
    """The other direction: the library's save_pretrained of that model (it also stores the
    verifier's embeddings) loads here and drafts exactly as the original head."""
    SpeculatorModel, *_ = library
    e3_target.model.save_pretrained(tmp_path / "verifier")
    spec = export(str(e3_official), "speculators", tmp_path / "spec", verifier=str(tmp_path / "verifier"))
    theirs = SpeculatorModel.from_pretrained(str(spec))
    with torch.no_grad():     # the verifier's embeddings, as the library means to fill them (see above)
        theirs.embed_tokens.weight.copy_(e3_target.model.get_input_embeddings().weight)
    theirs.save_pretrained(tmp_path / "resaved")
    resaved = load_engine(draft_model=str(tmp_path / "resaved"), target=e3_target)[0]
    assert resaved.head.embed_tokens is not None
    assert drafts(resaved) == drafts(load_engine(draft_model=str(e3_official), target=e3_target)[0])


def test_the_eagle2_export_has_a_valid_speculators_config(library, e2_official, tmp_path):
    """speculators 0.9.0 has no EAGLE-1/2 model class (only eagle3 among the EAGLE kinds):
    the eagle export's speculators_config still validates with the library's own class."""
    _, SpeculatorsConfig, _ = library
    from speculators import SpeculatorModelConfig

    assert "eagle" not in (SpeculatorModelConfig.registry or {}) and "eagle3" in SpeculatorModelConfig.registry
    spec = export(str(e2_official), "speculators", tmp_path / "spec", verifier="tiny-llama")
    checked = SpeculatorsConfig.model_validate(json.loads((spec / "config.json").read_text())["speculators_config"])
    assert checked.algorithm == "eagle" and checked.default_proposal_method == "greedy"


# --- (c) what we cannot run, in one line -----------------------------------------------------

@pytest.mark.parametrize("field, value, match", [
    ("speculators_model_type", "dflash", "speculators_model_type 'dflash' is not supported"),
    ("norm_before_residual", True, "norm_before_residual true is not supported"),
    ("fc_norm", True, "fc_norm true is not supported"),
])
def test_an_unsupported_speculators_head_fails_in_one_line(e3_target, e3_official, tmp_path, field, value, match):
    spec = export(str(e3_official), "speculators", tmp_path / "spec", verifier="tiny-8-layer-llama")
    config = json.loads((spec / "config.json").read_text())
    config[field] = value
    (spec / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match) as err:
        load_engine(draft_model=str(spec), target=e3_target)
    assert "\n" not in str(err.value)


def test_export_head_refuses_a_bad_folder_in_one_line(e2_official, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(e2_official, bad)
    (bad / "model.safetensors").unlink()
    for argv in (["--head", str(tmp_path / "missing")], ["--head", str(tmp_path)], ["--head", str(bad)],
                 ["--head", str(e2_official), "--out", str(e2_official)],
                 ["--head", str(e2_official), "--out", str(tmp_path / "no-verifier")]):   # not SmolLM2's shape
        capsys.readouterr()
        assert cli(["export-head", "--format", "speculators", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
