"""Rollouts on vLLM, on any platform vLLM runs on: CUDA GPUs or vLLM's CPU build (the only module that imports vllm).

The engine is colocated with training: it runs in the training processes, taking
``rollout.gpu_memory_utilization`` of each GPU's memory. On vLLM's CPU platform the KV cache lives in
the memory of the NUMA node the process runs on, and dapo gives it an explicit size
(:func:`cpu_kv_cache_bytes`: the round's sequences × ``max_model_len`` × the model's KV bytes a token,
capped by what the node has available; ``rollout.kv_cache_gib`` overrides it), because vLLM's own
rule there subtracts the whole process's resident memory, the trainer's included. Between generation phases it sleeps
(``rollout.sleep_level`` 1: weights offloaded and KV cache dropped; 2: both dropped) so the update has
the memory, and wakes before the next sync and generate. It never wakes without weights: at level 2 vLLM
discarded them (its CuMem allocator maps back uninitialised memory), so waking after a step that changed
nothing syncs them again from the training engine. Where the platform has no sleep mode (vLLM's CPU
build), it stays awake and says so once.

- Platform: read from vLLM itself (``vllm.platforms.current_platform``), never from ``torch.cuda``.
  On the CPU platform the engine runs eager (torch.compile's warm-up costs more than it saves at
  these sizes), prefills are never chunked (a chunked prefill rewinds the request's seeded
  generator, which CPU generators refuse: "CPU Generator does not use offset"), and the torch
  thread count and ``torch.set_num_threads`` that vLLM's CPU worker replaces are given back to
  the trainer that shares the process.
- Weights: :meth:`VLLMRolloutEngine.sync_weights` streams ``engine.export_weights()`` (any training
  engine, ZeRO-3 included) into vLLM's in-place reload (``collective_rpc("reload_weights")``), which
  loads them in checkpoint format and re-runs the platform's weight processing (the CPU backend
  repacks linear weights into its own kernel layout); no disk round trip. The pairs go one at a time
  (:func:`stream_weights`: a generator, which crosses ``collective_rpc`` unchanged in-process, where the
  ``uni`` and ``external_launcher`` executors call the worker directly): each tensor is cast to the
  serving dtype as it passes and the trainer's tensor is released before the next is asked for, so the
  sync holds one gathered parameter of the trainer's at a time; vLLM itself buffers the cast tensors
  of one layer until the layer is complete (its layer-wise reload). A sleeping engine wakes its
  weights first, loads, then wakes its KV cache (as verl does), so the KV cache is not mapped while
  the weights stream. vLLM's reload warnings (a layer that loaded nothing keeps its old weights) reach
  the log; the one it gives for rotary embeddings (no weights, by design) is dropped. vLLM runs in-process
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
- Dtype: :func:`serving_dtype` (``rollout.dtype``; auto: bfloat16 on CUDA, the policy's dtype on CPU).
  The trainer's float32 tensors are cast per tensor while they stream.

Tested on vLLM's CPU build in ``make test`` (``.venv-vllm``: ``tests/rollout/test_rollout_conformance.py``,
``tests/rollout/test_rollout_vllm.py``, ``tests/e2e/test_e2e_vllm.py``); on GPUs by ``make gpu-check``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dapo_cli.rollout.base import Rollouts, SamplingParams, WeightSource

if TYPE_CHECKING:
    from dapo_cli.engine.dist import Collective

CPU_BLOCK_TOKENS = 128
"""Tokens per KV-cache block on vLLM's CPU platform (its default for the standard attention backend)."""

CPU_MAX_NUM_SEQS = 256
"""Sequences vLLM's CPU platform runs at once by default (``max_num_seqs`` of the ``LLM`` class)."""

KV_MARGIN = 1.25
"""Head-room on the computed KV-cache size (prefix-cache blocks kept across rounds, rounding)."""

KV_SHARE_OF_AVAILABLE = 0.8
"""The automatic KV-cache size never takes more than this share of the node's available memory: the
trainer beside it still allocates activations and gradients after the engine has started."""

