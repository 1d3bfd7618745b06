"""scripts/heldout_acceptance.py --suite: a head's acceptance by depth on an evaluation set's
own greedy answers, made by the script from the set's first turns."""
from __future__ import annotations

from pathlib import Path

import torch

from app.train.data import FeatureShard
from app.train.evaluate import first_turns
from tests.scripts import load_script

SHIPPED_EAGLE3 = Path(__file__).resolve().parents[1] / "models" / "eagle3-smollm2-135m-instruct"


def script():
    return load_script("heldout_acceptance")


def test_a_suite_shard_holds_the_targets_greedy_answers_to_its_first_turns(embedded_target, tmp_path, capsys):
    t = embedded_target
    path = script().suite_shard(t, "qa", 2, 10, tmp_path)
    shard = FeatureShard.load(path)
    assert len(shard) == 2 and shard.layers and shard.layer_features is not None
    for s, turn in enumerate(first_turns("qa", 2)):
        tokens, _, prompt_len = shard.conversation(s)
        prompt = t.tokenizer.apply_chat_template([{"role": "user", "content": turn}], add_generation_prompt=True,
                                                 return_tensors="pt", return_dict=True)["input_ids"]
        assert torch.equal(tokens[:prompt_len], prompt[0])
        plain = t.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=9,
                                 pad_token_id=0)[0, prompt_len:]
        assert torch.equal(tokens[prompt_len:], plain[:len(tokens) - prompt_len])
    script().report(t, {"qa": [path]}, [str(SHIPPED_EAGLE3)], depth=2)
    row = capsys.readouterr().out.strip().splitlines()[-1].split("|")
    assert row[1].strip() == "qa" and row[3].strip() == "eagle3"
    assert all(0.0 <= float(x) <= 1.0 for x in row[4:6])
