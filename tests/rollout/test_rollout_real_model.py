"""Every rollout engine on a real pretrained model (SmolLM2-135M-Instruct, the ``smollm2_dir`` fixture): its
chat-templated prompt, greedy tokens equal across engines, sampled-token log-probs equal to the trainer's."""

from __future__ import annotations

import pytest
import torch

from dapo_cli.batch import RolloutBatch
from dapo_cli.engine.torch import policy_forward
from dapo_cli.models import load_policy
from dapo_cli.models.tokenizer import format_prompt
from dapo_cli.rollout.base import SamplingParams

pytestmark = pytest.mark.gguf  # the smollm2_dir fixture imports the GGUF file once (then the cache serves it)

QUESTIONS = ["What is 3 + 4? End with 'Answer: N'.", "What is 12 + 19? End with 'Answer: N'."]
LOGPROB_TOL = 2e-4
"""float32 on every side; measured 1.9e-5 (fast) and 4.1e-5 (vLLM's CPU build) over 2 x 2 samples of 32 tokens."""


@pytest.fixture(scope="module")
def policy(smollm2_dir):
    return load_policy(smollm2_dir)


@pytest.fixture(scope="module", params=["hf", "fast", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request, smollm2_dir, policy):
    model, tokenizer = policy
    if request.param == "vllm":
        from dapo_cli.rollout.vllm import VLLMRolloutEngine

        # 0.1 of the node (2.35 GiB) left no KV cache once this process had loaded the suite's other models
        built = VLLMRolloutEngine(smollm2_dir, tokenizer, gpu_memory_utilization=0.3, sleep_level=0, dtype="float32", max_model_len=512)
        yield built
        built.close()
        return
    if request.param == "hf":
        from dapo_cli.rollout.hf import HFRolloutEngine as Engine
    else:
        from dapo_cli.rollout.fast import FastRolloutEngine as Engine
    yield Engine(model, tokenizer)


def prompts(tokenizer) -> list[str]:
    return [format_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]


def test_the_chat_template_frames_the_prompt_and_eos_is_im_end(policy):
    """ChatML with SmolLM2's default system prompt; no BOS is added (the template's <|im_start|> is id 1);
    EOS and pad are <|im_end|> (id 2), where a response stops."""
    _, tokenizer = policy
    [text, _] = prompts(tokenizer)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") == 1
    assert ids[-4:] == [1, *tokenizer("assistant\n", add_special_tokens=False)["input_ids"]]
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 2
    assert tokenizer(text)["input_ids"] == ids  # add_special_tokens adds nothing either


def test_the_fewshot_prompt_closes_its_example_turn_with_eos_and_fits_the_experiments_limit(policy):
    """fewshot-add-2digit (experiments/smollm2-135m.yaml): system, user, assistant (the worked example), user.
    Every turn ends with <|im_end|>, so EOS (id 2) sits inside the prompt after each turn, and the prompt
    ends with the generation prompt; the rollout engines stop only at an EOS they generate."""
    from dapo_cli.data.synthetic import generate_rows

    _, tokenizer = policy
    row = generate_rows("fewshot-add-2digit", 1, seed=0, split="val")[0]
    text = format_prompt(tokenizer, row["prompt"])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    im_start, im_end = 1, 2
    assert ids.count(im_start) == 5 and ids.count(im_end) == 4  # 4 closed turns, then "<|im_start|>assistant\n"
    roles = [tokenizer.decode(ids[i + 1 : i + 3]).split("\n")[0] for i, t in enumerate(ids) if t == im_start]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    example = tokenizer.decode(ids[ids.index(im_end, ids.index(im_end) + 1) + 1 :])
    assert "3 + 4 = 7\nAnswer: 7<|im_end|>" in example
    assert len(ids) <= 256  # data.max_prompt_length of the experiment: no training prompt is dropped


def test_greedy_tokens_are_the_trainers_argmax_and_end_at_im_end(engine, policy):
    model, tokenizer = policy
    out = engine.generate(prompts(tokenizer), 1, SamplingParams(temperature=0.0, max_tokens=24, seed=0))
    assert "7" in out.texts[0]  # "3 + 4 = 7": the pretrained model, not noise
    for i in range(len(QUESTIONS)):
        length = int(out.lengths[i])
        prompt = out.prompt_ids[i][out.prompt_mask[i]]
        x = torch.cat([prompt, out.response_ids[i, :length]]).unsqueeze(0)
        with torch.no_grad():
            argmax = model(x).logits[0, len(prompt) - 1 : -1].argmax(-1)
        assert out.response_ids[i, :length].tolist() == argmax.tolist()
        if not out.truncated[i]:
            assert out.response_ids[i, length - 1] == tokenizer.eos_token_id


def test_sampled_log_probs_are_the_trainers(engine, policy):
    model, tokenizer = policy
    out = engine.generate(prompts(tokenizer), 2, SamplingParams(temperature=1.0, max_tokens=24, seed=0, logprobs=True))
    batch = RolloutBatch.from_rollouts(
        out, group_ids=out.prompt_index, ground_truths=[""] * 4, prompts=[""] * 4, pad_id=tokenizer.pad_token_id,
    )
    with torch.no_grad():
        trainer, _ = policy_forward(model, batch, temperature=1.0, with_entropy=False, device=torch.device("cpu"))
    assert float(((trainer - out.logprobs).abs() * out.response_mask).max()) < LOGPROB_TOL


def test_the_prefix_cache_and_refill_give_the_plain_loops_samples_on_fewshot_prompts(policy):
    """A few few-shot prompts (~182 tokens, the first ~170 shared): the fast engine's defaults (prefix cache,
    refilled batch of 3 rows) against its chunked loop without either, token for token; log-probs the trainer's."""
    from dapo_cli.data.synthetic import generate_rows
    from dapo_cli.rollout.fast import FastRolloutEngine

    model, tokenizer = policy
    texts = [format_prompt(tokenizer, row["prompt"]) for row in generate_rows("fewshot-add-2digit", 3, seed=0, split="val")]
    params = SamplingParams(temperature=1.0, top_p=0.7, max_tokens=16, seed=0, logprobs=True)
    want = FastRolloutEngine(model, tokenizer, prefix_cache=False, refill=False).generate(texts, 2, params)
    engine = FastRolloutEngine(model, tokenizer, batch_size=3)
    got = engine.generate(texts, 2, params)
    assert got.texts == want.texts and torch.equal(got.response_ids, want.response_ids)
    assert float(((got.logprobs - want.logprobs).abs() * got.response_mask).max()) < LOGPROB_TOL
    stats = engine.prefill_stats
    assert stats["computed_tokens"] < 0.5 * stats["prompt_tokens"]  # the shared ~170 tokens run once, not 3 times
