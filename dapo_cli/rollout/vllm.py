"""Rollouts on vLLM (GPU only; the only module that imports vllm).

The engine is colocated with training: it runs in the training processes, on the same GPUs,
taking ``rollout.gpu_memory_utilization`` of each GPU's memory; between generation phases it
sleeps (``rollout.sleep_level`` 1: weights offloaded to CPU and KV cache dropped; 2: both
dropped) so the update has the memory, and wakes before the next sync and generate.

- Weights: :meth:`VLLMRolloutEngine.sync_weights` streams ``engine.export_weights()`` (any
  training engine, ZeRO-3 included) into vLLM's model in memory (``load_weights``); no disk
  round trip. vLLM runs in-process for that (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; one process:
  the ``uni`` executor; under torchrun: ``external_launcher``, one engine per rank, tensor-parallel
  groups of ``rollout.tensor_parallel_size`` consecutive ranks).
- Tensor parallelism under torchrun: the ranks of one TP group drive one engine in lockstep, so
  they must submit the same requests: each rank gathers its group's prompts, the engine
  generates for all of them, and each rank keeps its own.
- Seeds: every prompt gets its own ``seed`` (``params.seed + prompt index``), so a run replays.
- Log-probs: ``logprobs_mode="processed_logprobs"`` with ``logprobs=0`` returns log π of each
  sampled token after temperature (and after top-k/top-p, which training rollouts leave off, see
  ``dapo lint``), the same quantity :class:`~dapo_cli.rollout.hf.HFRolloutEngine` returns and
  the trainer compares with its own (``rollout/logprob_diff_*``).

Tested only where a GPU is present (``tests/rollout/test_rollout_conformance.py``, ``make gpu-check``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dapo_cli.rollout.base import Rollouts, SamplingParams, WeightSource


class VLLMRolloutEngine:
    """:class:`~dapo_cli.rollout.base.RolloutEngine` on ``vllm.LLM``."""

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: Any,
        *,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        sleep_level: int = 1,
        max_model_len: int | None = None,
        dtype: str = "auto",
        seed: int = 0,
        dist: Any = None,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: weights sync in memory
        from vllm import LLM

        self.tokenizer = tokenizer
        self.sleep_level = sleep_level
        self.world_size = getattr(dist, "world_size", 1)
        self.rank = getattr(dist, "rank", 0)
        self.tp = tensor_parallel_size
        if self.world_size % self.tp:
            raise ValueError(f"rollout.tensor_parallel_size={self.tp} does not divide the world size {self.world_size}")
        self._tp_group = None
        if self.world_size > 1 and self.tp > 1:
            import torch.distributed as tdist

            groups = [tdist.new_group(list(range(g, g + self.tp))) for g in range(0, self.world_size, self.tp)]
            self._tp_group = groups[self.rank // self.tp]
        backend = "external_launcher" if self.world_size > 1 else ("uni" if self.tp == 1 else "mp")
        self.llm = LLM(
            model=str(model_path),
            tokenizer=str(model_path),
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            distributed_executor_backend=backend,
            enable_sleep_mode=sleep_level > 0,
            max_model_len=max_model_len,
            dtype=dtype,
            seed=seed,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
        )
        self.asleep = False

    # ------------------------------------------------------------ memory and weights

    def sleep(self) -> None:
        if self.sleep_level > 0 and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    @torch.no_grad()
    def sync_weights(self, source: WeightSource) -> None:
        """Stream every ``(name, tensor)`` of ``source.export_weights()`` into vLLM's model."""
        weights = ((name, tensor) for name, tensor in source.export_weights())

        def load(model: torch.nn.Module) -> int:
            return len(model.load_weights(weights))

        self.llm.apply_model(load)
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    # ------------------------------------------------------------ generation

    def generate(self, prompts: Sequence[str], n: int, params: SamplingParams) -> Rollouts:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        if n < 1 or not prompts:
            raise ValueError("generate needs at least one prompt and n >= 1")
        own = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        base_seed = params.seed if params.seed is not None else 0
        everyone, mine = self._group_prompts([(base_seed + i, ids) for i, ids in enumerate(own)])
        requests, settings = [], []
        for seed, ids in everyone:
            requests.append(TokensPrompt(prompt_token_ids=ids))
            settings.append(VSamplingParams(
                n=n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                max_tokens=params.max_tokens, seed=seed, logprobs=0 if params.logprobs else None,
                skip_special_tokens=True, detokenize=True,
            ))
        outputs = self.llm.generate(requests, settings, use_tqdm=False)
        return self._to_rollouts([outputs[i] for i in mine], own, n, params.logprobs)

    def _group_prompts(self, own: list[tuple[int, list[int]]]) -> tuple[list[tuple[int, list[int]]], list[int]]:
        """Every ``(seed, prompt ids)`` request of this rank's TP group (rank order), and the positions of ours.

        The ranks of a group drive one engine, so they submit the same requests with the same seeds."""
        if self._tp_group is None:
            return own, list(range(len(own)))
        import torch.distributed as tdist

        parts: list[Any] = [None] * self.tp
        tdist.all_gather_object(parts, (self.rank, own), group=self._tp_group)
        everyone: list[tuple[int, list[int]]] = []
        mine: list[int] = []
        for rank, requests in sorted(parts, key=lambda p: p[0]):
            for request in requests:
                if rank == self.rank:
                    mine.append(len(everyone))
                everyone.append(request)
        return everyone, mine

    def _to_rollouts(self, outputs: list[Any], prompt_ids: list[list[int]], n: int, want_logprobs: bool) -> Rollouts:
        pad = int(self.tokenizer.pad_token_id)
        s = max(len(p) for p in prompt_ids)
        rows = [(out, comp) for out in outputs for comp in out.outputs[:n]]
        t = max((len(c.token_ids) for _, c in rows), default=0)
        t = max(t, 1)
        N = len(rows)
        p_ids = torch.full((N, s), pad, dtype=torch.long)
        p_mask = torch.zeros(N, s, dtype=torch.bool)
        r_ids = torch.full((N, t), pad, dtype=torch.long)
        r_mask = torch.zeros(N, t, dtype=torch.bool)
        logprobs = torch.zeros(N, t) if want_logprobs else None
        truncated = torch.zeros(N, dtype=torch.bool)
        texts = []
        for i, (_, comp) in enumerate(rows):
            prompt = prompt_ids[i // n]
            p_ids[i, s - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            p_mask[i, s - len(prompt) :] = True
            ids = list(comp.token_ids)
            if ids:
                r_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                r_mask[i, : len(ids)] = True
            if logprobs is not None and comp.logprobs:
                logprobs[i, : len(ids)] = torch.tensor([step[tok].logprob for step, tok in zip(comp.logprobs, ids)])
            truncated[i] = comp.finish_reason == "length"
            texts.append(comp.text)
        return Rollouts(
            prompt_ids=p_ids, prompt_mask=p_mask, response_ids=r_ids, response_mask=r_mask,
            lengths=r_mask.sum(-1), truncated=truncated, texts=texts,
            prompt_index=torch.arange(len(outputs)).repeat_interleave(n), logprobs=logprobs,
        )


def load_vllm_engine(model: str, **kwargs: Any) -> tuple[VLLMRolloutEngine, Any]:
    """``dapo eval --engine vllm``: an engine on a checkpoint dir or hub id, and its tokenizer."""
    from dapo_cli.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model)
    kwargs.setdefault("sleep_level", 0)
    return VLLMRolloutEngine(model, tokenizer, **kwargs), tokenizer
