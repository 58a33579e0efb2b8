"""The tiny tokenizer round-trips text, and transformers reads the same files the same way."""

from __future__ import annotations

from glmlab.checkpoint.tokenizer import TINY_SPECIALS
from glmlab.tokenizer import Tokenizer


def test_round_trip_and_specials(tiny_dir):
    tok = Tokenizer.from_dir(tiny_dir)
    text = "Hello, GLM! ünïcødé 你好 \n\t end"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and all(i < 256 for i in ids)
    assert tok.encode("<|user|>") == [TINY_SPECIALS["<|user|>"]]
    assert tok.eos_token_ids == (256, 263, 265)
    chat = tok.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    assert chat == "[gMASK]<sop><|system|>\nbe brief<|user|>\nhi<|assistant|>\n"


def test_transformers_agrees(tiny_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_dir))
    ours = Tokenizer.from_dir(tiny_dir)
    for text in ("plain ascii", "naïve café", "<|assistant|>\nok"):
        assert hf.encode(text, add_special_tokens=False) == ours.encode(text)
    msgs = [{"role": "user", "content": "hi"}]
    assert hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
        ours.apply_chat_template(msgs)
    )
