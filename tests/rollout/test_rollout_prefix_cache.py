"""The fast engine's prefix cache (``rollout/prefix_cache.py``) and refilled batch (``rollout/continuous.py``):
every sample the same token for token as the chunked loop without them (``prefix_cache=False, refill=False``),
at any batch size and order of prompts; log-probs the trainer's; the cache shared by token ids, bounded, and
forgotten when the weights change."""

from __future__ import annotations

import copy

import pytest
import torch

from dapo_cli.algo.importance import SAMPLER_LOGPROB_TOL
from dapo_cli.batch import RolloutBatch
from dapo_cli.engine.torch import policy_forward
from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.models.tiny import build_tiny_model_for
from dapo_cli.models.tokenizer import build_char_tokenizer
from dapo_cli.rollout.base import SamplingParams
from dapo_cli.rollout.fast import FastRolloutEngine


EOS = 1
SHARED = "<|im_start|>system\nYou add numbers.<|im_end|>\n<|im_start|>user\nWhat is "
PROMPTS = [SHARED + "12+7?\n", SHARED + "3+4?\n", "Q", SHARED + "12+70?\n", "x<|im_start|>", "x<|im_end|>"]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tok):
    cfg = TinyModelConfig(architecture=request.param, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return build_tiny_model_for(cfg, tok)


def plain(model, tok, **kw):
    return FastRolloutEngine(model, tok, prefix_cache=False, refill=False, **kw)


def assert_same(a, b, tol: float = 1e-5) -> None:
    assert a.texts == b.texts
    for field in ("response_ids", "lengths", "truncated", "prompt_ids", "prompt_index"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    if a.logprobs is not None:
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=tol)


def eos_boost(model):
    """Rows end at many different steps (finished rows leave or are refilled mid-call)."""
    def on_head(module, args, output):
        output[..., EOS] += 2.0
        return output

    return model.lm_head.register_forward_hook(on_head)


PARAMS = SamplingParams(temperature=1.0, max_tokens=20, seed=5, logprobs=True)


@pytest.mark.slow
@pytest.mark.parametrize("prompts", [
    PROMPTS,
    ["ab\n", "cd\n", "ef\n"],  # share nothing
    [SHARED + "1+1?\n"] * 3,  # share everything (duplicates: distinct streams per copy)
    [SHARED + "1+1?\n", SHARED + "1+1?\n", SHARED],  # a prompt that is a prefix of another
], ids=["mixed", "nothing", "everything", "prefix-of-another"])
def test_samples_equal_the_plain_loop_at_any_batch_size_and_order(model, tok, prompts):
    want = plain(model, tok).generate(prompts, 3, PARAMS)
    for kw in ({}, {"batch_size": 1}, {"batch_size": 4}, {"refill": False, "batch_size": 4}, {"prefix_cache": False},
               {"compact_at": 0.0, "batch_size": 5}):
        engine = FastRolloutEngine(model, tok, **kw)
        assert_same(engine.generate(prompts, 3, PARAMS), want)
        assert_same(engine.generate(prompts, 3, PARAMS), want)  # the second call from the cache
    back = FastRolloutEngine(model, tok, batch_size=4).generate(prompts[::-1], 3, PARAMS)
    for i, p in enumerate(prompts[::-1]):  # a row's samples follow (prompt text, copy, sample), not its place
        j = len(prompts) - 1 - i
        if prompts.count(p) == 1:
            assert back.texts[3 * i : 3 * i + 3] == want.texts[3 * j : 3 * j + 3]


def test_greedy_and_truncated_sampling_equal_the_plain_loop(tok):
    model = build_tiny_model_for(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok)
    for params in (SamplingParams(temperature=0.0, max_tokens=12, logprobs=True),
                   SamplingParams(temperature=0.7, top_k=5, top_p=0.8, max_tokens=12, seed=2, logprobs=True)):
        assert_same(FastRolloutEngine(model, tok, batch_size=4).generate(PROMPTS, 2, params), plain(model, tok).generate(PROMPTS, 2, params))


@pytest.mark.slow
def test_refilled_rows_equal_the_plain_loop_and_keep_the_batch_full(model, tok, monkeypatch):
    from dapo_cli.rollout.continuous import SlotDecoder

    steps = []  # (running rows, slots, rows still waiting) at each decode step
    forward = SlotDecoder._forward

    def recording(self):
        steps.append((int(self.alive.sum()), len(self.alive), self.total - self.next_row))
        forward(self)

    monkeypatch.setattr(SlotDecoder, "_forward", recording)
    handle = eos_boost(model)
    try:
        want = plain(model, tok, batch_size=4).generate(PROMPTS, 4, PARAMS)
        got = FastRolloutEngine(model, tok, batch_size=4).generate(PROMPTS, 4, PARAMS)
        refilled = list(steps)
        steps.clear()
        chunked = FastRolloutEngine(model, tok, batch_size=4, refill=False).generate(PROMPTS, 4, PARAMS)
    finally:
        handle.remove()
    assert_same(got, want)
    assert_same(chunked, want)
    lengths = want.lengths.tolist()
    assert len(set(lengths)) > 4 and min(lengths) < 5, lengths
    waiting = [(running, slots) for running, slots, left in refilled if left > 0]
    assert waiting and all(running == slots == 4 for running, slots in waiting)  # full while rows wait
    assert any(running < 4 for running, _, left in steps if left > 0)  # without refill it is not
    assert len(refilled) < len(steps)  # so fewer decode steps than batches decoded to their longest row


def test_log_probs_are_the_trainers(tok):
    model = build_tiny_model_for(TinyModelConfig(architecture="qwen2", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok)
    engine = FastRolloutEngine(model, tok, batch_size=5)
    for _ in range(2):  # cold, then from the cache
        out = engine.generate(PROMPTS, 2, SamplingParams(temperature=0.6, max_tokens=16, seed=1, logprobs=True))
        batch = RolloutBatch.from_rollouts(out, group_ids=out.prompt_index, ground_truths=[""] * len(out.texts),
                                           prompts=[""] * len(out.texts), pad_id=tok.pad_token_id)
        with torch.no_grad():
            trainer, _ = policy_forward(model, batch, temperature=0.6, with_entropy=False, device=torch.device("cpu"))
        assert float(((trainer - out.logprobs).abs() * out.response_mask).max()) < SAMPLER_LOGPROB_TOL
        assert (out.logprobs[~out.response_mask] == 0).all()


def test_the_shared_prefix_is_cut_on_token_ids_inside_a_chat_marker_and_computed_once(tok):
    model = build_tiny_model_for(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok)
    engine = FastRolloutEngine(model, tok)
    engine.generate(["x<|im_start|>", "x<|im_end|>"], 1, SamplingParams(max_tokens=2, seed=0))
    [node] = engine.cache.root.children.values()
    assert tok.decode(list(node.tokens)) == "x<|im_"  # the tokens both share: the marker cut in two
    assert sorted(tok.decode(list(c.tokens)) for c in node.children.values()) == ["end|>", "start|>"]
    # 6 shared + 7 + 5 tokens run instead of 13 + 11; a second call runs none (each end keeps its logits)
    assert engine.prefill_stats == {"prompt_tokens": 24, "computed_tokens": 18}
    engine.generate(["x<|im_end|>"], 1, SamplingParams(max_tokens=2, seed=0))
    assert engine.prefill_stats == {"prompt_tokens": 35, "computed_tokens": 18}
    # a prompt that ends inside a cached segment recomputes its last token only, for its logits
    engine.generate(["x<|im_st"], 1, SamplingParams(max_tokens=2, seed=0))
    assert engine.prefill_stats["computed_tokens"] == 19


def test_the_cache_stays_within_its_budget(tok):
    model = build_tiny_model_for(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok)
    # one token's keys/values: 2 layers x 2 (k, v) x 2 heads x 16 x 4 bytes = 512 bytes; logits 4 bytes x vocab
    engine = FastRolloutEngine(model, tok, cache_mib=8192 / 2**20)
    params = SamplingParams(max_tokens=4, seed=0)
    want = plain(model, tok).generate(PROMPTS, 2, params)
    for _ in range(2):
        assert_same(engine.generate(PROMPTS, 2, params), want)
        assert 0 < engine.cache.bytes <= 8192
        assert engine.cache.bytes == sum(n.nbytes() for n in engine.cache._nodes())


def test_a_weight_change_empties_the_cache(tok):
    model = build_tiny_model_for(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok)
    engine = FastRolloutEngine(model, tok)
    params = SamplingParams(max_tokens=10, seed=3)
    first = engine.generate(PROMPTS, 2, params)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5)

    class Source:
        def export_weights(self):
            yield from other.state_dict().items()

    # through .data: no version counter moves; sync_weights (what the trainer calls after every update) clears it
    for p, q in zip(model.parameters(), other.parameters()):
        p.data = q.data.clone()
    engine.sync_weights(Source())
    assert engine.cache.bytes == 0
    changed = engine.generate(PROMPTS, 2, params)
    assert_same(changed, FastRolloutEngine(other, tok).generate(PROMPTS, 2, params))
    assert changed.texts != first.texts
    # an in-place update (an optimizer step) without sync_weights: the parameters' version counters clear it too
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    ref = copy.deepcopy(model)
    assert_same(engine.generate(PROMPTS, 2, params), FastRolloutEngine(ref, tok).generate(PROMPTS, 2, params))


def test_a_prefix_every_prompt_shares_is_attended_once_per_step_with_the_same_samples(tok, monkeypatch):
    from dapo_cli.rollout.continuous import SlotDecoder

    model = build_tiny_model_for(TinyModelConfig(architecture="qwen2", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok)
    seen = []
    forward = SlotDecoder._forward

    def recording(self):
        seen.append((self.shared_len, None if self.shared is None else tuple(self.shared.shape)))
        forward(self)

    monkeypatch.setattr(SlotDecoder, "_forward", recording)
    prompts = [SHARED + "12+7?\n", SHARED + "3+4?\n", SHARED + "1+1?\n"]
    got = FastRolloutEngine(model, tok, batch_size=4).generate(prompts, 3, PARAMS)
    # every prompt starts with SHARED (one token a character), then "1" twice: the common prefix is SHARED
    assert set(seen) == {(len(SHARED), (2, 2, 2, len(SHARED), 16))}  # [layers, k/v, kv_heads, P0, head_dim]
    assert_same(got, plain(model, tok).generate(prompts, 3, PARAMS))


def test_after_forget_prefixes_a_call_is_bit_identical_to_a_fresh_engines(tok):
    # What the session relies on after each validation: the rollouts that follow read nothing the validation
    # cached, so they equal (atol 0) what an engine that never validated samples, e.g. the worker process's.
    model = build_tiny_model_for(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok)
    engine = FastRolloutEngine(model, tok)
    params = SamplingParams(max_tokens=12, seed=9, logprobs=True)
    engine.generate([SHARED + "5+5?\n", SHARED + "1+9?\n"], 2, params)  # "validation": fills the shared prefix
    assert engine.cache.bytes > 0
    engine.forget_prefixes()
    assert engine.cache.bytes == 0
    after = engine.generate(PROMPTS, 2, params)
    assert_same(after, FastRolloutEngine(model, tok).generate(PROMPTS, 2, params), tol=0.0)
