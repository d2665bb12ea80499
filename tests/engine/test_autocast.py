"""``engine.autocast``: the trainer's forwards in bfloat16 mixed precision (``forward.PolicyLogProbs``).

What must hold: the matmuls really run in bfloat16 (log-probs move by bfloat16 rounding, ~1e-3,
not by 0 and not by more than a few 1e-2 on these random models); parameters, gradients and the
optimizer stay float32; the shared-prompt and plain forwards still compute the same function (to
bfloat16 rounding: their matmuls see the same rows in other groupings); a setting that cannot
work is refused before anything loads.
"""

from __future__ import annotations

import pytest
import torch

from dapo_cli.config import load_config
from dapo_cli.engine.forward import PolicyLogProbs
from dapo_cli.engine.torch import TorchEngine
from dapo_cli.errors import UserError

from test_shared_prompt_forward import CHUNK, batch_of, build, forward_and_grads, ragged_rows


@pytest.mark.parametrize("shared", [True, False])
def test_bfloat16_autocast_moves_log_probs_by_bfloat16_rounding_only(shared):
    model = build("qwen2-bias-untied-gqa")
    rows = ragged_rows()
    mask = rows[3]
    with torch.no_grad():
        full, full_ent = PolicyLogProbs(model, shared_prompt=shared, chunk=CHUNK)(*rows, temperature=0.7, with_entropy=True)
        mixed, mixed_ent = PolicyLogProbs(model, shared_prompt=shared, chunk=CHUNK, autocast="bfloat16")(
            *rows, temperature=0.7, with_entropy=True
        )
    assert mixed.dtype == mixed_ent.dtype == torch.float32  # the log-softmax of the logits runs in float32
    diff = (mixed - full)[mask].abs()
    # bfloat16 keeps 8 significant bits (relative rounding 2^-9 ≈ 2e-3 per matmul output): the log-probs
    # move, on average by about that, and nowhere by anything like a wrong computation would
    assert 1e-4 < float(diff.mean()) < 1e-2 and float(diff.max()) < 5e-2
    assert float((mixed_ent - full_ent)[mask].abs().max()) < 5e-2


def test_shared_and_plain_forwards_agree_under_autocast():
    model = build("llama-tied-gqa")
    rows = ragged_rows()
    mixed = {s: PolicyLogProbs(model, shared_prompt=s, chunk=CHUNK, autocast="bfloat16") for s in (True, False)}
    assert mixed[True].uses_shared_prompt() and not mixed[False].uses_shared_prompt()
    lp = {s: forward_and_grads(lambda m, *r, chunk, **k: mixed[s](*r, **k), model, rows) for s in (True, False)}
    mask = rows[3]
    assert float((lp[True][0] - lp[False][0])[mask].abs().max()) < 5e-2
    for key, g in lp[False][2].items():
        assert g.dtype == torch.float32, key
        assert float((lp[True][2][key] - g).norm()) <= 0.1 * float(g.norm()), key


def test_the_engine_keeps_float32_parameters_gradients_and_optimizer_state():
    engine = TorchEngine(build("qwen2-bias-tied"), lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=1.0,
                         autocast="bfloat16")
    batch = batch_of(ragged_rows())
    before = {k: p.detach().clone() for k, p in engine.module.named_parameters()}
    logp, _ = engine.log_probs(batch, temperature=1.0)
    engine.backward(-(logp * batch.advantages[:, None] * batch.loss_mask).sum() / batch.loss_mask.sum())
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in engine.module.parameters())
    norm, applied = engine.step()
    assert applied and norm > 0
    for key, p in engine.module.named_parameters():
        assert p.dtype == torch.float32 and not torch.equal(p, before[key]), key
    assert all(v.dtype == torch.float32 for s in engine.optimizer.state.values() for v in s.values() if v.dim())


def test_an_unknown_autocast_dtype_is_refused():
    with pytest.raises(ValueError, match="autocast must be one of none, bfloat16"):
        PolicyLogProbs(build("llama-untied"), shared_prompt=True, chunk=CHUNK, autocast="float16")
    with pytest.raises(UserError, match="engine.autocast"):
        load_config(None, ["engine.autocast=float16"])


def test_deepspeed_is_pointed_to_its_own_bf16_mode():
    # a config-only contradiction: refused when the config loads (dapo train, lint, ablate, --dry-run)
    with pytest.raises(UserError, match="with DeepSpeed set model.dtype=bfloat16"):
        load_config(None, ["engine.name=deepspeed", "engine.autocast=bfloat16"])
