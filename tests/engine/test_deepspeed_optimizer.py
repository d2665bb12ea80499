"""``engine.optimizer``: which AdamW each DeepSpeed config steps, what validation refuses, and the one-line
error when DeepSpeed cannot build its fused optimizer (issue 52, item 4: nothing compiled unless asked)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from dapo_cli.config import load_config
from dapo_cli.config.validate import engine_problems
from dapo_cli.engine.deepspeed import build_optimizer, deepspeed_config, optimizer_choice
from dapo_cli.errors import UserError

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


@pytest.mark.parametrize(
    ("name", "device", "offload", "expected"),
    [
        ("torch", "cuda", False, ("torch.optim.AdamW", {"fused": True})),  # states on the GPU: torch's fused kernel
        ("torch", "cuda", True, ("torch.optim.AdamW", {})),  # offloaded states are CPU tensors: torch's default
        ("torch", "cpu", False, ("torch.optim.AdamW", {})),
        ("fused_adam", "cuda", False, ("FusedAdam", {"adam_w_mode": True})),
        ("cpu_adam", "cuda", True, ("DeepSpeedCPUAdam", {"adamw_mode": True})),
    ],
)
def test_each_config_gets_its_optimizer(name, device, offload, expected):
    assert optimizer_choice(name, device_type=device, offload_optimizer=offload) == expected


def test_the_default_is_torch_adamw_and_the_deepspeed_config_never_names_an_optimizer():
    # a config "optimizer" would make deepspeed.initialize JIT-build FusedAdam / CPUAdam
    assert load_config(None, []).engine.optimizer == "torch"
    for offload in (False, True):
        cfg = deepspeed_config(zero_stage=3, bf16=True, grad_clip=1.0, offload_optimizer=offload, offload_params=False)
        assert "optimizer" not in cfg


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (["engine.name=torch", "engine.optimizer=fused_adam"], "engine.name=deepspeed"),
        (["engine.name=deepspeed", "engine.optimizer=fused_adam", "engine.offload_optimizer=true"], "engine.optimizer=cpu_adam"),
        (["engine.name=deepspeed", "engine.optimizer=cpu_adam"], "engine.offload_optimizer=true"),
    ],
)
def test_validation_refuses_an_optimizer_that_cannot_step_those_tensors(settings, says):
    problems = [message for _, message in engine_problems(load_config(None, settings).engine)]
    assert len(problems) == 1 and says in problems[0] and "\n" not in problems[0]


def test_validation_accepts_the_combinations_that_run():
    for settings in (["engine.name=deepspeed"], ["engine.name=deepspeed", "engine.offload_optimizer=true"],
                     ["engine.name=deepspeed", "engine.optimizer=fused_adam"],
                     ["engine.name=deepspeed", "engine.optimizer=cpu_adam", "engine.offload_optimizer=true"]):
        assert engine_problems(load_config(None, settings).engine) == []


def test_torch_adamw_is_built_without_deepspeed_ops():
    params = [torch.nn.Parameter(torch.ones(3))]
    opt = build_optimizer("torch", params, lr=0.1, weight_decay=0.0, device_type="cpu", offload_optimizer=False)
    assert type(opt) is torch.optim.AdamW and opt.defaults["lr"] == 0.1 and opt.defaults["betas"] == (0.9, 0.999)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="DeepSpeed is not installed")
def test_a_fused_optimizer_that_cannot_be_built_is_one_line_naming_the_fix(monkeypatch):
    from deepspeed.ops import adam
    from deepspeed.ops.op_builder.builder import MissingCUDAException

    def no_toolkit(*args, **kwargs):  # what FusedAdamBuilder().load() raises on a runtime-only CUDA image
        raise MissingCUDAException("CUDA_HOME does not exist, unable to compile CUDA op(s)")

    monkeypatch.setattr(adam, "FusedAdam", no_toolkit)
    with pytest.raises(UserError) as err:
        build_optimizer("fused_adam", [torch.nn.Parameter(torch.ones(3))], lr=0.1, weight_decay=0.0, device_type="cuda",
                        offload_optimizer=False)
    message = str(err.value)
    assert "\n" not in message and "MissingCUDAException" in message and "engine.optimizer=torch" in message
