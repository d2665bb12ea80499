"""FastRolloutEngine: its random streams, its draws against the model's exact distribution, EOS and
truncation, equality with the HF engine (greedy, forced outputs, log-probs), and the seeding
invariances (chunk size, prompts per call, position, dropped rows, decode path).

The protocol tests shared with every engine are in ``test_rollout_conformance.py``.
Statistical tests use fixed seeds (so each run is deterministic) and thresholds whose false-failure
probability under a correct sampler is below 1e-6 per test, so a reseeding cannot make them flaky.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
from scipy.stats import chi2
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from dapo_cli.batch import RolloutBatch
from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.engine.torch import policy_forward
from dapo_cli.models.tiny import build_tiny_model_for
from dapo_cli.models.tokenizer import build_char_tokenizer, char_vocab
from dapo_cli.rollout.base import SamplingParams
from dapo_cli.rollout.fast import (
    FastRolloutEngine,
    _NativeDecoder,
    inverse_cdf_draw,
    row_keys,
    splitmix64,
    stream_uniforms,
    truncated_probs,
)
from dapo_cli.rollout.hf import HFRolloutEngine

V = char_vocab()
EOS, PAD = 1, 0
PROMPTS = ["What is 12+7?\n", "Q", "Add 3 and 4, then say the answer.\n", "7\n"]
FALSE_FAILURE = 1e-6


@pytest.fixture()
def tok():
    return build_char_tokenizer()


def tiny(tok, architecture: str = "llama", **kw):
    cfg = TinyModelConfig(architecture=architecture, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, **kw)
    return build_tiny_model_for(cfg, tok)


@pytest.fixture(params=["llama", "qwen2"])
def model(request, tok):
    return tiny(tok, request.param)


def sharpened(model, factor: float):
    """A copy whose logits are ``factor`` times larger (final norm scaled): peaked, informative distributions."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        out.model.norm.weight.mul_(factor)
    return out


def force(model, rule: Callable[[int], torch.Tensor]):
    """Replace every next-token logit row by ``rule(last input token)`` for both engines: the embedding
    hook records each forward's input ids, the lm_head hook rewrites its output's last position."""
    last: list[list[int]] = []

    def on_embed(module, args, output):
        last[:] = [args[0][:, -1].tolist()]

    def on_head(module, args, output):
        rows = output.view(output.shape[0], -1, output.shape[-1])
        rows[:, -1, :] = torch.stack([rule(t) for t in last[0]])
        return output

    return [model.model.embed_tokens.register_forward_hook(on_embed), model.lm_head.register_forward_hook(on_head)]


def one_hot(token: int) -> torch.Tensor:
    logits = torch.full((len(V),), -1e9)
    logits[token] = 0.0
    return logits


def batch_of(out, pad_id: int) -> RolloutBatch:
    return RolloutBatch.from_rollouts(
        out, group_ids=out.prompt_index, ground_truths=[""] * len(out.texts), prompts=[""] * len(out.texts), pad_id=pad_id,
    )


def trainer_log_probs(model, out, pad_id: int, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logp, _ = policy_forward(model, batch_of(out, pad_id), temperature=temperature, with_entropy=False, device=torch.device("cpu"))
    return logp


def assert_same_rollouts(a, b) -> None:
    for field in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "lengths", "truncated", "prompt_index"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert a.texts == b.texts


# ---------------------------------------------------------------- the random streams


def splitmix64_reference(state: int) -> int:
    """SplitMix64's next() in Python integers (Steele, Lea & Flood 2014; Vigna's splitmix64.c)."""
    z = (state + 0x9E3779B97F4A7C15) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return z ^ (z >> 31)


def test_the_stream_is_splitmix64_bit_for_bit():
    assert splitmix64_reference(0) == 0xE220A8397B1DCDAF  # the published first output from state 0
    states = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 0x0123456789ABCDEF, 987654321]
    signed = [s - 2**64 if s >= 2**63 else s for s in states]
    got = splitmix64(torch.tensor(signed) + torch.tensor(-0x61C8864680B583EB))  # + gamma, wrapped to int64
    want = [splitmix64_reference(s) for s in states]
    assert [int(g) & (2**64 - 1) for g in got] == want
    # uniform t of a key is the top 53 bits of output t+1 of SplitMix64 started at that key
    u = stream_uniforms(torch.tensor(signed), 0, 3)
    for row, s in enumerate(states):
        state = s
        for t in range(3):
            out = splitmix64_reference(state)
            state = (state + 0x9E3779B97F4A7C15) & (2**64 - 1)
            assert float(u[row, t]) == (out >> 11) * 2.0**-53


