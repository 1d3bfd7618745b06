"""A step's text: ``TextStream`` decodes only the answer's last tokens, and the steps' texts
still add up to the whole answer's decode, with multi-byte characters split across tokens
held back until whole (SmolLM2's byte-level tokenizer splits an emoji or a CJK character
into several tokens)."""
from __future__ import annotations

import random

import pytest

from app.engine.run_state import TextStream

TEXT = "Caf\u00e9 \u2615 costs 3\u20ac. \U0001F389\U0001F389 \u4e16\u754c\u4f60\u597d, na\u00efve r\u00e9sum\u00e9 \U0001F468\u200d\U0001F469\u200d\U0001F467!"


@pytest.fixture(scope="module")
def tokenizer(embedded_target):
    return embedded_target.tokenizer


def test_the_steps_texts_add_up_to_the_answer_and_never_split_a_character(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    decode = lambda x: tokenizer.decode(x, skip_special_tokens=True)
    assert decode(ids) == TEXT and len(ids) > len(TEXT.split())     # characters span several tokens
    calls = []
    for seed in range(20):
        rng = random.Random(seed)
        stream, emitted, at = TextStream(lambda x: calls.append(len(x)) or decode(x)), [], 0
        while at < len(ids):
            n = rng.randint(1, 3)
            step = ids[at:at + n]
            at += len(step)
            text = stream.push(step, final=at >= len(ids))
            assert "\ufffd" not in text
            emitted.append(text)
        assert "".join(emitted) == stream.text == TEXT
    assert max(calls) <= 20 < len(ids)      # windows of a few tokens (a held-back character's), not the answer


def test_an_answer_cut_inside_a_character_ends_with_what_the_tokens_decode_to(tokenizer):
    ids = tokenizer.encode("ok \U0001F389", add_special_tokens=False)
    cut = ids[:-1]                                                    # the emoji's last byte missing
    decode = lambda x: tokenizer.decode(x, skip_special_tokens=True)
    stream = TextStream(decode)
    texts = [stream.push([t], final=i == len(cut) - 1) for i, t in enumerate(cut)]
    assert "".join(texts) == decode(cut) and decode(cut).endswith("\ufffd")