GIB = 2**30

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

CPU_MIN_BATCHED_TOKENS = 16384
"""Token budget of one scheduler step on the CPU platform (or ``max_model_len`` if longer): with
chunked prefill off, a prompt that does not fit waits for the next step instead of being cut."""


def serving_dtype(setting: str, model_dtype: str, device: str) -> str:
    """The dtype vLLM serves the policy in on ``device`` (vLLM's platform: ``"cuda"``, ``"cpu"``, ...):
    ``rollout.dtype`` (``setting``) when set; ``auto``: bfloat16 on a GPU (FlashAttention's dtype, half the
    weights and KV cache of float32, what TRL and verl serve; the trainer's tensors are cast as they stream),
    the policy's own ``model_dtype`` on CPU (vLLM's CPU build: float32 keeps its log-probs at the trainer's)."""
    if setting != "auto":
        return setting
    return model_dtype if device == "cpu" else "bfloat16"


def executor_layout(world_size: int, tensor_parallel_size: int) -> tuple[str, dict[str, Any]]:
    """vLLM's ``distributed_executor_backend`` and the extra ``LLM`` arguments for ``world_size`` processes
    (torchrun's) of ``tensor_parallel_size`` GPUs per engine.

    Under torchrun (``world_size > 1``): ``external_launcher``, the TP groups vLLM's data-parallel ranks
    (``tensor_parallel_size`` must divide the world). One process (``dapo eval``): ``uni`` for one GPU, else
    ``mp``: vLLM starts a worker process per GPU of the engine. Raises ValueError on a TP size that does not fit."""
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size} must be >= 1")
    if world_size > 1:
        if world_size % tensor_parallel_size:
            raise ValueError(f"rollout.tensor_parallel_size={tensor_parallel_size} does not divide the world size {world_size}")
        return "external_launcher", {"data_parallel_size": world_size // tensor_parallel_size}  # vLLM's world = TP x DP
    return ("uni" if tensor_parallel_size == 1 else "mp"), {}


def stream_weights(pairs: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of ``pairs`` one at a time, each a fresh copy in ``dtype`` (on the tensor's device).

    The copy is what vLLM receives (its layer-wise reload keeps a layer's tensors until the layer is
    complete), and the trainer's tensor is released before the next pair is asked for: a ZeRO-3 engine
    gathers each parameter only while it is being yielded, so at most one gathered parameter of the
    trainer's is alive on this side, plus the copies of the layer vLLM is loading."""
    for name, tensor in pairs:
        copy = tensor.detach().to(dtype=dtype, copy=True)
        del tensor  # before the generator is resumed: the producer may gather the next parameter then
        yield name, copy
        del copy


class DropRotaryWarning(logging.Filter):
    """Drops the one warning vLLM's layer-wise reload gives on every sync by design ("RotaryEmbedding: Failed
    to load weights": the layer has a computed cache, no weights); every other reload warning (a layer that
    loaded nothing keeps its old weights) reaches the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.WARNING and ROTARY_WARNING.fullmatch(record.getMessage()) is not None)


ROTARY_WARNING = re.compile(r"\w*RotaryEmbedding: Failed to load weights")


RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
"""The logger of vLLM's layer-wise weight reload (its "Failed to load weights" warning names the layer)."""


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
    ``runs`` (vLLM found a platform: a GPU, or this is its CPU build), ``name``, ``cpu``, ``device`` (``cpu``,
    ``cuda``, ...), ``sleep_mode``."""
    vllm_environment()
    from vllm.platforms import current_platform

    return {
        "runs": not current_platform.is_unspecified(),
        "name": str(current_platform.device_name or current_platform.device_type or "unspecified"),
        "cpu": bool(current_platform.is_cpu()),
        "device": "cpu" if current_platform.is_cpu() else str(current_platform.device_type or "cuda"),
        "sleep_mode": bool(current_platform.is_sleep_mode_available()),
    }


def kv_cache_need(bytes_per_token: int, sequences: int, max_model_len: int, *, margin: float = KV_MARGIN) -> int:
    """Bytes of KV cache for ``sequences`` requests of ``max_model_len`` tokens at once on vLLM's CPU platform.

    .. math:: \\text{need} = \\lceil m \\cdot S \\cdot \\lceil L / B \\rceil B \\cdot b \\rceil

    with ``S`` = ``min(sequences, CPU_MAX_NUM_SEQS)`` (vLLM runs no more at once), ``L`` = ``max_model_len``,
    ``B`` = :data:`CPU_BLOCK_TOKENS`, ``b`` = ``bytes_per_token`` (2 × layers × KV heads × head_dim × dtype
    bytes, :func:`dapo_cli.plan.shape.kv_bytes_per_token`) and ``m`` = ``margin``. One sequence
    (``sequences=1``, ``margin=1``) is the least vLLM starts with."""
    seqs = max(1, min(sequences, CPU_MAX_NUM_SEQS))
    tokens = seqs * math.ceil(max_model_len / CPU_BLOCK_TOKENS) * CPU_BLOCK_TOKENS
    return math.ceil(tokens * bytes_per_token * margin)


def _model_config(model_path: str | Path) -> dict[str, Any] | None:
    """The parsed ``config.json`` of a model folder, or of a hub id in the local Hugging Face cache; None if neither."""
    import json

    from dapo_cli.plan.shape import cached_config

    local = Path(model_path) / "config.json"
    found = local if local.is_file() else cached_config(str(model_path))
    if found is None:
        return None
    try:
        data = json.loads(Path(found).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cpu_kv_cache_bytes(
    model_path: str | Path, *, dtype: str, sequences: int, max_model_len: int | None, kv_cache_gib: float | None,
    memory: Any, note: Callable[[str], None] | None = None,
) -> int | None:
    """The KV-cache size (bytes) dapo gives vLLM on its CPU platform, so it never depends on what else the
    process holds (vLLM's own rule: ``gpu_memory_utilization`` × node memory *minus the process's resident
    memory*, which a trainer in the same process can drive below zero).

    ``kv_cache_gib`` set: that size. Otherwise :func:`kv_cache_need` of the model (its ``config.json``),
    ``sequences`` (the most one generate call submits) and ``max_model_len`` (None: the model's
    ``max_position_embeddings``), capped at :data:`KV_SHARE_OF_AVAILABLE` of ``memory.available``
    (:class:`dapo_cli.hardware.NodeMemory`); ``note`` hears when the cap leaves fewer sequences at once.
    None where the model's shape cannot be read (vLLM then sizes the cache itself).
    Raises :class:`UserError` when the node cannot hold the size asked for, or one full-length sequence."""
    from dapo_cli.errors import UserError
    from dapo_cli.plan.shape import kv_bytes_per_token, shape_from_config

    free = f"{memory.where()} has {memory.available / GIB:.2f} GiB available (of {memory.total / GIB:.2f} GiB)"
    if kv_cache_gib is not None:
        want = int(kv_cache_gib * GIB)
        if want > memory.available:
            raise UserError(f"rollout.kv_cache_gib={kv_cache_gib:g} is more than vLLM can have: {free}; lower it "
                            "or free memory on the node")
        return want
    data = _model_config(model_path)
    if data is None:
        return None
    try:
        shape = shape_from_config(data, str(model_path))
    except UserError:
        return None
    length = max_model_len or int(data.get("max_position_embeddings") or 0)
    if length <= 0:
        return None
    per_token = kv_bytes_per_token(shape, DTYPE_BYTES.get(dtype, 4))
    need = kv_cache_need(per_token, sequences, length)
    least = kv_cache_need(per_token, 1, length, margin=1.0)
    cap = int(memory.available * KV_SHARE_OF_AVAILABLE)
    if least > cap:
        raise UserError(
            f"vLLM needs {least / GIB:.2f} GiB of KV cache for one {length}-token sequence "
            f"({per_token / 1024:g} KiB a token) and {free}, of which it may take {KV_SHARE_OF_AVAILABLE:.0%}; shorten "
            "data.max_prompt_length + rollout.max_response_length, or free memory on the node"
        )
    if need > cap and note is not None:
        at_once = max(1, cap // max(1, kv_cache_need(per_token, 1, length)))
        note(f"vLLM's KV cache is capped at {cap / GIB:.2f} GiB ({KV_SHARE_OF_AVAILABLE:.0%} of what {memory.where()} has "
             f"available): about {at_once} of {min(sequences, CPU_MAX_NUM_SEQS)} sequences of {length} tokens run at once "
             f"(the rest wait); rollout.kv_cache_gib sets the size")
    return min(need, cap)


class VLLMRolloutEngine:
    """:class:`~dapo_cli.rollout.base.RolloutEngine` on ``vllm.LLM``.

    ``note``: called once with each thing the user should know about how the engine runs here
    (e.g. no sleep mode on this platform). ``weights``: where the policy's weights come from (the training
    engine); a level-2 sleep discards vLLM's copy, and waking syncs them again from the last source synced
    (this one until the first :meth:`sync_weights`)."""

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
        kv_cache_gib: float | None = None,
        max_sequences: int = CPU_MAX_NUM_SEQS,
        seed: int = 0,
        dist: Collective | None = None,
        note: Callable[[str], None] | None = None,
        weights: WeightSource | None = None,
    ) -> None:
        vllm_environment()
        from vllm import LLM

        self.tokenizer = tokenizer
        self.platform = platform_info()
        self.world_size = dist.world_size if dist is not None else 1
        self.rank = dist.rank if dist is not None else 0
        self.tp = tensor_parallel_size
        backend, extra = executor_layout(self.world_size, self.tp)
        self.backend = backend
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
        if self.platform["cpu"]:
            from dapo_cli.hardware import node_memory

            extra.update(
                enforce_eager=True, enable_chunked_prefill=False,
                max_num_batched_tokens=max(CPU_MIN_BATCHED_TOKENS, max_model_len or 0),
            )
            kv_bytes = cpu_kv_cache_bytes(
                model_path, dtype=dtype, sequences=max_sequences, max_model_len=max_model_len,
                kv_cache_gib=kv_cache_gib, memory=node_memory(), note=note,
            )
        else:
            kv_bytes = None if kv_cache_gib is None else int(kv_cache_gib * GIB)
        if kv_bytes is not None:
            extra["kv_cache_memory_bytes"] = kv_bytes
        self.kv_cache_bytes = kv_bytes
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
        # every reload warns that RotaryEmbedding has no weights to load (it has a computed cache only): that one
        # warning is dropped, the others (a layer left on its old weights) reach the log
        reload_log = logging.getLogger(RELOAD_LOGGER)
        if not any(isinstance(f, DropRotaryWarning) for f in reload_log.filters):
            reload_log.addFilter(DropRotaryWarning())
        self.serve_dtype: torch.dtype = self.llm.llm_engine.model_config.dtype
        """The dtype vLLM resolved for the weights (what each streamed tensor is cast to)."""
        self.sleeping: set[str] = set()
        """vLLM's sleeping memory tags: ``weights`` and ``kv_cache`` while asleep, none awake."""
        self.source = weights
        self.weights_discarded = False
        """vLLM threw its weights away (a level-2 sleep) and none were loaded since."""

    seeds_per_prompt = False
    """Request seeds hash (seed, the prompt's index in the call): ranks need seeds of their own."""

    def check_prompts(self, prompts: Sequence[str], max_tokens: int) -> None:
        """Nothing here: vLLM checks every request against its ``max_model_len`` in :meth:`generate`."""

    # ------------------------------------------------------------ memory and weights

    @property
    def asleep(self) -> bool:
        return bool(self.sleeping)

    def sleep(self) -> None:
        if self.sleep_level > 0 and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.sleeping = {"weights", "kv_cache"}
            self.weights_discarded = self.sleep_level >= 2

    def wake_up(self) -> None:
        """Awake again with valid weights: after a level-1 sleep vLLM maps back the weights it kept; after a
        level-2 sleep it has none, so they are synced again from the last source (:meth:`sync_weights`)."""
        if not self.asleep:
            return
        if self.weights_discarded:
            if self.source is None:
                raise RuntimeError("vLLM discarded its weights (rollout.sleep_level=2) and has no source to load them from")
            self.sync_weights(self.source)
            return
        self._wake(["weights", "kv_cache"])

    def _wake(self, tags: list[str]) -> None:
        tags = [t for t in tags if t in self.sleeping]
        if tags:
            self.llm.wake_up(tags=tags)
            self.sleeping -= set(tags)

    def close(self) -> None:
        """Shut vLLM's engine core down now (KV cache, its process groups), while the trainer's process
        group still exists: left to interpreter exit, vLLM's finaliser tears down groups already gone."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None

    @torch.no_grad()
    def sync_weights(self, source: WeightSource) -> None:
        """Every ``(name, tensor)`` of ``source.export_weights()`` into vLLM's model, in place, one at a time
        (:func:`stream_weights`, cast to :attr:`serve_dtype`); a sleeping engine wakes its weights first and its
        KV cache after the load, so the two are never mapped beside a sync's tensors at once.

        vLLM's ``reload_weights`` takes checkpoint-format names (those ``save_pretrained`` writes),
        loads them through each layer's weight loader and re-runs the platform's processing, so a
        backend that repacks weights after loading (the CPU one does) serves the new values. The stream
        is a generator: it crosses ``collective_rpc`` only in-process (the ``uni`` and
        ``external_launcher`` executors; ``mp``, a TP engine of one process, is ``dapo eval``'s and never synced)."""
        if self.backend == "mp":
            raise RuntimeError("a multi-process vLLM engine (tensor parallelism in one process) cannot take streamed weights")
        self.source = source
        self._wake(["weights"])
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": stream_weights(source.export_weights(), self.serve_dtype)}
        )
        self.weights_discarded = False
        self._wake(["kv_cache"])
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def forget_prefixes(self) -> None:
        """vLLM's automatic prefix cache emptied (``LLM.reset_prefix_cache``)."""
        self.llm.reset_prefix_cache()

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


def load_vllm_engine(
    model: str, *, messages: Sequence[Any] = (), max_tokens: int = 0, **kwargs: Any
) -> tuple[VLLMRolloutEngine, Any]:
    """``dapo eval --engine vllm``: an engine on a checkpoint dir or hub id, and its tokenizer.

    ``messages`` (each problem's chat messages) and ``max_tokens``: the engine's ``max_model_len`` is the
    longest templated prompt + ``max_tokens`` where that fits the model's context (else the context, and
    vLLM refuses the requests that do not fit), so the KV cache is sized for this evaluation."""
    from dapo_cli.models.loading import load_tokenizer
    from dapo_cli.models.tokenizer import format_prompt

    tokenizer = load_tokenizer(model)
    if messages and "max_model_len" not in kwargs:
        longest = max(len(tokenizer(format_prompt(tokenizer, m), add_special_tokens=False)["input_ids"]) for m in messages)
        context = int((_model_config(model) or {}).get("max_position_embeddings") or 0)
        if not context or longest + max_tokens <= context:
            kwargs["max_model_len"] = longest + max_tokens
    kwargs.setdefault("sleep_level", 0)
    # like the fast and hf engines: float32 on CPU (vLLM's "auto" may pick another dtype), bfloat16 on GPUs
    kwargs.setdefault("dtype", serving_dtype("auto", "float32", platform_info()["device"]))
    return VLLMRolloutEngine(model, tokenizer, **kwargs), tokenizer
