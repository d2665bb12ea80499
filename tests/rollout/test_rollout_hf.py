"""HFRolloutEngine on a tiny random model: shapes, masks, EOS/truncation, seeding, chunking."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.models.tiny import build_tiny_model_for
from dapo_cli.models.tokenizer import build_char_tokenizer, char_vocab
from dapo_cli.rollout.base import SamplingParams
from dapo_cli.rollout.hf import HFRolloutEngine, response_mask

V = char_vocab()
EOS, PAD = 1, 0


@pytest.fixture()
def tok():
    return build_char_tokenizer()


@pytest.fixture()
def model(tok):
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return build_tiny_model_for(cfg, tok)


def _force(model, rule: Callable[[int], torch.Tensor]):
    """Replace the last-position logits by ``rule(last input token id)`` (a [V] tensor)."""

    def hook(module, args, kwargs, output):
        last = kwargs["input_ids"][:, -1].tolist()
        output.logits[:, -1, :] = torch.stack([rule(t) for t in last])
        return output

    return model.register_forward_hook(hook, with_kwargs=True)


def _one_hot_logits(token: int) -> torch.Tensor:
    logits = torch.full((len(V),), -1e9)
    logits[token] = 0.0
    return logits


def test_response_mask_covers_up_to_first_eos_even_when_pad_is_eos():
    ids = torch.tensor(
        [
            [5, 6, 1, 1, 1],  # EOS at t=2, then pad (= EOS) -> keep t<=2
            [5, 6, 7, 8, 9],  # no EOS: all kept (truncated)
            [1, 1, 1, 1, 1],  # immediate EOS -> only t=0
            [5, 9, 1, 0, 0],  # a second EOS id (9) ends the row at t=1
        ]
    )
    expected = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool
    )
    assert torch.equal(response_mask(ids, [1, 9]), expected)


def test_shapes_masks_eos_and_truncation(model, tok):
    # after "\n" emit "a", after "a" emit EOS; after "x" or "b" emit "b" forever
    def rule(last: int) -> torch.Tensor:
        if last == V["\n"]:
            return _one_hot_logits(V["a"])
        if last == V["a"]:
            return _one_hot_logits(EOS)
        return _one_hot_logits(V["b"])

    handle = _force(model, rule)
    out = HFRolloutEngine(model, tok).generate(["What?\n", "Qx"], 3, SamplingParams(max_tokens=5, seed=0))
    handle.remove()
    a, b = V["a"], V["b"]
    assert out.prompt_ids.shape == (6, 6) and out.response_ids.shape == (6, 5)
    assert torch.equal(out.prompt_index, torch.tensor([0, 0, 0, 1, 1, 1]))
    short = [PAD] * 4 + [V["Q"], V["x"]]  # left-padded to the longer prompt, no special tokens added
    assert out.prompt_ids[3].tolist() == short and out.prompt_mask[3].tolist() == [False] * 4 + [True] * 2
    assert out.prompt_ids[0].tolist() == [V[c] for c in "What?\n"] and bool(out.prompt_mask[0].all())
    assert out.response_ids[0].tolist() == [a, EOS, PAD, PAD, PAD]
    assert out.response_mask[0].tolist() == [True, True, False, False, False]
    assert out.response_ids[5].tolist() == [b] * 5 and bool(out.response_mask[5].all())
    assert out.lengths.tolist() == [2, 2, 2, 5, 5, 5]
    assert out.truncated.tolist() == [False] * 3 + [True] * 3
    assert out.texts == ["a"] * 3 + ["bbbbb"] * 3  # EOS not in the text
    assert torch.equal(out.lengths, out.response_mask.sum(-1))


def test_pad_equal_to_eos_and_immediate_eos(model, tok):
    tok.pad_token = tok.eos_token  # what load_policy does for tokenizers without a pad token
    handle = _force(model, lambda last: _one_hot_logits(EOS))
    out = HFRolloutEngine(model, tok).generate(["ab\n", "c\n"], 2, SamplingParams(max_tokens=4, seed=1))
    handle.remove()
    assert out.response_ids.tolist() == [[EOS]] * 4  # every row stops at once: T = 1
    assert out.lengths.tolist() == [1] * 4 and not out.truncated.any() and out.texts == [""] * 4
    assert out.prompt_ids[2].tolist() == [EOS, V["c"], V["\n"]]  # left pad is EOS here


def test_max_tokens_one_truncates_unless_eos(model, tok):
    out = HFRolloutEngine(model, tok).generate(["q\n"], 8, SamplingParams(max_tokens=1, seed=3))
    assert out.response_ids.shape == (8, 1) and out.lengths.tolist() == [1] * 8
    assert torch.equal(out.truncated, out.response_ids[:, 0] != EOS)


def test_same_seed_same_samples_and_global_rng_untouched(model, tok):
    engine = HFRolloutEngine(model, tok)
    params = SamplingParams(max_tokens=12, seed=123)
    state = torch.get_rng_state()
    first = engine.generate(["What is 1+2?\n"], 4, params)
    assert torch.equal(torch.get_rng_state(), state)
    again = engine.generate(["What is 1+2?\n"], 4, params)
    other = engine.generate(["What is 1+2?\n"], 4, SamplingParams(max_tokens=12, seed=124))
    assert torch.equal(first.response_ids, again.response_ids) and first.texts == again.texts
    assert not torch.equal(first.response_ids, other.response_ids)
    assert len(set(first.texts)) > 1  # samples differ within a group


def test_greedy_chunking_gives_the_same_result_as_one_batch(model, tok):
    prompts = ["What is 1+2?\n", "7\n", "What is 99+1?\n"]
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    whole = HFRolloutEngine(model, tok).generate(prompts, 2, greedy)
    chunked = HFRolloutEngine(model, tok, batch_size=4).generate(prompts, 2, greedy)
    assert whole.texts == chunked.texts
    for field in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "lengths", "truncated"):
        assert torch.equal(getattr(whole, field), getattr(chunked, field)), field
    assert whole.texts[0] == whole.texts[1]  # greedy: the n copies agree


@pytest.mark.slow
def test_sampling_follows_the_model_distribution_and_the_warpers(model, tok):
    # last-position probabilities fixed at p(a,b,c,d) = (0.5, 0.3, 0.15, 0.05); one token each
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    ids = [V[c] for c in "abcd"]
    logits = torch.full((len(V),), -1e9)
    logits[ids] = p.log()
    handle = _force(model, lambda last: logits.clone())
    engine = HFRolloutEngine(model, tok)

    def freqs(**kw) -> torch.Tensor:
        out = engine.generate(["q\n"], 4000, SamplingParams(max_tokens=1, seed=0, **kw))
        return torch.tensor([(out.response_ids[:, 0] == i).float().mean().item() for i in ids])

    # plain sampling (top_k=0, top_p=1, T=1) must not fall back to transformers' top_k=50 etc.
    # 4000 draws: sd of a frequency <= 0.008, tolerance 0.03 is > 3.5 sd
    assert torch.allclose(freqs(), p, atol=0.03)
    # T=0.5: p^2 / sum p^2 = (0.25, 0.09, 0.0225, 0.0025) / 0.365
    assert torch.allclose(freqs(temperature=0.5), torch.tensor([0.6849, 0.2466, 0.0616, 0.0068]), atol=0.03)
    # top_p=0.7 keeps the smallest prefix with mass >= 0.7: {a, b} -> (0.625, 0.375)
    assert torch.allclose(freqs(top_p=0.7), torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.03)
    # top_k=1 is greedy
    assert torch.equal(freqs(top_k=1), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    handle.remove()


def test_checkpoint_generation_defaults_do_not_change_sampling(model, tok):
    params = SamplingParams(max_tokens=10, seed=5)
    clean = HFRolloutEngine(model, tok).generate(["What is 3+4?\n"], 4, params)
    g = model.generation_config
    g.top_k, g.top_p, g.temperature, g.repetition_penalty, g.do_sample = 1, 0.1, 0.01, 5.0, False
    g.no_repeat_ngram_size, g.min_new_tokens = 1, 8
    dirty = HFRolloutEngine(model, tok).generate(["What is 3+4?\n"], 4, params)
    assert torch.equal(clean.response_ids, dirty.response_ids)


def test_train_or_eval_mode_is_restored_and_sync_is_a_noop(model, tok):
    engine = HFRolloutEngine(model, tok)
    for training in (True, False):
        model.train(training)
        engine.generate(["q\n"], 1, SamplingParams(max_tokens=2, seed=0))
        assert model.training is training
    assert engine.sync_weights(object()) is None  # shares the trainer's module: nothing to copy


def test_a_private_copy_syncs_every_tensor_from_export_weights(model, tok):
    import copy

    copy_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in copy_model.parameters():
            p.add_(1.0)

    class Source:
        def export_weights(self):
            yield from model.state_dict().items()

    engine = HFRolloutEngine(copy_model, tok, shares_weights=False)
    engine.sync_weights(Source())
    for (name, a), b in zip(model.state_dict().items(), copy_model.state_dict().values()):
        assert torch.equal(a, b), name

    class Partial:
        def export_weights(self):
            yield from list(model.state_dict().items())[:1]

    with pytest.raises(KeyError, match="no value"):
        engine.sync_weights(Partial())


def test_bad_arguments_raise(model, tok):
    with pytest.raises(ValueError, match="batch_size"):
        HFRolloutEngine(model, tok, batch_size=0)
    no_pad = build_char_tokenizer()
    no_pad.pad_token = None
    with pytest.raises(ValueError, match="no pad token"):
        HFRolloutEngine(model, no_pad)
    engine = HFRolloutEngine(model, tok)
    with pytest.raises(ValueError, match="n must be"):
        engine.generate(["q"], 0, SamplingParams())
    with pytest.raises(ValueError, match="at least one prompt"):
        engine.generate([], 1, SamplingParams())
