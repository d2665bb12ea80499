"""LoRA on the torch engine (``engine/lora.py``, ``models/native.linear_params``), checked by hand.

Each targeted layer computes ``x (W0 + s B A)ᵀ + b``, ``s = alpha / r``, with W0 frozen. The reference
below never touches PEFT's layers: it runs the *plain* model through ``torch.func.functional_call``
with those weights built from leaf tensors ``A`` and ``B`` (the same forward code as the engine's, so
float64 agrees to rounding: transformers' own RMSNorm rounds float64 through float32), takes their
gradients with autograd and writes AdamW's first step out, in float64. What must hold:

1. one engine step moves A and B exactly as that hand computation (both trainer forwards);
2. the base is bitwise unchanged after steps and AdamW holds the adapters only;
3. the forwards include the adapters (log-probs move when B is non-zero, to the merged model's);
4. ``export_weights`` is the plain model's state dict, merged (by hand and by PEFT's own merge), and
   a rollout engine synced from it samples with the merged policy (its log-probs are the trainer's).
"""

from __future__ import annotations

import copy

import pytest
import torch

from dapo_cli.engine.forward import PolicyLogProbs
from dapo_cli.engine.torch import TorchEngine, policy_forward

from test_shared_prompt_forward import CHUNK, batch_of, build, ragged_rows

pytestmark = pytest.mark.lora

RANK, ALPHA = 4, 8.0
SCALE = ALPHA / RANK  # s = alpha / r
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_model(name: str = "qwen2-bias-untied-gqa", *, dtype=torch.float64, seed: int = 3, target=("all-linear",)):
    """``build(name)`` in ``dtype`` with rank-4 adapters whose A and B are random (B is zero at PEFT's init,
    which would hide the adapters from every check); the adapters and a plain twin of the base."""
    from dapo_cli.engine.lora import LoraAdapters

    plain = build(name).to(dtype)
    model = copy.deepcopy(plain)
    adapters = LoraAdapters(model, rank=RANK, alpha=ALPHA, target_modules=list(target), dropout=0.0)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name_, p in model.named_parameters():
            if "lora_" in name_:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model, adapters, plain


def adapter_tensors(model) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{plain weight name: (A [r, in], B [out, r])}`` of every LoRA layer, detached copies."""
    out = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A"):
            out[f"{name}.weight"] = (module.lora_A["default"].weight.detach().clone(), module.lora_B["default"].weight.detach().clone())
    return out


def merged_by_hand(plain, adapters: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The plain model's state dict with W0 + s B A wherever an adapter sits."""
    state = {k: v.detach().clone() for k, v in plain.state_dict().items()}
    for key, (a, b) in adapters.items():
        state[key] = state[key] + SCALE * b @ a
    return state