def test_uniforms_are_uniform_and_rows_and_steps_are_distinct_streams():
    keys = row_keys(0, ["a", "b"], 500)  # 1000 rows
    u = stream_uniforms(keys, 0, 200).flatten()  # 200,000 values
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    counts = torch.histc(u.float(), bins=20, min=0.0, max=1.0)
    expected = len(u) / 20
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < chi2.isf(FALSE_FAILURE, df=19)
    assert len(set(keys.tolist())) == len(keys)
    # neighbouring rows and steps are uncorrelated (|r| of 200,000 pairs: sd 0.0022; 5 sd bound)
    grid = stream_uniforms(keys, 0, 200)
    rows = torch.corrcoef(torch.stack([grid[:-1].flatten(), grid[1:].flatten()]))[0, 1]
    steps = torch.corrcoef(torch.stack([grid[:, :-1].flatten(), grid[:, 1:].flatten()]))[0, 1]
    assert abs(float(rows)) < 5 / math.sqrt(grid[:-1].numel()) and abs(float(steps)) < 5 / math.sqrt(grid[:, :-1].numel())


def test_row_keys_follow_seed_text_copy_and_sample():
    a = row_keys(7, ["x", "y", "x"], 2)
    assert a[0:2].tolist() == row_keys(7, ["x"], 2).tolist()  # not the call's other prompts
    assert a[2:4].tolist() == row_keys(7, ["y"], 2).tolist()  # not the prompt's position
    assert a[4:6].tolist() != a[0:2].tolist()  # a repeated prompt is a second copy, with its own streams
    assert row_keys(8, ["x"], 2).tolist() != a[0:2].tolist()
    assert row_keys(7, ["x"], 3)[:2].tolist() == a[0:2].tolist()  # sample j's stream does not depend on n


def test_inverse_cdf_never_picks_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]]).repeat(3, 1)
    u = torch.tensor([0.0, 0.0, 0.5 - 1e-16, 0.999, 1.0 - 2**-53, 1.0 - 2**-53], dtype=torch.float64)
    got = inverse_cdf_draw(probs, u).tolist()
    assert got == [1, 2, 1, 2, 3, 2]


# ---------------------------------------------------------------- sampling draws from the model's distribution


def exact_first_two(model, prompt_ids: list[int], temperature: float, top_k: int, top_p: float):
    """Exact P(token 1) and P(token 2) (marginal over token 1) of ancestral sampling with transformers'
    own warpers (temperature, top-k, top-p, in generate's order), from teacher-forced forwards."""
    warpers = [TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))

    def dist(logits: torch.Tensor) -> torch.Tensor:
        scores = logits.double()
        for w in warpers:
            scores = w(None, scores)
        return torch.softmax(scores, dim=-1)

    with torch.no_grad():
        first = dist(model(torch.tensor([prompt_ids])).logits[:, -1])[0]  # [V]
        seqs = torch.tensor([prompt_ids + [a] for a in range(len(first))])
        second_given = dist(model(seqs).logits[:, -1])  # [V, V]: row a = P(token 2 | token 1 = a)
    return first, first @ second_given, first[:, None] * second_given


def chi_square(counts: torch.Tensor, probs: torch.Tensor, draws: int) -> tuple[float, int]:
    """Pearson's statistic over cells with expected count >= 5 plus one pooled cell of the rest."""
    expected = probs.double().flatten() * draws
    counts = counts.double().flatten()
    big = expected >= 5
    e = torch.cat([expected[big], expected[~big].sum().view(1)])
    c = torch.cat([counts[big], counts[~big].sum().view(1)])
    keep = e > 0
    assert float(c[~keep].sum()) == 0, "a draw landed on a token of probability 0"
    e, c = e[keep], c[keep]
    return float(((c - e) ** 2 / e).sum()), int(keep.sum()) - 1


