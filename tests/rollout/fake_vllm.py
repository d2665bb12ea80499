"""A fake ``vllm`` package for tests that need no vLLM: ``LLM`` on a real (tiny) torch policy, with vLLM 0.32's
sleep levels and wake-up tags modelled exactly, so the real :class:`~dapo_cli.rollout.vllm.VLLMRolloutEngine`
(and the real training loop on it) runs in ``.venv``.

What it models, from vLLM 0.32's source (``v1/executor/abstract.py``, ``v1/worker/gpu_worker.py``,
``v1/engine/core.py``):

- ``sleep(level=1)``: the weights are copied off the device and their device memory released; ``sleep(level=2)``:
  released without a copy. Either level drops the KV cache. The executor's sleeping tags become
  ``{"weights", "kv_cache"}``; sleeping again warns and does nothing.
- ``wake_up(tags=None | [...])``: maps the tagged memory back (tags ``"weights"``, ``"kv_cache"``). Waking
  weights slept at level 2 maps back uninitialised memory: here the weights become garbage, and sampling
  with them raises (:class:`SampledDiscardedWeights`) until a ``reload_weights`` loads every parameter. A tag
  that is not sleeping makes vLLM warn and wake nothing. The scheduler resumes only once nothing sleeps:
  generating before that raises.
- ``collective_rpc("reload_weights", kwargs={"weights_iterator": it})``: consumed lazily, one pair at a time
  (as the layer-wise reload's ``model.load_weights`` does); into weights that sleep, it raises (on a GPU the
  memory is unmapped). It records how many tensors it received are still referenced elsewhere when the next
  arrives (:attr:`FakeLLM.max_alive`), the dtypes received, and warns on vLLM's reload logger for each module
  that loaded nothing ("<Module>: Failed to load weights"), and once for the rotary embedding, as vLLM does.
- ``generate``: samples with the torch policy (seeded per request and sample), or takes the tokens
  :attr:`FakeLLM.script` gives; the log-probs are the policy's, after temperature, at the served dtype, plus
  :attr:`FakeLLM.logprob_shift` (a test's corruption).
"""

from __future__ import annotations

import logging
import sys
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class SampledDiscardedWeights(RuntimeError):
    """Sampling from weights a level-2 sleep discarded (uninitialised memory on a GPU)."""


