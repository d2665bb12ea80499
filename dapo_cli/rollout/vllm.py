"""Rollouts on vLLM, on any platform vLLM runs on: CUDA GPUs or vLLM's CPU build (the only module that imports vllm).

The engine is colocated with training: it runs in the training processes, taking
``rollout.gpu_memory_utilization`` of each GPU's memory (on vLLM's CPU platform: of the CPU memory
of the NUMA node it runs on, where the KV cache lives). Between generation phases it sleeps
(``rollout.sleep_level`` 1: weights offloaded and KV cache dropped; 2: both dropped) so the update has
the memory, and wakes before the next sync and generate. Where the platform has no sleep mode
(vLLM's CPU build), it stays awake and says so once.

- Platform: read from vLLM itself (``vllm.platforms.current_platform``), never from ``torch.cuda``.
  On the CPU platform the engine runs eager (torch.compile's warm-up costs more than it saves at
  these sizes), prefills are never chunked (a chunked prefill rewinds the request's seeded
  generator, which CPU generators refuse: "CPU Generator does not use offset"), and the torch
  thread count and ``torch.set_num_threads`` that vLLM's CPU worker replaces are given back to
  the trainer that shares the process.
- Weights: :meth:`VLLMRolloutEngine.sync_weights` passes ``engine.export_weights()`` (any training
  engine, ZeRO-3 included) to vLLM's in-place reload (``collective_rpc("reload_weights")``), which
  loads them in checkpoint format and re-runs the platform's weight processing (the CPU backend
  repacks linear weights into its own kernel layout); no disk round trip. vLLM runs in-process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; one process: the ``uni`` executor; under torchrun:
  ``external_launcher``, tensor-parallel groups of ``rollout.tensor_parallel_size`` consecutive
  ranks, the groups vLLM's data-parallel ranks).
- Tensor parallelism under torchrun: the ranks of one TP group drive one engine in lockstep, so
  they must submit the same requests: each rank gathers its group's prompts, the engine
  generates for all of them, and each rank keeps its own.
- Seeds: every prompt gets its own seed (:func:`request_seed`: a hash of ``params.seed`` and the prompt's
  index), so a run replays. vLLM gives sample ``j`` of a request ``seed + j``: seeds ``params.seed + i``
  would hand prompt ``i + 1``'s sample ``j`` the stream of prompt ``i``'s sample ``j + 1``.
  Greedy decoding (temperature 0) asks vLLM for one completion per prompt (vLLM refuses ``n > 1``
  there) and repeats it ``n`` times: every greedy sample is the same sequence.
- Log-probs: ``logprobs_mode="processed_logprobs"`` with ``logprobs=0`` returns log π of each
  sampled token after temperature (and after top-k/top-p, which training rollouts leave off, see
  ``dapo lint``), the same quantity :class:`~dapo_cli.rollout.hf.HFRolloutEngine` returns and
  the trainer compares with its own (``rollout/logprob_diff_*``).
- Texts: decoded by the project's tokenizer (``skip_special_tokens=True``), as every engine does.

Tested on vLLM's CPU build in ``make test`` (``.venv-vllm``: ``tests/rollout/test_rollout_conformance.py``,
``tests/rollout/test_rollout_vllm.py``, ``tests/e2e/test_e2e_vllm.py``); on GPUs by ``make gpu-check``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dapo_cli.rollout.base import Rollouts, SamplingParams, WeightSource

if TYPE_CHECKING:
    from dapo_cli.engine.dist import Collective

CPU_MIN_BATCHED_TOKENS = 16384
"""Token budget of one scheduler step on the CPU platform (or ``max_model_len`` if longer): with
chunked prefill off, a prompt that does not fit waits for the next step instead of being cut."""


def request_seed(seed: int, index: int) -> int:
    """The vLLM seed of prompt ``index`` of a call sampled under ``seed``: 62 bits of a hash, so the
    ``n`` consecutive seeds vLLM gives its samples (``seed + j``) overlap no other prompt's."""
    digest = hashlib.sha256(f"dapo-vllm\0{seed}\0{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


def vllm_environment() -> None:
    """Settings vLLM reads when it is first imported (each only where the user set nothing): in-process
    engines (the weights sync in memory), and its log on stderr at WARNING: vLLM logs to stdout by
    default, where ``dapo eval --json`` writes its one JSON object, and its INFO lines would bury the run's."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@functools.cache
def platform_info() -> dict[str, Any]:
    """What vLLM's own platform detection says (imports ``vllm.platforms``, ~6 s cold):
    ``runs`` (vLLM found a platform: a GPU, or this is its CPU build), ``name``, ``cpu``, ``sleep_mode``."""
    vllm_environment()
    from vllm.platforms import current_platform

    return {
        "runs": not current_platform.is_unspecified(),
        "name": str(current_platform.device_name or current_platform.device_type or "unspecified"),
        "cpu": bool(current_platform.is_cpu()),
        "sleep_mode": bool(current_platform.is_sleep_mode_available()),
    }


class VLLMRolloutEngine:
    """:class:`~dapo_cli.rollout.base.RolloutEngine` on ``vllm.LLM``.

    ``note``: called once with each thing the user should know about how the engine runs here
    (e.g. no sleep mode on this platform)."""

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
        dist: Collective | None = None,
        note: Callable[[str], None] | None = None,
    ) -> None:
        vllm_environment()
        from vllm import LLM

        self.tokenizer = tokenizer
        self.platform = platform_info()
        self.world_size = dist.world_size if dist is not None else 1
        self.rank = dist.rank if dist is not None else 0
        self.tp = tensor_parallel_size
        if self.world_size % self.tp:
            raise ValueError(f"rollout.tensor_parallel_size={self.tp} does not divide the world size {self.world_size}")
        if sleep_level > 0 and not self.platform["sleep_mode"] and note is not None:
            note(
                f"vLLM's {self.platform['name']} platform has no sleep mode: the rollout engine stays awake "
                f"during the update (rollout.sleep_level={sleep_level} acts as 0)"
            )
        self.sleep_level = sleep_level if self.platform["sleep_mode"] else 0
        self.lockstep = self.world_size > 1  # vLLM's data-parallel ranks step together (dummy batches when idle)
        self._tp_group = None
        if self.world_size > 1 and self.tp > 1:
            import torch.distributed as tdist

            groups = [tdist.new_group(list(range(g, g + self.tp))) for g in range(0, self.world_size, self.tp)]
            self._tp_group = groups[self.rank // self.tp]
        backend = "external_launcher" if self.world_size > 1 else ("uni" if self.tp == 1 else "mp")
        extra: dict[str, Any] = {}
        if self.world_size > 1:
            extra["data_parallel_size"] = self.world_size // self.tp  # vLLM's world = TP x DP = torchrun's
        if self.platform["cpu"]:
            extra.update(
                enforce_eager=True, enable_chunked_prefill=False,
                max_num_batched_tokens=max(CPU_MIN_BATCHED_TOKENS, max_model_len or 0),
            )
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        try:
            self.llm = LLM(
                model=str(model_path),
                tokenizer=str(model_path),
                gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tensor_parallel_size,
                distributed_executor_backend=backend,
                enable_sleep_mode=self.sleep_level > 0,
                max_model_len=max_model_len,
                dtype=dtype,
                seed=seed,
                logprobs_mode="processed_logprobs",
                enable_prefix_caching=True,
                **extra,
            )
        finally:  # vLLM's CPU worker replaces torch.set_num_threads process-wide and drops to one thread
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        # every reload warns that RotaryEmbedding has no weights to load (it has a computed cache only); set
        # after LLM(...), whose logging set-up (dictConfig) resets the levels of vLLM's child loggers
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        self.asleep = False

    seeds_per_prompt = False
    """Request seeds hash (seed, the prompt's index in the call): ranks need seeds of their own."""

    def check_prompts(self, prompts: Sequence[str], max_tokens: int) -> None:
        """Nothing here: vLLM checks every request against its ``max_model_len`` in :meth:`generate`."""

    # ------------------------------------------------------------ memory and weights

    def sleep(self) -> None:
        if self.sleep_level > 0 and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Shut vLLM's engine core down now (KV cache, its process groups), while the trainer's process
        group still exists: left to interpreter exit, vLLM's finaliser tears down groups already gone."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None

    @torch.no_grad()
    def sync_weights(self, source: WeightSource) -> None:
        """Every ``(name, tensor)`` of ``source.export_weights()`` into vLLM's model, in place.

        vLLM's ``reload_weights`` takes checkpoint-format names (those ``save_pretrained`` writes),
        loads them through each layer's weight loader and re-runs the platform's processing, so a
        backend that repacks weights after loading (the CPU one does) serves the new values."""
        weights = [(name, tensor.detach()) for name, tensor in source.export_weights()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    # ------------------------------------------------------------ generation

    def generate(self, prompts: Sequence[str], n: int, params: SamplingParams) -> Rollouts:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        if n < 1 or not prompts:
            raise ValueError("generate needs at least one prompt and n >= 1")
        own = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        base_seed = params.seed if params.seed is not None else 0
        everyone, mine = self._group_prompts([(request_seed(base_seed, i), ids) for i, ids in enumerate(own)])
        greedy = params.temperature == 0.0
        requests, settings = [], []
        for seed, ids in everyone:
            requests.append(TokensPrompt(prompt_token_ids=ids))
            settings.append(VSamplingParams(
                n=1 if greedy else n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                max_tokens=params.max_tokens, seed=seed, logprobs=0 if params.logprobs else None, detokenize=False,
            ))
        outputs = self.llm.generate(requests, settings, use_tqdm=False)
        completions = [list(outputs[i].outputs) * n if greedy else list(outputs[i].outputs[:n]) for i in mine]
        return self._to_rollouts(completions, own, n, params.logprobs)

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

    def _to_rollouts(self, completions: list[list[Any]], prompt_ids: list[list[int]], n: int, want_logprobs: bool) -> Rollouts:
        """``completions[p]``: the ``n`` vLLM completions of prompt ``p``, as one :class:`Rollouts`."""
        pad = int(self.tokenizer.pad_token_id)
        s = max(len(p) for p in prompt_ids)
        rows = [comp for group in completions for comp in group]
        t = max(1, max((len(c.token_ids) for c in rows), default=0))
        N = len(rows)
        p_ids = torch.full((N, s), pad, dtype=torch.long)
        p_mask = torch.zeros(N, s, dtype=torch.bool)
        r_ids = torch.full((N, t), pad, dtype=torch.long)
        r_mask = torch.zeros(N, t, dtype=torch.bool)
        logprobs = torch.zeros(N, t) if want_logprobs else None
        truncated = torch.zeros(N, dtype=torch.bool)
        responses = []
        for i, comp in enumerate(rows):
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
            responses.append(ids)
        return Rollouts(
            prompt_ids=p_ids, prompt_mask=p_mask, response_ids=r_ids, response_mask=r_mask,
            lengths=r_mask.sum(-1), truncated=truncated,
            texts=self.tokenizer.batch_decode(responses, skip_special_tokens=True),
            prompt_index=torch.arange(len(completions)).repeat_interleave(n), logprobs=logprobs,
        )


def load_vllm_engine(model: str, **kwargs: Any) -> tuple[VLLMRolloutEngine, Any]:
    """``dapo eval --engine vllm``: an engine on a checkpoint dir or hub id, and its tokenizer."""
    from dapo_cli.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model)
    kwargs.setdefault("sleep_level", 0)
    # like the fast and hf engines: float32 on CPU (vLLM's "auto" may pick another dtype), the model's own on GPUs
    kwargs.setdefault("dtype", "float32" if platform_info()["cpu"] else "auto")
    return VLLMRolloutEngine(model, tokenizer, **kwargs), tokenizer