def hand_loss(plain, w0: dict[str, torch.Tensor], leaves: dict[str, tuple[torch.Tensor, torch.Tensor]], batch, *,
              shared: bool) -> torch.Tensor:
    """The trainer's loss -Σ A_i log π(o_t) / Σ mask of the *plain* model with W = W0 + s B A, through the
    same forward as the engine's (``PolicyLogProbs``; transformers' own RMSNorm rounds float64 through
    float32, which would hide a 1e-12 check) with those weights substituted (``functional_call``)."""
    params = {f"policy.{k}": v for k, v in w0.items()}
    for key, (a, b) in leaves.items():
        params[f"policy.{key}"] = w0[key] + SCALE * b @ a
    forward = PolicyLogProbs(plain, shared_prompt=shared, chunk=CHUNK)
    rows = (batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    logp, _ = torch.func.functional_call(forward, params, rows, {"temperature": 1.0, "with_entropy": False})
    return -(logp * batch.advantages[:, None] * batch.loss_mask).sum() / batch.loss_mask.sum()


def engine_loss(engine, batch) -> torch.Tensor:
    logp, _ = engine.log_probs(batch, temperature=1.0)
    return -(logp * batch.advantages[:, None] * batch.loss_mask).sum() / batch.loss_mask.sum()


@pytest.mark.parametrize("shared", [True, False], ids=["fused-forward", "peft-forward"])
def test_one_update_equals_adamw_on_the_hand_computed_lora_gradient(shared):
    model, adapters, plain = lora_model()
    assert all(p.dtype == torch.float64 for p in model.parameters())
    lr, wd, eps = 1e-3, 0.1, 1e-8
    engine = TorchEngine(model, lr=lr, weight_decay=wd, warmup_steps=0, grad_clip=0.0, shared_prompt_forward=shared,
                         adapters=adapters)
    assert engine.forward_module.uses_shared_prompt() is shared
    batch = batch_of(ragged_rows())
    before = adapter_tensors(model)
    assert len(before) == 2 * len(PROJECTIONS)  # all-linear: every projection of both blocks, not lm_head

    # by hand: gradients of A and B through W0 + s B A in the plain model
    w0 = {k: v.detach() for k, v in plain.named_parameters()}
    leaves = {k: (a.clone().requires_grad_(True), b.clone().requires_grad_(True)) for k, (a, b) in before.items()}
    loss = hand_loss(plain, w0, leaves, batch, shared=shared)
    g = torch.autograd.grad(loss, [t for ab in leaves.values() for t in ab])
    grads = {key: (g[2 * i], g[2 * i + 1]) for i, key in enumerate(leaves)}

    engine_value = engine_loss(engine, batch)
    assert float(engine_value.detach()) == pytest.approx(float(loss.detach()), rel=1e-12)
    engine.backward(engine_value)
    engine.step()

    # AdamW's first step (t = 1, m0 = v0 = 0): m1 = (1 - β1) g, v1 = (1 - β2) g²; bias-corrected
    # m̂ = m1 / (1 - β1) = g, v̂ = v1 / (1 - β2) = g²; decoupled decay first:
    #   p1 = p0 (1 - lr·wd) - lr · m̂ / (sqrt(v̂) + eps) = p0 (1 - lr·wd) - lr · g / (|g| + eps)
    after = adapter_tensors(model)
    for key, (a0, b0) in before.items():
        for p0, g, p1 in ((a0, grads[key][0], after[key][0]), (b0, grads[key][1], after[key][1])):
            expected = p0 * (1 - lr * wd) - lr * g / (g.abs() + eps)
            assert float(g.abs().max()) > 1e-6, key  # a real gradient, not a decay-only step
            torch.testing.assert_close(p1, expected, rtol=0, atol=1e-12, msg=key)


def test_the_base_is_frozen_and_adamw_holds_only_the_adapters():
    model, adapters, _ = lora_model(dtype=torch.float32)
    base = {k: p.detach().clone() for k, p in model.named_parameters() if "lora_" not in k}
    engine = TorchEngine(model, lr=1e-2, weight_decay=0.1, warmup_steps=0, grad_clip=1.0, adapters=adapters)
    batch = batch_of(ragged_rows())
    lora = {id(p) for k, p in model.named_parameters() if "lora_" in k}
    assert {id(p) for k, p in model.named_parameters() if p.requires_grad} == lora
    for _ in range(2):
        engine.backward(engine_loss(engine, batch))
        assert engine.step()[1]
    for key, p in model.named_parameters():
        if "lora_" not in key:
            assert torch.equal(p, base[key]) and p.grad is None, key
    optimized = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    assert optimized == lora and set(map(id, engine.optimizer.state)) == lora
    assert len(lora) == 2 * 2 * len(PROJECTIONS)  # A and B of 7 projections in 2 blocks


@pytest.mark.parametrize("shared", [True, False], ids=["fused-forward", "peft-forward"])
def test_log_probs_include_the_adapters(shared):
    model, adapters, plain = lora_model(dtype=torch.float64)
    rows = ragged_rows()
    mask = rows[3]
    policy = PolicyLogProbs(model, shared_prompt=shared, chunk=CHUNK)
    assert policy.uses_shared_prompt() is shared
    merged = copy.deepcopy(plain)
    merged.load_state_dict(merged_by_hand(plain, adapter_tensors(model)))
    with torch.no_grad():
        lp, _ = policy(*rows, temperature=0.7, with_entropy=False)
        base_lp, _ = PolicyLogProbs(plain, shared_prompt=shared, chunk=CHUNK)(*rows, temperature=0.7, with_entropy=False)
        merged_lp, _ = PolicyLogProbs(merged, shared_prompt=shared, chunk=CHUNK)(*rows, temperature=0.7, with_entropy=False)
        assert float((lp - base_lp)[mask].abs().max()) > 1e-2  # the adapters change the policy ...
        torch.testing.assert_close(lp[mask], merged_lp[mask], rtol=0, atol=1e-10)  # ... into the merged one
        for layer in adapters.layers().values():  # B = 0 (PEFT's init): the base policy exactly
            layer.lora_B["default"].weight.zero_()
        zero_lp, _ = policy(*rows, temperature=0.7, with_entropy=False)
    torch.testing.assert_close(zero_lp[mask], base_lp[mask], rtol=0, atol=1e-10)


def test_adapter_dropout_falls_back_to_the_models_own_forward():
    from dapo_cli.engine.lora import LoraAdapters

    model = build("llama-untied")
    LoraAdapters(model, rank=RANK, alpha=ALPHA, target_modules=["q_proj", "v_proj"], dropout=0.1)
    policy = PolicyLogProbs(model, shared_prompt=True, chunk=CHUNK)
    assert not policy.uses_shared_prompt()  # random dropout is not in the fused weights
    model.eval()
    assert policy.uses_shared_prompt()  # no dropout in eval mode


def test_export_weights_are_the_plain_state_dict_merged():
    model, adapters, plain = lora_model(dtype=torch.float64)
    engine = TorchEngine(model, lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=1.0, adapters=adapters)
    assert engine.generation_model() is None  # the fast sampler reads weights directly: it gets a merged copy
    exported = {k: v.clone() for k, v in engine.export_weights()}
    expected = merged_by_hand(plain, adapter_tensors(model))
    assert list(exported) == list(plain.state_dict())  # the plain model's names, in its order
    for key, value in expected.items():
        torch.testing.assert_close(exported[key], value, rtol=0, atol=1e-12, msg=key)
    peft_merged = copy.deepcopy(adapters.peft_model).merge_and_unload().state_dict()  # PEFT's own merge agrees
    for key, value in peft_merged.items():
        torch.testing.assert_close(exported[key], value, rtol=0, atol=1e-12, msg=key)


def test_the_merged_export_streams_one_adapted_layer_at_a_time():
    """The extra memory of a LoRA sync, measured: at each yield, the bytes of yielded tensors still alive that are no
    tensor of the module (merged weights ``W0 + s B A``; weak references, dropped by finalizers). A consumer that
    drops each tensor (the weight-sync contract) holds at most the largest adapted layer's weight; one that keeps
    them holds every merged weight (the measure sees materialisation). Every tensor received is the merge by hand."""
    import weakref

    model, adapters, plain = lora_model(dtype=torch.float64)
    engine = TorchEngine(model, lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=1.0, adapters=adapters)
    own = {t.untyped_storage().data_ptr() for t in model.state_dict().values()}
    expected = merged_by_hand(plain, adapter_tensors(model))
    merged_sizes = [expected[key].numel() * 8 for key in adapter_tensors(model)]

    def peak_of(keep: bool) -> int:
        alive: dict[int, int] = {}
        kept, peak = [], 0
        for name, tensor in engine.export_weights():
            torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-12, msg=name)
            if tensor.untyped_storage().data_ptr() not in own:  # a merged weight, made for this yield
                alive[id(tensor)] = tensor.untyped_storage().nbytes()
                weakref.finalize(tensor, alive.pop, id(tensor), None)
            peak = max(peak, sum(alive.values()))
            if keep:
                kept.append(tensor)
            del tensor
        return peak

    assert peak_of(keep=False) == max(merged_sizes)  # one merged layer at a time, no other buffer
    from dapo_cli.plan.memory import sync_term
    from dapo_cli.plan.shape import shape_from_config

    shape = shape_from_config(model.config.to_dict(), "test")  # the memory plan's term for this model, float64: b = 8
    assert sync_term(shape, 8, zero_stage=0, lora=True).gpu == max(merged_sizes)
    assert peak_of(keep=True) == sum(merged_sizes) > max(merged_sizes)