@pytest.mark.parametrize("mode", [
    {"temperature": 1.0},
    {"temperature": 0.7},
    {"temperature": 1.0, "top_k": 5},
    {"temperature": 1.0, "top_p": 0.8},
])
@pytest.mark.slow
def test_the_first_two_tokens_follow_the_models_exact_distribution(tok, mode):
    model = sharpened(tiny(tok, "qwen2"), 6.0).eval()
    prompt = "What is 1+2?\n"
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    draws = 40_000
    out = FastRolloutEngine(model, tok).generate([prompt], draws, SamplingParams(max_tokens=2, seed=11, **mode))
    p1, _, joint = exact_first_two(model, ids, mode["temperature"], mode.get("top_k", 0), mode.get("top_p", 1.0))
    first = out.response_ids[:, 0]
    # rows that ended at token 1 have no token 2: compare token 2 on the rows that continued
    assert (out.lengths == 1).sum() == (first == EOS).sum()
    cont = out.lengths == 2
    c1 = torch.bincount(first, minlength=len(V))
    assert 0.05 < float(p1.max()) < 0.95  # the sharpened model's distribution is informative, not one-hot
    for counts, probs, n in [
        (c1, p1, draws),
        (torch.bincount(out.response_ids[cont, 1], minlength=len(V)), _continued(joint, EOS).sum(0), int(cont.sum())),
        (torch.bincount(first[cont] * len(V) + out.response_ids[cont, 1], minlength=len(V) ** 2), _continued(joint, EOS), int(cont.sum())),
    ]:
        stat, df = chi_square(counts, probs / probs.sum(), n)
        assert df >= 3
        assert stat < chi2.isf(FALSE_FAILURE, df), (stat, df)
    tv = 0.5 * float((c1.double() / draws - p1).abs().sum())
    assert tv < 0.03  # total variation of the first token (sampling noise alone: ~0.005)
    if mode.get("top_k"):
        assert len(set(first.tolist())) <= 5
    if mode.get("top_p", 1.0) < 1.0:
        assert torch.all(p1[first] > 0)


def _continued(joint: torch.Tensor, eos: int) -> torch.Tensor:
    """The joint P(token 1, token 2) restricted to first tokens that are not EOS (unnormalised)."""
    out = joint.clone()
    out[eos] = 0.0
    return out


def test_truncation_matches_transformers_warpers_on_random_logits():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=gen, dtype=torch.float64) * 3
    logits[0, :5] = 2.0  # ties at the top-k boundary are kept, as in transformers
    for k, p in [(5, 1.0), (0, 0.8), (10, 0.5), (0, 0.3), (3, 0.99)]:
        scores = logits.clone()
        if k:
            scores = TopKLogitsWarper(k)(None, scores)
        if p < 1.0:
            scores = TopPLogitsWarper(p)(None, scores)
        want = torch.softmax(scores, -1)
        got = truncated_probs(logits, k, p)
        got = got / got.sum(-1, keepdim=True)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- EOS, truncation, equality with the HF engine


def test_eos_and_truncation_flags_match_the_hf_engine_on_forced_outputs(tok):
    model = tiny(tok)
    # after "\n" emit "a", after "a" emit EOS; after "x" or "b" emit "b" forever
    def rule(last: int) -> torch.Tensor:
        if last == V["\n"]:
            return one_hot(V["a"])
        if last == V["a"]:
            return one_hot(EOS)
        return one_hot(V["b"])

    handles = force(model, rule)
    params = SamplingParams(max_tokens=5, seed=0, logprobs=True)
    fast = FastRolloutEngine(model, tok).generate(["What?\n", "Qx"], 3, params)
    hf = HFRolloutEngine(model, tok).generate(["What?\n", "Qx"], 3, params)
    for h in handles:
        h.remove()
    assert_same_rollouts(fast, hf)
    assert fast.response_ids[0].tolist() == [V["a"], EOS, PAD, PAD, PAD]
    assert fast.lengths.tolist() == [2, 2, 2, 5, 5, 5]
    assert fast.truncated.tolist() == [False] * 3 + [True] * 3
    assert fast.texts == ["a"] * 3 + ["bbbbb"] * 3
    torch.testing.assert_close(fast.logprobs, hf.logprobs, rtol=0, atol=1e-6)