class Platform:
    def __init__(self, device: str, sleep_mode: bool) -> None:
        self.device_type = device
        self.device_name = f"fake-{device}"
        self.sleep_mode = sleep_mode

    def is_unspecified(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return self.device_type == "cpu"

    def is_sleep_mode_available(self) -> bool:
        return self.sleep_mode


class SamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def TokensPrompt(prompt_token_ids: list[int]) -> dict[str, Any]:  # noqa: N802 (vLLM's name)
    return {"prompt_token_ids": list(prompt_token_ids)}


@dataclass
class Logprob:
    logprob: float


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str


@dataclass
class RequestOutput:
    outputs: list[Completion]


@dataclass
class EngineCore:
    closed: bool = False

    def shutdown(self) -> None:
        self.closed = True


@dataclass
class ModelConfig:
    dtype: torch.dtype


@dataclass
class LLMEngine:
    model_config: ModelConfig
    engine_core: EngineCore = field(default_factory=EngineCore)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": torch.float32}


class FakeLLM:
    """``vllm.LLM`` on the policy folder ``model`` (see the module's docstring)."""

    instances: list[FakeLLM] = []
    """Every engine made since :func:`install` (its test's)."""

    def __init__(self, model: str, *, dtype: str = "auto", enable_sleep_mode: bool = False, **kwargs: Any) -> None:
        from dapo_cli.models import load_policy

        self.kwargs = {"model": model, "dtype": dtype, "enable_sleep_mode": enable_sleep_mode, **kwargs}
        self.dtype = DTYPES[dtype]
        self.model, self.tokenizer = load_policy(model, dtype=self.dtype)
        self.model.eval()
        self.llm_engine = LLMEngine(ModelConfig(self.dtype))
        self.enable_sleep_mode = enable_sleep_mode
        self.sleeping: set[str] = set()
        self.weights = "resident"
        """resident | offloaded (level 1) | discarded (level 2) | garbage (woken after level 2, not reloaded)"""
        self.backup: dict[str, torch.Tensor] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.warnings: list[str] = []
        self.max_alive = 0
        self.received_dtypes: set[torch.dtype] = set()
        self.logprob_shift = 0.0
        self.script: Callable[[str, int], str] | None = None
        """(prompt text, sample index) -> the response text to return instead of sampling."""
        FakeLLM.instances.append(self)

    # ------------------------------------------------------------ memory

    def params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self.model.named_parameters())

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(("sleep", level))
        assert self.enable_sleep_mode, "vLLM raises: sleep mode is not enabled"
        if "weights" in self.sleeping:
            self.warnings.append("Executor is already sleeping.")
            return
        with torch.no_grad():
            if level == 1:
                self.backup = {n: p.detach().clone() for n, p in self.params().items()}
            for p in self.params().values():
                p.fill_(float("nan"))  # the device memory is released
        self.weights = "offloaded" if level == 1 else "discarded"
        self.sleeping = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", tuple(tags) if tags is not None else None))
        if not self.sleeping:
            self.warnings.append("Executor is not sleeping.")
            return True
        if tags and any(t not in self.sleeping for t in tags):
            self.warnings.append(f"Tag {tags} is not in sleeping tags {self.sleeping}")
            return not self.sleeping
        waking = set(tags) if tags else set(self.sleeping)
        if "weights" in waking:
            with torch.no_grad():
                if self.weights == "offloaded":
                    for n, p in self.params().items():
                        p.copy_(self.backup[n])
                    self.backup = {}
                    self.weights = "resident"
                else:  # level 2: the memory is mapped again, its content is whatever it holds
                    for p in self.params().values():
                        p.normal_(0.0, 50.0)
                    self.weights = "garbage"
        self.sleeping -= waking
        return not self.sleeping

    def reset_prefix_cache(self) -> bool:
        self.calls.append(("reset_prefix_cache",))
        return True

    # ------------------------------------------------------------ weights

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None) -> list:
        assert method == "reload_weights", method
        self.calls.append(("reload_weights",))
        self.reload_weights(**(kwargs or {}))
        return [None]

    @torch.no_grad()
    def reload_weights(self, weights_iterator: Any) -> None:
        if "weights" in self.sleeping:
            raise RuntimeError("reload_weights into weights that sleep (their device memory is unmapped)")
        params = self.params()
        received: list[weakref.ref] = []
        loaded: set[str] = set()
        for name, tensor in weights_iterator:  # lazily, one pair at a time
            self.max_alive = max(self.max_alive, 1 + sum(ref() is not None for ref in received))
            if name not in params:
                if name == "lm_head.weight" and "model.embed_tokens.weight" in loaded:  # tied: one tensor
                    continue
                raise KeyError(f"fake vLLM: no parameter {name}")
            self.received_dtypes.add(tensor.dtype)
            params[name].copy_(tensor)
            loaded.add(name)
            received.append(weakref.ref(tensor))
            del tensor
        log = logging.getLogger(RELOAD_LOGGER)
        log.warning("%s: Failed to load weights", "RotaryEmbedding")  # vLLM says it on every reload
        missing = sorted(set(params) - loaded)
        for name in missing:
            log.warning("%s: Failed to load weights", name)
        if not missing:
            self.weights = "resident"

    # ------------------------------------------------------------ generation

    @torch.no_grad()
    def generate(self, requests: list[dict[str, Any]], settings: list[SamplingParams], use_tqdm: bool = False) -> list[RequestOutput]:
        self.calls.append(("generate", len(requests)))
        if self.sleeping:
            raise RuntimeError(f"generate while {sorted(self.sleeping)} sleep: vLLM's scheduler is paused")
        if self.weights != "resident":
            raise SampledDiscardedWeights(f"sampling from weights that are {self.weights}: vLLM discarded them on sleep")
        return [RequestOutput([self.complete(req["prompt_token_ids"], s, j) for j in range(s.n)]) for req, s in zip(requests, settings)]

    def complete(self, prompt: list[int], s: SamplingParams, j: int) -> Completion:
        eos = self.tokenizer.eos_token_id
        temperature = s.temperature if s.temperature > 0 else 1.0
        if self.script is not None:
            text = self.script(self.tokenizer.decode(prompt), j)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][: s.max_tokens - 1] + [eos]
        else:
            gen = torch.Generator().manual_seed(int(s.seed) + j)
            ids = []
            for _ in range(s.max_tokens):
                logits = self.model(torch.tensor([prompt + ids])).logits[0, -1].float()
                token = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)) if s.temperature > 0 else int(logits.argmax())
                ids.append(token)
                if token == eos:
                    break
        logits = self.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
        logp = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0] + self.logprob_shift
        logprobs = [{tok: Logprob(float(v))} for tok, v in zip(ids, logp)] if s.logprobs is not None else None
        return Completion(ids, logprobs, "stop" if ids and ids[-1] == eos else "length")


def install(monkeypatch: Any, *, device: str = "cuda", sleep_mode: bool = True) -> type[FakeLLM]:
    """Put the fake ``vllm`` (with ``device``'s platform) in ``sys.modules`` for this test; returns :class:`FakeLLM`."""
    from dapo_cli.rollout import vllm as vllm_rollout

    root = types.ModuleType("vllm")
    root.LLM = FakeLLM
    root.SamplingParams = SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = TokensPrompt
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = Platform(device, sleep_mode)
    root.inputs, root.platforms = inputs, platforms
    for name, module in (("vllm", root), ("vllm.inputs", inputs), ("vllm.platforms", platforms)):
        monkeypatch.setitem(sys.modules, name, module)
    for name, value in (("VLLM_ENABLE_V1_MULTIPROCESSING", "0"), ("VLLM_LOGGING_STREAM", "ext://sys.stderr"),
                        ("VLLM_LOGGING_LEVEL", "WARNING")):
        monkeypatch.setenv(name, value)  # what vllm_environment sets, undone after the test
    info = vllm_rollout.platform_info
    if hasattr(info, "cache_clear"):  # the real one, cached: the fake's platform must not outlive the test
        info.cache_clear()
        monkeypatch.setattr(vllm_rollout, "platform_info", info.__wrapped__)
    FakeLLM.instances = []
    return FakeLLM