def test_only_the_named_modules_get_adapters():
    model, adapters, plain = lora_model(dtype=torch.float32, target=("q_proj", "v_proj"))
    assert sorted(adapters.layers()) == [f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "v_proj")]
    exported = dict(TorchEngine(model, lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=1.0, adapters=adapters).export_weights())
    assert torch.equal(exported["model.layers.0.self_attn.k_proj.weight"], plain.state_dict()["model.layers.0.self_attn.k_proj.weight"])
    assert not torch.equal(exported["model.layers.0.self_attn.q_proj.weight"], plain.state_dict()["model.layers.0.self_attn.q_proj.weight"])


def test_an_unknown_target_module_is_one_line():
    from dapo_cli.engine.lora import LoraAdapters
    from dapo_cli.errors import UserError

    with pytest.raises(UserError, match=r"model.lora.target_modules=\['qkv'\]") as info:
        LoraAdapters(build("llama-untied"), rank=RANK, alpha=ALPHA, target_modules=["qkv"], dropout=0.0)
    assert "\n" not in str(info.value)


def test_a_rollout_engine_synced_from_the_export_samples_with_the_merged_policy(tiny_model_dir):
    from dapo_cli import components
    from dapo_cli.batch import RolloutBatch
    from dapo_cli.config.schema import EngineConfig, LoraConfig, RolloutConfig
    from dapo_cli.engine.dist import SingleProcess
    from dapo_cli.models import load_policy
    from dapo_cli.rollout.base import SamplingParams

    model, tokenizer = load_policy(tiny_model_dir)
    engine = components.build_training_engine(
        EngineConfig(device="cpu"), model, SingleProcess(), lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=1.0,
        bf16=False, load_reference=None, lora=LoraConfig(rank=RANK, alpha=ALPHA),
    )
    with torch.no_grad():  # non-zero adapters: the merged policy differs from the base the copy is loaded from
        for key, p in engine.module.named_parameters():
            if "lora_" in key:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(len(key)))
    rollout = components.build_train_rollout(
        RolloutConfig(engine="fast"), engine, tokenizer, components.model_loader(tiny_model_dir, torch.float32), tiny_model_dir,
        max_model_len=96, max_sequences=6, dtype="float32", seed=0,
    )
    assert rollout.model is not engine.module and not rollout.shares_weights
    out = rollout.generate(["What is 12+7?\n", "Q"], 3, SamplingParams(max_tokens=8, seed=0, logprobs=True))
    batch = RolloutBatch.from_rollouts(
        out, group_ids=out.prompt_index, ground_truths=[""] * len(out.texts), prompts=[""] * len(out.texts), pad_id=tokenizer.pad_token_id,
    )
    with torch.no_grad():
        trainer, _ = engine.log_probs(batch, temperature=1.0)
        base, _ = policy_forward(load_policy(tiny_model_dir)[0], batch, temperature=1.0, with_entropy=False, device=torch.device("cpu"))
    mask = out.response_mask
    assert float(((trainer - out.logprobs).abs() * mask).max()) < 1e-5  # the sampler's policy is the trainer's
    assert float(((base - out.logprobs).abs() * mask).max()) > 1e-2  # which is not the base


