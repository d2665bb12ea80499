"""The shared-prompt training forward against the plain one (engine/forward.py).

The shared forward computes each distinct prompt once and the responses against its keys/values;
it must give the plain forward's per-token log-probs, entropies and gradients (float32, 1e-5) on
Qwen2 (q/k/v bias) and Llama (no bias, grouped-query heads), tied and untied embeddings, prompts
of different lengths (left padding) and ragged responses (right padding), with rows of a group
scattered through the batch; and fall back to the plain forward where it cannot reproduce it.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from dapo_cli.batch import RolloutBatch
from dapo_cli.engine.forward import (
    PolicyLogProbs,
    distinct_prompts,
    needed_inputs,
    plain_log_probs,
    response_attention,
    shared_prompt_log_probs,
    shared_prompt_supported,
)
from dapo_cli.engine.torch import TorchEngine
from dapo_cli.train.update import micro_slices

VOCAB, PAD = 40, 0
CHUNK = 5
"""Output-head rows per chunk in these tests (engine.logprob_chunk): the batches here span several chunks."""
COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
          "num_attention_heads": 4, "max_position_embeddings": 64, "pad_token_id": PAD}
CONFIGS = {
    "qwen2-bias-tied": lambda: Qwen2ForCausalLM(Qwen2Config(**COMMON, num_key_value_heads=4, tie_word_embeddings=True)),
    "qwen2-bias-untied-gqa": lambda: Qwen2ForCausalLM(Qwen2Config(**COMMON, num_key_value_heads=2, tie_word_embeddings=False)),
    "llama-tied-gqa": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, num_key_value_heads=2, tie_word_embeddings=True)),
    "llama-untied": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, num_key_value_heads=4, tie_word_embeddings=False)),
}


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = CONFIGS[name]().train()  # training mode, as the engine runs it
    for p in model.parameters():  # random-init biases are zero; make them count
        if p.dim() == 1 and not torch.count_nonzero(p):
            p.data.normal_(0.0, 0.5)
    return model


def ragged_rows(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """14 rows: 4 prompts of real length 6, 2, 4, 1 (left-padded to 7 columns: one column that is
    padding in every prompt), rows of a prompt scattered, responses of length 1..9 right-padded."""
    gen = torch.Generator().manual_seed(seed)
    s, t = 7, 9
    ids = torch.randint(1, VOCAB, (4, s), generator=gen)
    mask = torch.arange(s)[None, :] >= torch.tensor([[1], [5], [3], [6]])
    ids[~mask] = PAD
    of_row = torch.tensor([2, 0, 1, 3, 0, 2, 2, 1, 3, 0, 1, 2, 3, 0])
    lengths = torch.tensor([9, 1, 4, 9, 7, 2, 9, 5, 3, 8, 6, 1, 9, 4])
    response = torch.randint(1, VOCAB, (len(of_row), t), generator=gen)
    r_mask = torch.arange(t)[None, :] < lengths[:, None]
    response[~r_mask] = PAD
    return ids[of_row], mask[of_row], response, r_mask


def forward_and_grads(fn, model, rows, temperature=0.7, chunk=CHUNK):
    """log-probs, entropies and the gradient of a loss that uses both (every real position weighted;
    losses never read padding, which the shared forward does not compute)."""
    model.zero_grad(set_to_none=True)
    logp, ent = fn(model, *rows, temperature=temperature, with_entropy=True, chunk=chunk)
    weights = torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    ((logp * weights * rows[3]).sum() + 0.3 * (ent * rows[3]).sum()).backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    return logp.detach(), ent.detach(), grads


# ---------------------------------------------------------------- hand-checkable pieces


def test_distinct_prompts_compares_real_tokens_wherever_the_rows_are():
    # rows 0 and 2 are the same prompt [5, 6] with different fill in the padding column; row 1 is
    # [7, 5, 6]; row 3 is [6] — so 3 distinct prompts, and column 0 is kept (row 1 uses it)
    ids = torch.tensor([[0, 5, 6], [7, 5, 6], [9, 5, 6], [0, 0, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [0, 0, 1]], dtype=torch.bool)
    p_ids, p_mask, of_row = distinct_prompts(ids, mask)
    assert len(p_ids) == 3
    assert of_row[0] == of_row[2] and len({int(of_row[0]), int(of_row[1]), int(of_row[3])}) == 3
    assert p_ids[of_row[1]].tolist() == [7, 5, 6] and p_mask[of_row[0]].tolist() == [False, True, True]
    # without row 1 the first column is padding in every prompt and is dropped
    p_ids, p_mask, of_row = distinct_prompts(ids[[0, 2, 3]], mask[[0, 2, 3]])
    assert p_ids.shape == (2, 2) and p_mask[of_row[2]].tolist() == [False, True] and of_row[0] == of_row[1]


def test_response_positions_and_mask_are_the_plain_forwards():
    # One row: prompt [pad, a, b] (real length 2), response inputs [x, y, pad].
    # Plain forward: mask [0 1 1 | 1 1 0], positions cumsum - 1 = [-1→0, 0, 1 | 2, 3, 3]:
    # the response inputs sit at 2, 3, 3 (= len - 1 + cumsum([1, 1, 0]) = 1 + [1, 2, 2]).
    # Query x sees a, b, x; query y sees a, b, x, y; the pad query sees a, b, x, y (not itself).
    positions, attend = response_attention(torch.tensor([[0, 1, 1]], dtype=torch.bool), torch.tensor([[1, 1, 0]], dtype=torch.bool))
    assert positions.tolist() == [[2, 3, 3]]
    assert attend.int().tolist() == [[[0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0]]]


def test_each_prompt_is_computed_once_and_logits_only_at_response_positions():
    # 8 rows of one prompt (5 tokens), responses of 4: the plain forward embeds 8 x 9 tokens and
    # projects 8 x 5 positions to the vocabulary; the shared one embeds the prompt once (1 x 5) and
    # the responses but the last token (8 x 3 = 24, packed), and projects exactly the 8 x 4 = 32
    # predicting positions (8 from the prompt's last position + the 24).
    model = build("llama-tied-gqa")
    seen: dict[str, list[tuple[int, ...]]] = {"embed": [], "head": []}
    model.model.embed_tokens.register_forward_hook(lambda m, a, out: seen["embed"].append(tuple(a[0].shape)))
    model.lm_head.register_forward_hook(lambda m, a, out: seen["head"].append(tuple(a[0].shape[:-1])))
    prompt = torch.randint(1, VOCAB, (1, 5)).expand(8, 5)
    rows = (prompt, torch.ones(8, 5, dtype=torch.bool), torch.randint(1, VOCAB, (8, 4)), torch.ones(8, 4, dtype=torch.bool))
    shared, _ = shared_prompt_log_probs(model, *rows, temperature=1.0, with_entropy=False, chunk=CHUNK)
    assert seen == {"embed": [(1, 5), (24,)], "head": [(32,)]}
    seen["embed"].clear(), seen["head"].clear()
    plain, _ = plain_log_probs(model, *rows, temperature=1.0, with_entropy=False, chunk=0)
    assert seen == {"embed": [(8, 9)], "head": [(8, 5)]}
    assert float((shared - plain).detach().abs().max()) < 1e-5


def test_padding_of_ragged_responses_is_never_fed():
    # Responses of lengths 4, 1, 3, 2 (right-padded to 4): input t is fed only when it predicts a real
    # token t + 1, i.e. 3 + 0 + 2 + 1 = 6 inputs (never the 6 padding ones, nor a row's last token);
    # lm_head sees 4 (response token 0 of each row, from the prompt) + 6 positions. The positions not
    # computed come back as exactly 0 and the real ones match the plain forward.
    model = build("qwen2-bias-tied")
    seen: dict[str, list[tuple[int, ...]]] = {"embed": [], "head": []}
    model.model.embed_tokens.register_forward_hook(lambda m, a, out: seen["embed"].append(tuple(a[0].shape)))
    model.lm_head.register_forward_hook(lambda m, a, out: seen["head"].append(tuple(a[0].shape[:-1])))
    lengths = torch.tensor([4, 1, 3, 2])
    r_mask = torch.arange(4)[None, :] < lengths[:, None]
    response = torch.randint(1, VOCAB, (4, 4)).masked_fill(~r_mask, PAD)
    prompt = torch.randint(1, VOCAB, (2, 5)).repeat_interleave(2, 0)
    rows = (prompt, torch.ones(4, 5, dtype=torch.bool), response, r_mask)
    shared, ent = shared_prompt_log_probs(model, *rows, temperature=1.0, with_entropy=True, chunk=CHUNK)
    assert seen == {"embed": [(2, 5), (6,)], "head": [(10,)]}
    assert needed_inputs(r_mask).sum(-1).tolist() == [3, 0, 2, 1]
    assert torch.equal(shared[~r_mask], torch.zeros(6)) and torch.equal(ent[~r_mask], torch.zeros(6))
    plain, plain_ent = plain_log_probs(model, *rows, temperature=1.0, with_entropy=True, chunk=0)
    assert float((shared - plain)[r_mask].detach().abs().max()) < 1e-5
    assert float((ent - plain_ent)[r_mask].detach().abs().max()) < 1e-5


def test_needed_inputs_keep_every_key_a_real_query_reads():
    # A mask with a hole (not produced by the engines, but legal): tokens [r r p r]. Input 0 predicts
    # token 1 (real); input 1 predicts a pad but is real and token 3 reads its keys; input 2 is a
    # pad predicting token 3 (real: its logits are needed). All three are fed.
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 0]], dtype=torch.bool)
    assert needed_inputs(mask).tolist() == [[True, True, True], [True, False, False]]


# ---------------------------------------------------------------- the same numbers as the plain forward


@pytest.mark.parametrize("name", list(CONFIGS))
def test_log_probs_entropies_and_gradients_match_the_plain_forward(name):
    model = build(name)
    assert shared_prompt_supported(model)
    rows = ragged_rows()
    lp_plain, ent_plain, g_plain = forward_and_grads(plain_log_probs, model, rows)
    lp_shared, ent_shared, g_shared = forward_and_grads(shared_prompt_log_probs, model, rows)
    assert lp_plain.shape == lp_shared.shape == rows[2].shape
    # every real position; the padded ones are not computed (0)
    mask = rows[3]
    assert float((lp_shared - lp_plain)[mask].abs().max()) <= 1e-5
    assert float((ent_shared - ent_plain)[mask].abs().max()) <= 1e-5
    assert not lp_shared[~mask].any() and not ent_shared[~mask].any()
    assert float(lp_plain.abs().max()) > 1.0  # real log-probs, not a degenerate case
    assert set(g_plain) == set(g_shared)
    for key, g in g_plain.items():
        assert float(g.norm()) > 0, key  # every parameter gets a gradient (incl. q/k/v biases)
        rel = float((g_shared[key] - g).norm() / g.norm())
        assert rel <= 1e-5, (key, rel)


def test_one_token_responses_and_a_single_row():
    # T = 1: only the last prompt position predicts; nothing of the response is fed
    model = build("qwen2-bias-tied")
    ids, mask, response, r_mask = ragged_rows()
    for rows in ((ids, mask, response[:, :1], r_mask[:, :1]), (ids[:1], mask[:1], response[:1], r_mask[:1])):
        a, ea, ga = forward_and_grads(plain_log_probs, model, rows, temperature=1.0)
        b, eb, gb = forward_and_grads(shared_prompt_log_probs, model, rows, temperature=1.0)
        assert float((a - b).abs().max()) <= 1e-5 and float((ea - eb).abs().max()) <= 1e-5
        assert all(float((gb[k] - g).norm()) <= 1e-5 * float(g.norm()) + 1e-12 for k, g in ga.items())


# ---------------------------------------------------------------- fallback


def sliding_qwen2():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**COMMON, num_key_value_heads=4, use_sliding_window=True, sliding_window=3, max_window_layers=0))


def dynamic_rope_llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**COMMON, num_key_value_heads=4, rope_scaling={"rope_type": "dynamic", "factor": 2.0}))


def dropout_llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**COMMON, num_key_value_heads=4, attention_dropout=0.1))


def gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=PAD))


def checkpointed_llama():
    model = build("llama-untied")
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    return model


@pytest.mark.parametrize("make", [sliding_qwen2, dynamic_rope_llama, dropout_llama, gpt2, checkpointed_llama])
def test_unsupported_models_fall_back_to_the_plain_forward(make, monkeypatch):
    model = make().train()
    assert not shared_prompt_supported(model)
    module = PolicyLogProbs(model, shared_prompt=True, chunk=CHUNK)
    assert not module.uses_shared_prompt()

    def must_not_run(*args, **kwargs):
        raise AssertionError("the shared-prompt forward ran on an unsupported model")

    monkeypatch.setattr("dapo_cli.engine.forward.shared_prompt_log_probs", must_not_run)
    model.eval()  # no dropout randomness: compare the two calls exactly
    if make is dropout_llama:  # in eval mode dropout is off, so the shared forward would apply
        model.train()
    rows = ragged_rows()
    torch.manual_seed(3)
    logp, _ = module(*rows, temperature=1.0, with_entropy=False)
    torch.manual_seed(3)
    ref, _ = plain_log_probs(model, *rows, temperature=1.0, with_entropy=False, chunk=CHUNK)
    assert torch.equal(logp, ref)


def test_supported_model_uses_the_shared_forward_unless_switched_off(monkeypatch):
    model = build("llama-untied")
    calls = []
    real = shared_prompt_log_probs
    monkeypatch.setattr("dapo_cli.engine.forward.shared_prompt_log_probs", lambda *a, **k: calls.append(1) or real(*a, **k))
    rows = ragged_rows()
    PolicyLogProbs(model, shared_prompt=True, chunk=CHUNK)(*rows, temperature=1.0, with_entropy=False)
    PolicyLogProbs(model, shared_prompt=False, chunk=CHUNK)(*rows, temperature=1.0, with_entropy=False)
    assert calls == [1]


# ---------------------------------------------------------------- through the engine


def batch_of(rows) -> RolloutBatch:
    ids, mask, response, r_mask = rows
    n = len(ids)
    gen = torch.Generator().manual_seed(5)
    return RolloutBatch(
        prompt_ids=ids, prompt_mask=mask, response_ids=response, response_mask=r_mask, lengths=r_mask.sum(-1),
        truncated=torch.zeros(n, dtype=torch.bool), group_ids=torch.zeros(n, dtype=torch.long), texts=[""] * n,
        ground_truths=[""] * n, prompts=[""] * n, pad_id=PAD, loss_mask=r_mask.clone(), advantages=torch.randn(n, generator=gen),
    )


@pytest.mark.slow
def test_engine_micro_batches_accumulate_the_plain_engines_gradient():
    # micro-batches of 5 rows cut groups apart (a prompt's rows land in several micro-batches):
    # the summed micro-batch gradients the optimizer steps on must be the plain engine's
    batch = batch_of(ragged_rows())
    grads = {}
    for shared in (True, False):
        engine = TorchEngine(build("qwen2-bias-untied-gqa"), lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=0.0,
                             shared_prompt_forward=shared)
        assert engine.forward_module.uses_shared_prompt() is shared
        slices = micro_slices(len(batch), 5)
        for i, rows in enumerate(slices):
            micro = batch.select(rows)
            with engine.accumulate(last=i == len(slices) - 1):
                logp, _ = engine.log_probs(micro, temperature=1.0, with_entropy=True)
                engine.backward(-(logp * micro.advantages[:, None] * micro.loss_mask).sum() / batch.loss_mask.sum())
        grads[shared] = {k: p.grad.detach().clone() for k, p in engine.module.named_parameters()}
        norm, applied = engine.step()
        assert applied and norm > 1e-3
    for key, g in grads[False].items():
        assert float((grads[True][key] - g).norm()) <= 1e-5 * float(g.norm()), key