def test_pad_equal_to_eos_and_immediate_eos(tok):
    model = tiny(tok)
    tok.pad_token = tok.eos_token  # what load_policy does for tokenizers without a pad token
    handles = force(model, lambda last: one_hot(EOS))
    out = FastRolloutEngine(model, tok).generate(["ab\n", "c\n"], 2, SamplingParams(max_tokens=4, seed=1))
    for h in handles:
        h.remove()
    assert out.response_ids.tolist() == [[EOS]] * 4
    assert out.lengths.tolist() == [1] * 4 and not out.truncated.any() and out.texts == [""] * 4
    assert out.prompt_ids[2].tolist() == [EOS, V["c"], V["\n"]]


def test_max_tokens_one_truncates_unless_eos(tok):
    out = FastRolloutEngine(tiny(tok), tok).generate(["q\n"], 64, SamplingParams(max_tokens=1, seed=3))
    assert out.response_ids.shape == (64, 1) and out.lengths.tolist() == [1] * 64
    assert torch.equal(out.truncated, out.response_ids[:, 0] != EOS)


@pytest.mark.slow
def test_greedy_is_the_hf_engines_greedy_token_for_token(model, tok):
    prompts = [*PROMPTS, "What is 99+1?\n"]
    params = SamplingParams(temperature=0.0, max_tokens=40, logprobs=True)
    hf = HFRolloutEngine(model, tok).generate(prompts, 2, params)
    for engine in (FastRolloutEngine(model, tok), FastRolloutEngine(model, tok, batch_size=3),
                   FastRolloutEngine(model, tok, native=False), FastRolloutEngine(model, tok, compact_at=0.0)):
        out = engine.generate(prompts, 2, params)
        assert_same_rollouts(out, hf)
        torch.testing.assert_close(out.logprobs, hf.logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.slow
def test_log_probs_match_the_trainer_beyond_the_first_buffer_and_after_rows_drop(model, tok, temperature):
    # EOS boosted so rows end at different steps (rows are dropped mid-call), max_tokens 100 > the
    # first key/value buffer (64 columns past the prompt), so the buffer grows once
    def on_head(module, args, output):
        output[..., EOS] += 1.0
        return output

    handle = model.lm_head.register_forward_hook(on_head)
    out = FastRolloutEngine(model, tok, compact_at=0.0).generate(
        PROMPTS[:2], 12, SamplingParams(temperature=temperature, max_tokens=100, seed=4, logprobs=True)
    )
    trainer = trainer_log_probs(model, out, tok.pad_token_id, temperature)
    handle.remove()
    lengths = out.lengths.tolist()
    assert min(lengths) < 20 and max(lengths) > 64 and len(set(lengths)) > 4, lengths
    mask = out.response_mask
    assert float(((trainer - out.logprobs).abs() * mask).max()) < 1e-5
    assert (out.logprobs[~mask] == 0).all()


@pytest.mark.slow
def test_grouped_query_attention_and_scaled_rope_match_the_trainer(tok):
    config = LlamaConfig(
        vocab_size=len(V), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True, pad_token_id=PAD,
        eos_token_id=EOS, rope_scaling={"rope_type": "linear", "factor": 2.0},
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    assert _NativeDecoder.supports(model)
    out = FastRolloutEngine(model, tok).generate(PROMPTS, 3, SamplingParams(max_tokens=30, seed=2, logprobs=True))
    mask = out.response_mask
    assert float(((trainer_log_probs(model, out, PAD, 1.0) - out.logprobs).abs() * mask).max()) < 1e-5
    greedy = SamplingParams(temperature=0.0, max_tokens=30)
    assert_same_rollouts(FastRolloutEngine(model, tok).generate(PROMPTS, 1, greedy), HFRolloutEngine(model, tok).generate(PROMPTS, 1, greedy))


# ---------------------------------------------------------------- reproducible by construction


@pytest.mark.slow
def test_samples_do_not_depend_on_chunks_other_prompts_position_dropping_or_decode_path(model, tok):
    params = SamplingParams(max_tokens=24, seed=123, logprobs=True)
    whole = FastRolloutEngine(model, tok).generate(PROMPTS, 3, params)
    n = 3

    def rows_of(out, i):  # (texts, logprobs) of prompt i's group
        return out.texts[i * n : (i + 1) * n], out.logprobs[i * n : (i + 1) * n]

    variants = {
        "chunk 1": (FastRolloutEngine(model, tok, batch_size=1), PROMPTS),
        "chunk 5": (FastRolloutEngine(model, tok, batch_size=5), PROMPTS),
        "drop at every finish": (FastRolloutEngine(model, tok, compact_at=0.0), PROMPTS),
        "never drop": (FastRolloutEngine(model, tok, compact_at=2.0), PROMPTS),
        "model forward": (FastRolloutEngine(model, tok, native=False), PROMPTS),
        "reversed": (FastRolloutEngine(model, tok), PROMPTS[::-1]),
    }
    for name, (engine, prompts) in variants.items():
        out = engine.generate(prompts, n, params)
        for i, p in enumerate(prompts):
            j = PROMPTS.index(p)
            texts, lp = rows_of(out, i)
            want_texts, want_lp = rows_of(whole, j)
            assert texts == want_texts, (name, p)
            width = min(lp.shape[1], want_lp.shape[1])
            torch.testing.assert_close(lp[:, :width], want_lp[:, :width], rtol=0, atol=1e-5)
    alone = FastRolloutEngine(model, tok).generate([PROMPTS[2]], n, params)
    assert alone.texts == rows_of(whole, 2)[0]  # one prompt per call, as one rank of many would
    assert len(set(whole.texts)) > n  # samples differ within and across groups


def test_same_seed_replays_other_seeds_differ_and_the_global_rng_is_untouched(tok):
    engine = FastRolloutEngine(tiny(tok), tok)
    params = SamplingParams(max_tokens=12, seed=123)
    state = torch.get_rng_state()
    first = engine.generate(["What is 1+2?\n"], 4, params)
    assert torch.equal(torch.get_rng_state(), state)
    again = engine.generate(["What is 1+2?\n"], 4, params)
    other = engine.generate(["What is 1+2?\n"], 4, SamplingParams(max_tokens=12, seed=124))
    assert torch.equal(first.response_ids, again.response_ids) and first.texts == again.texts
    assert not torch.equal(first.response_ids, other.response_ids)
    unseeded = [engine.generate(["What is 1+2?\n"], 4, SamplingParams(max_tokens=12)).texts for _ in range(2)]
    assert unseeded[0] != unseeded[1] and not torch.equal(torch.get_rng_state(), state)  # seed=None: global RNG


def test_a_repeated_prompt_gets_distinct_samples(tok):
    out = FastRolloutEngine(tiny(tok), tok).generate(["Q\n", "Q\n"], 4, SamplingParams(max_tokens=12, seed=0))
    assert out.texts[:4] != out.texts[4:]


# ---------------------------------------------------------------- engine housekeeping


def test_checkpoint_generation_defaults_do_not_change_sampling(tok):
    model = tiny(tok)
    params = SamplingParams(max_tokens=10, seed=5)
    clean = FastRolloutEngine(model, tok).generate(["What is 3+4?\n"], 4, params)
    g = model.generation_config
    g.top_k, g.top_p, g.temperature, g.repetition_penalty, g.do_sample = 1, 0.1, 0.01, 5.0, False
    g.no_repeat_ngram_size, g.min_new_tokens = 1, 8
    assert torch.equal(clean.response_ids, FastRolloutEngine(model, tok).generate(["What is 3+4?\n"], 4, params).response_ids)


def test_train_mode_and_grad_state_are_restored_and_sync_is_a_noop(tok):
    model = tiny(tok)
    engine = FastRolloutEngine(model, tok)
    for training in (True, False):
        model.train(training)
        engine.generate(["q\n"], 2, SamplingParams(max_tokens=3, seed=0))
        assert model.training is training
    assert torch.is_grad_enabled()
    assert engine.sync_weights(object()) is None
    engine.sleep()
    engine.wake_up()


def test_a_private_copy_syncs_every_tensor_and_samples_with_it(tok):
    model = tiny(tok)
    copy_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in copy_model.parameters():
            p.add_(1.0)

    class Source:
        def export_weights(self):
            yield from model.state_dict().items()

    engine = FastRolloutEngine(copy_model, tok, shares_weights=False)
    engine.sync_weights(Source())
    params = SamplingParams(max_tokens=8, seed=0)
    assert torch.equal(engine.generate(PROMPTS, 2, params).response_ids, FastRolloutEngine(model, tok).generate(PROMPTS, 2, params).response_ids)

    class Partial:
        def export_weights(self):
            yield from list(model.state_dict().items())[:1]

    with pytest.raises(KeyError, match="no value"):
        engine.sync_weights(Partial())


def test_bad_arguments_raise(tok):
    model = tiny(tok)
    with pytest.raises(ValueError, match="batch_size"):
        FastRolloutEngine(model, tok, batch_size=0)
    no_pad = build_char_tokenizer()
    no_pad.pad_token = None
    with pytest.raises(ValueError, match="no pad token"):
        FastRolloutEngine(model, no_pad)
    engine = FastRolloutEngine(model, tok)
    with pytest.raises(ValueError, match="n must be"):
        engine.generate(["q"], 0, SamplingParams())
    with pytest.raises(ValueError, match="at least one prompt"):
        engine.generate([], 1, SamplingParams())
    with pytest.raises(ValueError, match="no tokens"):
        engine.generate([""], 1, SamplingParams())


# ---------------------------------------------------------------- through the trainer: any world size


class _FakeRanks:
    """A world of ``world_size`` ranks as seen by one of them, for ``train.collect_batch`` without processes
    (its only collective here gathers per-response stats; every rank's part is this rank's)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, rank

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather_object(self, obj):
        return [obj] * self.world_size


@pytest.mark.slow
def test_the_trainers_rollouts_do_not_depend_on_the_world_size(tok):
    from dapo_cli.config import apply_techniques, load_config
    from dapo_cli.data.loader import Prompt, PromptStream
    from dapo_cli.runs import derive_seed
    from dapo_cli.train.rounds import InlineRounds
    from dapo_cli.train import collect_batch

    model = tiny(tok)
    cfg = apply_techniques(load_config(None, [
        "rollout.n=3", "data.train_batch_size=4", "trainer.ppo_mini_batch_size=4", "rollout.max_response_length=16",
        "trainer.seed=7",
    ]), dynamic_sampling=False)
    prompts = [Prompt(text=f"What is {k}+{k}?\n", ground_truth=str(2 * k), problem_id=str(k)) for k in range(4)]

    class Recording(FastRolloutEngine):
        seeds: list = []

        def generate(self, prompts, n, params):
            self.seeds.append(params.seed)
            return super().generate(prompts, n, params)

    def texts(world_size: int, engine_cls=Recording) -> tuple[list[str], list]:
        out, seeds = [], []
        for rank in range(world_size):
            engine = engine_cls(model, tok)
            engine.seeds = []
            stream = PromptStream(prompts, seed=0, shuffle=False)
            dist = _FakeRanks(rank, world_size) if world_size > 1 else None
            out += collect_batch(InlineRounds(engine, stream, cfg, dist), cfg, step=3, pad_id=PAD, dist=dist).generated.texts
            seeds += engine.seeds
        return out, seeds

    one, seeds_one = texts(1)
    two, seeds_two = texts(2)
    four, _ = texts(4)
    assert one == two == four  # rank r generates prompts r*share.. with the same streams as one process
    assert seeds_one == seeds_two[:1] == seeds_two[1:] == [derive_seed(7, "rollout", 3, 0)]

    class HFRecording(HFRolloutEngine):  # an engine whose stream is one per call keeps a seed per rank
        seeds: list = []

        def generate(self, prompts, n, params):
            self.seeds.append(params.seed)
            return super().generate(prompts, n, params)

    _, hf_seeds = texts(2, HFRecording)
    assert hf_seeds == [derive_seed(7, "rollout", 3, 0, 0), derive_seed(7, "rollout", 3, 0, 1)]


def test_vocab_logits_are_the_heads_output_and_hooks_still_see_the_module():
    from dapo_cli.rollout.fast import vocab_logits

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 300, bias=False)
    hidden = torch.randn(5, 16)
    # (W h^T)^T holds the same dot products as h W^T: equal up to float32 summation order
    torch.testing.assert_close(vocab_logits(head, hidden), head(hidden), rtol=0, atol=1e-6)
    assert vocab_logits(head, hidden).shape == (5, 300)
    seen = []
    handle = head.register_forward_hook(lambda _m, _i, out: seen.append(out.shape) or torch.zeros_like(out))
    assert torch.equal(vocab_logits(head, hidden), torch.zeros(5, 300)) and seen == [(5, 300)]
    handle.remove()
    biased = torch.nn.Linear(16, 300)
    assert torch.equal(vocab_logits(biased, hidden), biased(hidden))  # a bias: the module itself