@pytest.mark.parametrize("shared", [True, False], ids=["fused-forward", "peft-forward"])
def test_the_kl_reference_is_the_base_with_the_adapters_off(shared):
    model, adapters, plain = lora_model(dtype=torch.float64)
    engine = TorchEngine(model, lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=1.0, shared_prompt_forward=shared,
                         adapters=adapters, base_reference=True)
    batch = batch_of(ragged_rows())
    mask = batch.response_mask
    with torch.no_grad():
        base, _ = PolicyLogProbs(plain, shared_prompt=shared, chunk=CHUNK)(batch.prompt_ids, batch.prompt_mask, batch.response_ids, mask,
                                                              temperature=0.7, with_entropy=False)
        ref = engine.ref_log_probs(batch, temperature=0.7)
        policy, _ = engine.log_probs(batch, temperature=0.7)  # the adapters are on again after it
    torch.testing.assert_close(ref[mask], base[mask], rtol=0, atol=1e-10)
    assert float((policy - base)[mask].abs().max()) > 1e-2


def test_a_lora_engine_with_a_kl_term_loads_no_reference_copy(tiny_model_dir):
    from dapo_cli import components
    from dapo_cli.config.schema import EngineConfig, LoraConfig
    from dapo_cli.engine.dist import SingleProcess
    from dapo_cli.models import load_policy

    def load_reference():
        raise AssertionError("a LoRA run's reference is its base: no copy is loaded")

    engine = components.build_training_engine(
        EngineConfig(device="cpu"), load_policy(tiny_model_dir)[0], SingleProcess(), lr=1e-2, weight_decay=0.0, warmup_steps=0,
        grad_clip=1.0, bf16=False, load_reference=load_reference, lora=LoraConfig(rank=RANK, alpha=ALPHA),
    )
    assert engine.base_reference and engine.ref_model is None


