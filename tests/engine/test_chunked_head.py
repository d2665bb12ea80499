"""The trainer's forwards through the chunked output head (engine.logprob_chunk) against the full logits.

Every trainer forward (the shared-prompt one and the plain one, the policy's and the reference's)
scores the response tokens through ``forward.head_log_probs``. With a chunk of a few rows it must
give what the full-logits path (chunk 0) gives: log-probs, entropies and every parameter's gradient
of a loss that uses both, to float32 rounding (1e-5, relative for gradients), for Qwen2 / Llama /
Qwen3 / Mistral / GPT-2 heads, tied and untied, at temperature 1 and 0.7, under micro-batch splits,
under bf16 autocast (to bf16 rounding), and on SmolLM2-135M; and no tensor of [tokens, vocabulary]
may be kept for the backward.
"""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM, Qwen3Config, Qwen3ForCausalLM

from dapo_cli.config.schema import EngineConfig
from dapo_cli.engine.forward import PolicyLogProbs, plain_backbone, plain_log_probs, shared_prompt_log_probs
from dapo_cli.engine.torch import TorchEngine
from dapo_cli.train.update import micro_slices

from test_shared_prompt_forward import COMMON, CONFIGS, PAD, VOCAB, batch_of, build, forward_and_grads, ragged_rows

PLAIN_ONLY = {
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**COMMON, num_key_value_heads=2, head_dim=8)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**COMMON, num_key_value_heads=2, sliding_window=None)),
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=PAD)),
}


def assert_same(a, b, mask, tol=1e-5):
    lp_a, ent_a, g_a = a
    lp_b, ent_b, g_b = b
    assert float((lp_a - lp_b)[mask].abs().max()) <= tol
    assert float((ent_a - ent_b)[mask].abs().max()) <= tol
    assert set(g_a) == set(g_b)
    for key, g in g_b.items():
        assert float(g.norm()) > 0, key
        # relative, with a floor for the gradients that are 0 in exact arithmetic (a key bias: softmax
        # ignores a shift shared by every key of a query) and come out as rounding noise of ~1e-3
        assert float((g_a[key] - g).norm()) <= tol * float(g.norm()) + 1e-7, key


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 4])
def test_shared_prompt_forward_chunked_equals_full_logits(name, temperature, chunk):
    model = build(name)
    rows = ragged_rows()
    full = forward_and_grads(shared_prompt_log_probs, model, rows, temperature, chunk=0)
    chunked = forward_and_grads(shared_prompt_log_probs, model, rows, temperature, chunk=chunk)
    assert_same(chunked, full, rows[3])


@pytest.mark.parametrize("name", [*CONFIGS, *PLAIN_ONLY])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_plain_forward_chunked_equals_the_models_own_logits(name, temperature):
    if name in PLAIN_ONLY:
        torch.manual_seed(0)
        model = PLAIN_ONLY[name]().train()
    else:
        model = build(name)
    model.config.attention_dropout = 0.0
    assert plain_backbone(model) is not None
    rows = ragged_rows()
    model.eval()  # GPT-2 has dropout; compare the arithmetic, not random masks
    full = forward_and_grads(plain_log_probs, model, rows, temperature, chunk=0)
    chunked = forward_and_grads(plain_log_probs, model, rows, temperature, chunk=3)
    assert_same(chunked, full, rows[3])
    assert not chunked[0][~rows[3]].any()  # padding is not scored (0), as in the shared forward


def test_heads_it_cannot_chunk_run_as_their_module():
    # a head with a forward hook (what tests and benchmarks use to observe it) is called, and its output used
    model = build("llama-untied")
    seen = []
    model.lm_head.register_forward_hook(lambda m, a, out: seen.append(tuple(out.shape)))
    rows = ragged_rows()
    shared_prompt_log_probs(model, *rows, temperature=1.0, with_entropy=False, chunk=2)
    plain_log_probs(model, *rows, temperature=1.0, with_entropy=False, chunk=2)
    assert len(seen) == 2 and all(shape[-1] == VOCAB for shape in seen)


def saved_shapes(fn, model, rows, chunk):
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, ent = fn(model, *rows, temperature=0.7, with_entropy=True, chunk=chunk)
    return shapes, int(rows[3].sum())


