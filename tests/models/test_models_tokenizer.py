"""Character tokenizer: one token per character (newlines too), chat template, save/reload."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.models.tiny import build_tiny_model_for, save_policy
from dapo_cli.models.tokenizer import (
    CHARACTERS,
    RESPONSE_SEPARATOR,
    SPECIAL_TOKENS,
    build_char_tokenizer,
    char_vocab,
    format_prompt,
)

SAMPLE = "a\n\nb  c\t. ,\\frac{1}{2} $x^2$ ≤ π\n"


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return build_char_tokenizer()


def test_vocabulary_layout_and_special_ids(tok):
    vocab = char_vocab()
    assert len(tok) == len(vocab) == len(SPECIAL_TOKENS) + len(CHARACTERS) == 114
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id, tok.bos_token_id) == (0, 1, 2, 3)
    assert vocab["\n"] == 4 and vocab["\t"] == 5 and vocab[" "] == 6 and vocab["~"] == 100
    assert len(set(CHARACTERS)) == len(CHARACTERS)


def test_every_character_is_one_token_including_repeated_newlines(tok):
    vocab = char_vocab()
    # the FINDINGS trap: with `.` as the split regex '\n\n' would become a single <unk>
    assert tok("a\n\nb", add_special_tokens=False)["input_ids"] == [vocab[c] for c in "a\n\nb"]
    ids = tok(SAMPLE)["input_ids"]  # nothing is added around the text either
    assert ids == [vocab[c] for c in SAMPLE]
    assert tok.decode(ids) == SAMPLE  # no space clean-up: " ." and " ," survive


def test_unknown_characters_map_to_unk_and_are_dropped_as_special(tok):
    ids = tok("a€b", add_special_tokens=False)["input_ids"]
    assert ids == [char_vocab()["a"], tok.unk_token_id, char_vocab()["b"]]
    assert tok.decode(ids) == "a<unk>b"
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == "ab"


def test_eos_text_in_a_string_is_the_eos_token(tok):
    assert tok("x<eos>", add_special_tokens=False)["input_ids"] == [char_vocab()["x"], tok.eos_token_id]


def test_chat_template_renders_prompt_then_separator(tok):
    user = [{"role": "user", "content": "What is 1+2?"}]
    assert RESPONSE_SEPARATOR == "\n"
    assert format_prompt(tok, user) == "What is 1+2?" + RESPONSE_SEPARATOR
    assert tok.apply_chat_template(user, tokenize=False) == "What is 1+2?"  # no generation prompt
    conversation = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"},
    ]
    # system and user joined by a blank line; the assistant turn is separator + content + <eos>
    assert tok.apply_chat_template(conversation, tokenize=False) == "S\n\nU\nA<eos>"
    assert format_prompt(tok, conversation[:2]) == "S\n\nU\n"


def test_format_prompt_without_a_chat_template_joins_user_messages():
    plain = build_char_tokenizer()
    plain.chat_template = None
    messages = [{"role": "system", "content": "ignored"}, {"role": "user", "content": "Q1"}]
    assert format_prompt(plain, messages + [{"role": "user", "content": "Q2"}]) == "Q1\n\nQ2"


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_reload_from_a_model_directory_gives_the_same_ids(tok, tmp_path, architecture):
    cfg = TinyModelConfig(architecture=architecture, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    save_policy(build_tiny_model_for(cfg, tok), tok, tmp_path)
    expected = tok(SAMPLE)["input_ids"]
    fast = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert fast(SAMPLE)["input_ids"] == expected and fast.decode(expected) == SAMPLE
    assert format_prompt(fast, [{"role": "user", "content": "Q"}]) == "Q\n"
    assert (fast.pad_token_id, fast.eos_token_id) == (0, 1)
    if architecture == "llama":  # beside a qwen2 config AutoTokenizer builds a byte-level Qwen2 tokenizer
        auto = AutoTokenizer.from_pretrained(tmp_path)
        assert auto(SAMPLE)["input_ids"] == expected and auto.decode(expected) == SAMPLE