def test_gradient_checkpointing_still_gives_the_adapters_their_gradient(tiny_model_dir):
    # the embeddings are frozen: under reentrant checkpointing (transformers 4.x's default) the blocks would
    # see inputs without grad and give the adapters none unless input grads are enabled (LoraAdapters does;
    # transformers 5's gradient_checkpointing_enable does it too). Same gradients as without checkpointing.
    from dapo_cli.engine.lora import LoraAdapters
    from dapo_cli.models import load_policy

    rows = ragged_rows()
    batch = batch_of((rows[0].clamp(max=30), rows[1], rows[2].clamp(max=30), rows[3]))  # within the char vocabulary
    grads = {}
    for mode in ("off", "default", "reentrant"):
        model = load_policy(tiny_model_dir)[0]
        if mode != "off":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True} if mode == "reentrant" else None)
        torch.manual_seed(0)  # the same adapter init
        adapters = LoraAdapters(model, rank=RANK, alpha=ALPHA, target_modules=["all-linear"], dropout=0.0)
        with torch.no_grad():  # B non-zero, so A gets a gradient too
            for layer in adapters.layers().values():
                layer.lora_B["default"].weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
        engine = TorchEngine(model, lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=1.0, adapters=adapters,
                             shared_prompt_forward=False)  # the model's own forward in every mode (checkpointing needs it)
        engine.backward(engine_loss(engine, batch))
        grads[mode] = {k: p.grad for k, p in model.named_parameters() if p.requires_grad}
    assert len(grads["off"]) == 2 * 2 * len(PROJECTIONS)
    for key, g in grads["off"].items():
        assert float(g.norm()) > 0, key
        for mode in ("default", "reentrant"):
            assert grads[mode][key] is not None, (mode, key)
            torch.testing.assert_close(grads[mode][key], g, rtol=1e-6, atol=1e-9, msg=f"{mode} {key}")