@pytest.mark.parametrize("fn", [shared_prompt_log_probs, plain_log_probs])
def test_no_vocabulary_wide_tensor_is_kept_for_the_backward(fn):
    # Chunked: the largest vocabulary-wide tensor autograd keeps is the head's weight [V, H]; nothing
    # [tokens, V]. The full-logits path keeps at least one (the check can fail).
    model = build("qwen2-bias-untied-gqa")
    rows = ragged_rows()
    for chunk, expect_wide in ((3, False), (0, True)):
        shapes, tokens = saved_shapes(fn, model, rows, chunk)
        wide = [s for s in shapes if s and s[-1] == VOCAB and (len(s) > 2 or s[0] >= tokens // 2)]
        assert bool(wide) is expect_wide, (chunk, wide)


def test_engine_micro_batches_with_chunks_accumulate_the_full_logits_gradient():
    batch = batch_of(ragged_rows())
    grads = {}
    for chunk in (0, 4):
        engine = TorchEngine(build("qwen2-bias-untied-gqa"), lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=0.0,
                             logprob_chunk=chunk)
        slices = micro_slices(len(batch), 5)
        for i, rows in enumerate(slices):
            micro = batch.select(rows)
            with engine.accumulate(last=i == len(slices) - 1):
                logp, ent = engine.log_probs(micro, temperature=0.7, with_entropy=True)
                loss = -(logp * micro.advantages[:, None] * micro.loss_mask).sum() - 0.01 * (ent * micro.loss_mask).sum()
                engine.backward(loss / batch.loss_mask.sum())
        grads[chunk] = {k: p.grad.detach().clone() for k, p in engine.module.named_parameters()}
    for key, g in grads[0].items():
        assert float((grads[4][key] - g).norm()) <= 1e-5 * float(g.norm()), key


@pytest.mark.parametrize("shared", [True, False])
def test_bf16_autocast_chunked_equals_full_logits_to_bf16_rounding(shared):
    model = build("llama-tied-gqa")
    rows = ragged_rows()
    out = {}
    for chunk in (0, 3):
        module = PolicyLogProbs(model, shared_prompt=shared, chunk=chunk, autocast="bfloat16")
        out[chunk] = forward_and_grads(lambda m, *r, chunk, **k: module(*r, **k), model, rows, 0.7, chunk=chunk)
    # the head's matmul runs in bf16 on both paths (same inputs, same rounding of z); the log-softmax in
    # float32; ∂W sums bf16 chunk products in float32 where the full path rounds one product to bf16
    assert_same(out[3], out[0], rows[3], tol=2e-2)
    assert float((out[3][0] - out[0][0])[rows[3]].abs().max()) <= 1e-5  # the forward: same bf16 logits


def test_the_schema_default_chunks():
    assert EngineConfig().logprob_chunk > 0


@pytest.mark.slow
@pytest.mark.gguf  # the smollm2_dir fixture imports the GGUF file (.venv-vllm has the gguf package)
def test_smollm2_chunked_equals_full_logits(smollm2_dir):
    from dapo_cli.models import load_policy

    model, tokenizer = load_policy(smollm2_dir)
    model.train()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.tensor(tokenizer("What is 12 + 345?", add_special_tokens=False)["input_ids"])[None].repeat(4, 1)
    response = torch.randint(10, 4000, (4, 12), generator=gen)
    r_mask = torch.arange(12)[None, :] < torch.tensor([[12], [7], [3], [10]])
    rows = (prompt, torch.ones_like(prompt, dtype=torch.bool), response.masked_fill(~r_mask, 0), r_mask)
    for fn in (shared_prompt_log_probs, plain_log_probs):
        full = forward_and_grads(fn, model, rows, 0.7, chunk=0)
        chunked = forward_and_grads(fn, model, rows, 0.7, chunk=8)
        # 1e-4 for both paths: the chunked and full heads differ only in how the [tokens, 576] x [576, 49152]
        # product is blocked; a float32 logit of |z| ~ 20 has an ulp of 1.9e-6 and the 576-term dot product
        # rounds differently by a few ulps, so the log-probs differ by up to ~1e-5 (1.9e-5 measured on an
        # AVX-512 Xeon; the AMD EPYC that ran it before stayed under 1e-5).
        assert_same(chunked, full, r_mask, tol=1e-4)
