"""Real model families (Qwen2, Llama/Mistral) through dapo's loading, templating and both local
rollout engines: templates applied once, EOS/pad as the family does, context checked, checkpoints
that plain transformers loads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fixtures.model_families import QWEN2_SPLIT_PATTERN, QWEN_DEFAULT_SYSTEM, Family
from transformers import AutoModelForCausalLM, AutoTokenizer

from dapo_cli.errors import UserError
from dapo_cli.models import format_prompt, load_policy, save_policy
from dapo_cli.rollout.base import SamplingParams
from dapo_cli.rollout.fast import FastRolloutEngine, _NativeDecoder
from dapo_cli.rollout.hf import HFRolloutEngine, eos_token_ids

pytestmark = pytest.mark.slow  # the real-tokenizer fixtures take seconds to build

QUESTION = [{"role": "user", "content": "What is 17 + 25?\n\nThink step by step."}]
TEXT = "Hello world!\n\n  12345 + 678 = ?  Ünïcödé 中文\tend"


@pytest.fixture(scope="module")
def loaded(family: Family):
    model, tokenizer = load_policy(family.path)
    return family, model, tokenizer


@pytest.mark.slow
def test_the_qwen2_tokenizer_is_qwens_bpe(qwen2_dir: Family) -> None:
    """The fixture's tokenizer.json encodes as tiktoken does with Qwen's ranks and split pattern."""
    import dashscope
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(Path(dashscope.__file__).parent / "resources" / "qwen.tiktoken"))
    reference = tiktoken.Encoding("qwen", pat_str=QWEN2_SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens={})
    _, tokenizer = load_policy(qwen2_dir.path)
    assert len(ranks) == 151643 and len(tokenizer) == 151646
    assert tokenizer(TEXT, add_special_tokens=False)["input_ids"] == reference.encode(TEXT)
    assert tokenizer.decode(reference.encode(TEXT)) == TEXT


@pytest.mark.slow
def test_qwen2_prompt_is_the_qwen25_chat_format_once(qwen2_dir: Family) -> None:
    _, tokenizer = load_policy(qwen2_dir.path)
    text = format_prompt(tokenizer, QUESTION)
    assert text == (
        f"<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{QUESTION[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 151644 and ids.count(151644) == 3 and ids.count(151645) == 2  # 3 turns opened, 2 closed
    assert ids[-3:] == tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert tokenizer.bos_token_id is None  # Qwen2 has no BOS: nothing is prepended
    # a system message replaces the default one instead of adding a second
    with_system = format_prompt(tokenizer, [{"role": "system", "content": "Be brief."}, *QUESTION])
    assert with_system.count("<|im_start|>system") == 1 and QWEN_DEFAULT_SYSTEM not in with_system


def test_mistral_prompt_has_one_bos_and_the_inst_markers(mistral_dir: Family) -> None:
    _, tokenizer = load_policy(mistral_dir.path)
    text = format_prompt(tokenizer, QUESTION)
    assert text == f"<s>[INST] {QUESTION[0]['content']}[/INST]"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # what the rollout engines encode
    assert ids[:3] == [1, 3, tokenizer.convert_tokens_to_ids("▁What")] and ids[-1] == 4  # <s> [INST] ▁What ... [/INST]
    assert ids.count(1) == 1
    # the trap the engines avoid: the family's tokenizer adds a BOS of its own on a plain encode
    assert tokenizer(text)["input_ids"][:2] == [1, 1]
    system = format_prompt(tokenizer, [{"role": "system", "content": "Be brief."}, *QUESTION])
    assert system.startswith("<s>[INST] Be brief.\n\nWhat is") and system.count("<s>") == 1


def test_eos_and_pad_are_the_familys(loaded) -> None:
    family, model, tokenizer = loaded
    assert eos_token_ids(model, tokenizer) == list(family.eos_ids)
    assert tokenizer.pad_token_id == family.pad_id and tokenizer.padding_side == "left"
    assert tokenizer.bos_token_id == family.bos_id


@pytest.mark.parametrize("engine_cls", [HFRolloutEngine, FastRolloutEngine], ids=["hf", "fast"])
def test_both_engines_sample_with_the_familys_ids(loaded, engine_cls) -> None:
    family, model, tokenizer = loaded
    prompts = [format_prompt(tokenizer, QUESTION), format_prompt(tokenizer, [{"role": "user", "content": "1+1?"}])]
    out = engine_cls(model, tokenizer).generate(prompts, 2, SamplingParams(max_tokens=6, seed=3, logprobs=True))
    rendered = tokenizer(prompts[0], add_special_tokens=False)["input_ids"]
    row = out.prompt_ids[0][out.prompt_mask[0]].tolist()
    assert row == rendered  # the rendered template, tokenised once: no second BOS, nothing added
    short = out.prompt_ids[2]
    assert short[~out.prompt_mask[2]].eq(family.pad_id).all() and not out.prompt_mask[2][0]  # left-padded with pad
    assert out.response_ids.shape == (4, out.lengths.max()) and out.logprobs is not None
    assert torch.isfinite(out.logprobs).all() and (out.logprobs <= 0).all()
    assert all(isinstance(t, str) for t in out.texts)


def test_the_fast_engine_decodes_these_configs_natively_and_matches_generate(loaded) -> None:
    """Qwen2: q/k/v bias, tied embeddings; Mistral: no bias, untied; both GQA 4/2 and rope_theta 1e6."""
    family, model, tokenizer = loaded
    assert _NativeDecoder.supports(model)
    attention = model.model.layers[0].self_attn
    if family.name == "qwen2":
        assert attention.q_proj.bias is not None and model.lm_head.weight is model.model.embed_tokens.weight
    else:
        assert attention.q_proj.bias is None and model.lm_head.weight is not model.model.embed_tokens.weight
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert model.config.rope_parameters["rope_theta"] == 1_000_000.0
    prompts = [format_prompt(tokenizer, QUESTION), format_prompt(tokenizer, [{"role": "user", "content": "2*3?"}])]
    greedy = SamplingParams(temperature=0.0, max_tokens=8, logprobs=True)
    fast = FastRolloutEngine(model, tokenizer).generate(prompts, 1, greedy)
    hf = HFRolloutEngine(model, tokenizer).generate(prompts, 1, greedy)
    assert torch.equal(fast.response_ids, hf.response_ids) and fast.texts == hf.texts
    torch.testing.assert_close(fast.logprobs, hf.logprobs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("engine_cls", [HFRolloutEngine, FastRolloutEngine], ids=["hf", "fast"])
@pytest.mark.slow
def test_a_prompt_plus_max_tokens_past_the_context_is_refused_before_generating(loaded, engine_cls) -> None:
    family, model, tokenizer = loaded
    prompt = format_prompt(tokenizer, QUESTION)
    length = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    engine = engine_cls(model, tokenizer)
    engine.generate([prompt], 1, SamplingParams(max_tokens=family.context - length, seed=0))  # exactly fits
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))  # nothing may run after the refusal
    too_many = family.context - length + 1
    with pytest.raises(UserError) as info:
        engine.generate([prompt], 1, SamplingParams(max_tokens=too_many, seed=0))
    message = str(info.value)
    assert f"a prompt of {length} tokens + max_tokens {too_many} = {family.context + 1}" in message
    assert f"context of {family.context} positions" in message and "--max-tokens" in message
    assert f"lower max_tokens to at most {family.context - length} " in message and "\n" not in message
    assert not calls
    model._forward_pre_hooks.clear()


@pytest.mark.slow
def test_a_saved_checkpoint_loads_with_plain_auto_classes_and_generates(loaded, tmp_path: Path) -> None:
    family, model, tokenizer = loaded
    save_policy(model, tokenizer, tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 1_000_000.0  # read by 4.x too
    plain_tok = AutoTokenizer.from_pretrained(tmp_path / "model")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    prompt = format_prompt(plain_tok, QUESTION)
    assert prompt == format_prompt(tokenizer, QUESTION)  # the chat template travels with the checkpoint
    ids = plain_tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert plain_tok.eos_token_id == family.eos_ids[0] and plain_tok.pad_token_id == family.pad_id
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
        out = plain.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=family.pad_id)
    assert out.shape[1] <= ids.shape[1] + 4 and out.shape[1] > ids.shape[1]
