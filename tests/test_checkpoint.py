"""The official EAGLE checkpoint layout round-trips, and loading is strict."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.engine.heads.eagle import DraftHead, head_config_for
from app.engine.loading import load_draft_head

OFFICIAL_KEYS = {
    "fc.weight", "fc.bias",
    "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight",
    "layers.0.post_attention_layernorm.weight",
}


def saved_head(tiny, tmp_path):
    target, head = tiny
    head.save(tmp_path)
    return target, head


def test_layout_and_round_trip(tiny, tmp_path):
    target, head = saved_head(tiny, tmp_path)
    assert set(load_file(tmp_path / "model.safetensors")) == OFFICIAL_KEYS
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["bias"] is True
    loaded = load_draft_head(str(tmp_path), target)
    for k, v in head.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k])


def test_a_head_saved_in_bfloat16_loads_as_its_rounded_float32_weights(tiny, tmp_path):
    """``save(dtype=torch.bfloat16)`` (``--head-dtype bfloat16``, half the bytes of a head kept
    in git) writes bfloat16 tensors; loading gives float32 weights equal to the originals
    rounded to bfloat16."""
    target, head = tiny
    head.save(tmp_path, dtype=torch.bfloat16)
    assert {v.dtype for v in load_file(tmp_path / "model.safetensors").values()} == {torch.bfloat16}
    loaded = load_draft_head(str(tmp_path), target)
    for k, v in head.state_dict().items():
        assert loaded.state_dict()[k].dtype == torch.float32
        assert torch.equal(loaded.state_dict()[k], v.bfloat16().float()), k


def test_pytorch_bin_with_embeddings_loads(tiny, tmp_path):
    """Published heads ship pytorch_model.bin, some with their own embed_tokens."""
    target, head = saved_head(tiny, tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["embed_tokens.weight"] = target.model.get_input_embeddings().weight.clone()
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = load_draft_head(str(tmp_path), target)
    assert loaded.embed_tokens is not None


@pytest.mark.parametrize("change", ["rename", "drop", "extra", "shape"])
def test_wrong_keys_fail_loudly(tiny, tmp_path, change):
    target, _ = saved_head(tiny, tmp_path)
    path = tmp_path / "model.safetensors"
    state = load_file(path)
    if change == "rename":
        state["layers.0.self_attn.q.weight"] = state.pop("layers.0.self_attn.q_proj.weight")
        match = "q_proj"
    elif change == "drop":
        del state["layers.0.mlp.up_proj.weight"]
        match = "missing keys.*up_proj"
    elif change == "extra":
        state["layers.0.input_layernorm.weight"] = torch.ones(target.model.config.hidden_size)
        match = "unexpected keys.*input_layernorm"
    else:
        state["fc.weight"] = torch.zeros(3, 3)
        match = "fc.weight has shape"
    save_file(state, str(path))
    with pytest.raises((KeyError, ValueError), match=match):
        load_draft_head(str(tmp_path), target)


def test_head_must_fit_the_target(tiny, tmp_path):
    from tests.tiny import tiny_target

    target, _ = tiny
    other = tiny_target(0, hidden=32)
    DraftHead(head_config_for(other.model.config)).save(tmp_path)
    with pytest.raises(ValueError, match="hidden_size"):
        load_draft_head(str(tmp_path), target)


def test_missing_folder_and_files(tiny, tmp_path):
    target, _ = tiny
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_draft_head(str(tmp_path / "nope" / "deeper"), target)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_draft_head(str(tmp_path), target)
    (tmp_path / "config.json").write_text(json.dumps(head_config_for(target.model.config).to_dict()))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_draft_head(str(tmp_path), target)


@pytest.mark.parametrize("mark", ["keys", "architecture"])
def test_an_eagle3_checkpoint_is_told_apart_from_an_eagle2_one(tiny, tmp_path, mark):
    """The head's kind comes from the checkpoint (midlayer, d2t/t2d, or an Eagle3 architecture
    name): such a checkpoint is read as EAGLE-3 (tests/test_eagle3.py loads real ones), so a
    renamed EAGLE-2 head fails as an EAGLE-3 one, and DraftHead.load says where to load it."""
    from app.engine.heads import load_head

    target, _ = saved_head(tiny, tmp_path)
    path = tmp_path / "model.safetensors"
    state = load_file(path)
    if mark == "keys":
        state = {k.replace("layers.0.", "midlayer."): v for k, v in state.items()}
        state["d2t"] = torch.zeros(8, dtype=torch.long)
        save_file(state, str(path))
    else:
        config = json.loads((tmp_path / "config.json").read_text())
        config["architectures"] = ["LlamaForCausalLMEagle3"]
        (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="is an EAGLE-3 head.*load_head"):
        DraftHead.load(tmp_path)
    with pytest.raises((KeyError, ValueError), match="draft_vocab_size|EAGLE-3 layout"):
        load_head(tmp_path, target.model.config.num_hidden_layers)


def test_the_shipped_config_carries_rope_theta_for_older_readers():
    """transformers 5 keeps the RoPE base only in rope_parameters; a reader without it (the EAGLE
    reference code, transformers 4) falls back to 10,000. The shipped head's config.json also
    has the top-level fields, equal to rope_parameters', and still loads strictly."""
    from app.engine.loading import DEFAULT_HEAD_DIR

    raw = json.loads((DEFAULT_HEAD_DIR / "config.json").read_text())
    assert raw["rope_theta"] == raw["rope_parameters"]["rope_theta"] == 100000.0
    assert raw["rope_scaling"] is None and raw["rope_parameters"]["rope_type"] == "default"
    head = DraftHead.load(DEFAULT_HEAD_DIR)
    assert head.config.rope_parameters["rope_theta"] == 100000.0


def test_saved_configs_carry_rope_theta_and_a_disagreeing_one_is_refused(tiny, tmp_path):
    target, _ = saved_head(tiny, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["rope_theta"] == raw["rope_parameters"]["rope_theta"] == target.model.config.rope_parameters["rope_theta"]
    raw["rope_theta"] = 10000.0 + raw["rope_theta"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="rope_theta .* but rope_parameters"):
        load_draft_head(str(tmp_path), target)
