"""Per-GPU memory of each phase of an RL step, term by term, with a verdict and the first knob to turn.

Every term is bytes on one GPU (and, where something is offloaded, bytes of CPU memory per
rank). ``P`` parameters, ``b`` bytes per value of ``model.dtype``, ``W`` world size, ``L``
layers, ``h`` hidden size, ``I`` MLP width, ``q``/``kv`` the query / key-value widths
(heads × head_dim), ``V`` vocabulary, ``S`` = max_prompt_length + max_response_length
(a micro-batch is padded to its longest row, so memory is planned for the worst case),
``R`` = max_response_length, ``m`` responses per micro-batch on the rank.

- weights ``P·b``, ÷W at ZeRO-3 (CPU instead with ``offload_params``);
- gradients ``P·b``, ÷W at ZeRO ≥ 2; with ``offload_optimizer`` a fp32 partition ``4P/W`` lives
  on the CPU and the GPU keeps only reduce buckets (not counted) at ZeRO ≥ 2;
- AdamW: DeepSpeed keeps 2 fp32 moments + a fp32 master copy when ``b < 4`` (12 or 8 bytes a
  parameter), ÷W at ZeRO ≥ 1 (CPU with ``offload_optimizer``); the torch engine's AdamW keeps
  2 moments in the parameter dtype (``2b``), no master, never sharded (DDP);
- ZeRO-3 gathers parameters as it goes: ≈ two decoder layers + the (un)embedding in flight,
  doubled in the update for their full gradients before the reduce-scatter;
- activations of one micro-batch, per token per layer (bytes)
  ``A = b·(2q + 2kv + 4I) + 2·(4 + b)·h``: q/k/v/attention output, gate/up/SiLU/product, and two
  RMSNorms that keep an fp32 copy of their input plus their output; all layers ``m·S·L·A``, or
  with gradient checkpointing ``m·S·(L·h·b + 2A)`` (each layer's input, one layer recomputed
  with its backward buffers). A no-grad forward (old log-probs) peaks at ``m·S·A``;
- logits of the kept positions ``m·(R+1)·V·c``: the model's output (``b``), the fp32 scaled
  copy autograd keeps (4) and one fp32 transient (4: logsumexp's buffer / its gradient), so
  ``c = b + 8``; + 4 for the softmax when entropy is computed (always for old log-probs,
  in the update when ``entropy_coeff > 0``). The torch engine scores the head in chunks
  (``engine.logprob_chunk``): ``k·V·c'`` for ``k = min(logprob_chunk, m·(R+1))`` rows at a time
  (:func:`logits_term`), whatever the length; so does the DeepSpeed engine (under ZeRO-3 with the head's
  weight gathered for the call, inside the "gathered" term's ``V·h``);
- the weight sync before a rollout (:func:`sync_term`): ``export_weights`` yields one tensor at a time and
  the consumer drops it, so the extra memory is one tensor: under ZeRO-3 the largest parameter gathered
  (``max(V, I, q)·h·b``), with LoRA the largest merged layer (``max(I, q)·h·b``), otherwise nothing (the
  module's own tensors are sent);
- vLLM (``rollout.engine=vllm``) takes ``gpu_memory_utilization × GPU`` while awake: its weights
  ``P·b/TP`` and a KV cache of the rest, ``2·L·(kv_heads/TP)·head_dim·b`` bytes a token; asleep,
  level 1 frees the KV cache and moves the weights to CPU memory, level 2 drops both;
- the hf rollout engine samples with the trainer's module, or under ZeRO-3 with a full private
  copy ``P·b`` on every rank; its KV cache holds a generate call's rows × S tokens.

Not counted: the CUDA context, NCCL buffers, allocator fragmentation and vLLM's own activation
peak and CUDA graphs — a verdict under 10 % headroom says "tight".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from dapo_cli.config import Config
from dapo_cli.plan.batch import valid_world_size
from dapo_cli.plan.shape import (
    ModelShape,
    kv_bytes_per_token,
    layer_parameters,
    parameter_count,
)

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TIGHT = 0.10
"""Headroom below this share of the GPU makes a fitting phase "tight"."""
MAX_WORLD = 1024


@dataclass(frozen=True)
class Setup:
    """The settings a knob can change (everything else comes from the config)."""

    world_size: int
    engine: str
    zero_stage: int
    offload_optimizer: bool
    offload_params: bool
    gradient_checkpointing: bool
    micro_batch: int
    gpu_memory_utilization: float
    tensor_parallel_size: int
    sleep_level: int
    rollout_engine: str = "fast"

    @classmethod
    def of(cls, cfg: Config, world_size: int) -> Setup:
        e, r = cfg.engine, cfg.rollout
        return cls(
            world_size=world_size, engine=e.name, zero_stage=e.zero_stage if e.name == "deepspeed" else 0,
            offload_optimizer=e.offload_optimizer, offload_params=e.offload_params,
            gradient_checkpointing=e.gradient_checkpointing, micro_batch=cfg.trainer.ppo_micro_batch_size,
            gpu_memory_utilization=r.gpu_memory_utilization, tensor_parallel_size=r.tensor_parallel_size,
            sleep_level=r.sleep_level, rollout_engine=r.engine,
        )


@dataclass
class Term:
    key: str
    """Stable id within a phase (weights, optimizer, gradients, gathered, reference, copy, vllm,
    kv_cache, next_logits, activations, logits)."""
    name: str
    gpu: float
    """Bytes on one GPU."""
    formula: str
    cpu: float = 0.0
    """Bytes of CPU memory per rank."""


@dataclass
class Phase:
    name: str
    terms: list[Term]
    gpu_bytes: float
    verdict: str = ""
    knob: str = ""
    problem: str = ""
    """Why the phase cannot run regardless of the total (vLLM without room for one sequence)."""

    @property
    def total(self) -> float:
        return sum(t.gpu for t in self.terms)

    def term(self, key: str) -> Term | None:
        return next((t for t in self.terms if t.key == key), None)

    @property
    def cpu(self) -> float:
        return sum(t.cpu for t in self.terms)

    @property
    def fits(self) -> bool:
        return not self.problem and self.total <= self.gpu_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "total_gib": self.total / GIB, "cpu_gib": self.cpu / GIB, "fits": self.fits,
            "verdict": self.verdict, "knob": self.knob, "problem": self.problem,
            "terms": [{"key": t.key, "name": t.name, "gpu_gib": t.gpu / GIB, "cpu_gib": t.cpu / GIB, "formula": t.formula} for t in self.terms],
        }


@dataclass
class VllmInfo:
    pool: float
    weights: float
    kv_cache: float
    kv_bytes_per_token: int
    tokens_fit: int
    sequences_per_engine: int
    tokens_needed: int

    @property
    def concurrent_worst(self) -> int:
        """Worst-case sequences that fit in the KV cache at once."""
        per_seq = self.tokens_needed // max(1, self.sequences_per_engine)
        return self.tokens_fit // max(1, per_seq)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "concurrent_worst": self.concurrent_worst}


@dataclass
class MemoryPlan:
    gpu_bytes: float
    parameters: int
    phases: list[Phase]
    alternatives: list[Phase] = field(default_factory=list)
    """The update with vLLM in the other sleep state (informational; no knob)."""
    vllm: VllmInfo | None = None
    cpu_per_rank: float = 0.0
    ranks_per_node: int = 1

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.phases)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_gib": self.gpu_bytes / GIB, "parameters": self.parameters, "fits": self.fits,
            "phases": [p.to_dict() for p in self.phases], "alternatives": [p.to_dict() for p in self.alternatives],
            "vllm": self.vllm.to_dict() if self.vllm else None,
            "cpu_gib_per_rank": self.cpu_per_rank / GIB, "cpu_gib_per_node": self.cpu_per_rank * self.ranks_per_node / GIB,
        }


# ---------------------------------------------------------------- the terms


def activation_bytes_per_token_layer(shape: ModelShape, b: int) -> int:
    """``A = b·(2q + 2kv + 4I) + 2·(4 + b)·h`` bytes one token keeps in one layer for backward."""
    return b * (2 * shape.q_width + 2 * shape.kv_width + 4 * shape.intermediate_size) + 2 * (4 + b) * shape.hidden_size


class _Estimator:
    """The phases for one setup; the config, shape and GPU size stay fixed across knobs."""

    def __init__(self, cfg: Config, shape: ModelShape, gpu_bytes: float, gpus_per_node: int) -> None:
        self.cfg, self.shape, self.gpu, self.gpus_per_node = cfg, shape, gpu_bytes, gpus_per_node
        self.b = DTYPE_BYTES[cfg.model.dtype]
        self.P = parameter_count(shape)
        self.S = cfg.data.max_prompt_length + cfg.rollout.max_response_length
        self.R = cfg.rollout.max_response_length
        self.per_round = cfg.data.prompts_per_round
        self.prompts = cfg.data.train_batch_size if cfg.algorithm.filter_groups.enable else self.per_round

    def rows(self, s: Setup, *, update: bool = True) -> int:
        """Responses in the largest micro-batch a rank runs: the micro size, capped by the rank's share of a
        mini-batch (update) or of the step's batch (old log-probs)."""
        groups = max(1, self.prompts // s.world_size)
        if update:
            groups = min(self.cfg.trainer.ppo_mini_batch_size, groups)
        return max(1, min(s.micro_batch, groups * self.cfg.rollout.n))

    def state(self, s: Setup) -> dict[str, Term]:
        P, b, W = self.P, self.b, s.world_size
        ds, z = s.engine == "deepspeed", s.zero_stage if s.engine == "deepspeed" else 0
        terms: dict[str, Term] = {}
        pb = P * b
        if ds and z == 3 and s.offload_params:
            terms["weights"] = Term("weights", "weights (ZeRO-3, offloaded)", 0.0, "P·b/W on the CPU", cpu=pb / W)
        else:
            div = W if z == 3 else 1
            terms["weights"] = Term("weights", "weights" + (" (ZeRO-3)" if z == 3 else ""), pb / div, "P·b/W" if z == 3 else "P·b")
        if ds:
            bpp = 8 + (4 if b < 4 else 0)
            opt_f = f"P·{bpp}" + ("/W" if z >= 1 else "")
            opt_total = P * bpp / (W if z >= 1 else 1)
        else:
            bpp = 2 * b
            opt_f, opt_total = "P·2b (moments in the param dtype)", P * bpp
        if ds and s.offload_optimizer:
            terms["optimizer"] = Term("optimizer", "optimizer states (offloaded)", 0.0, opt_f + " on the CPU", cpu=opt_total)
        else:
            terms["optimizer"] = Term("optimizer", "optimizer states" + ("" if ds else " (torch AdamW)"), opt_total, opt_f)
        grad_div = W if z >= 2 else 1
        if ds and s.offload_optimizer:
            gpu = 0.0 if z >= 2 else pb
            terms["gradients"] = Term("gradients", "gradients", gpu, ("buckets" if z >= 2 else "P·b") + "; 4P/W fp32 on the CPU",
                                      cpu=4 * P / (W if z >= 1 else 1))
        else:
            terms["gradients"] = Term("gradients", "gradients" + (" (ZeRO-2+)" if z >= 2 else ""), pb / grad_div, "P·b/W" if z >= 2 else "P·b")
        if z == 3:
            flight = min(P, 2 * layer_parameters(self.shape) + self.shape.vocab_size * self.shape.hidden_size)
            terms["gathered"] = Term("gathered", "ZeRO-3 gathered parameters", flight * b, "(2 layers + V·h)·b")
        if self.cfg.algorithm.use_kl_loss:
            div = W if z == 3 else 1
            terms["reference"] = Term("reference", "reference policy (KL)", pb / div, "P·b/W" if z == 3 else "P·b")
        terms["sync"] = sync_term(self.shape, b, zero_stage=z, lora=self.cfg.model.lora.rank > 0)
        if s.rollout_engine in ("hf", "fast") and z == 3:
            terms["copy"] = Term("copy", "hf rollout copy (unsharded)", pb, "P·b: ZeRO-3 samples with a full copy")
        return terms

    def vllm(self, s: Setup) -> VllmInfo:
        pool = s.gpu_memory_utilization * self.gpu
        weights = self.P * self.b / s.tensor_parallel_size
        kv = max(0.0, pool - weights)
        per_token = kv_bytes_per_token(self.shape, self.b, s.tensor_parallel_size)
        engines = max(1, s.world_size // s.tensor_parallel_size)
        seqs = math.ceil(self.per_round * self.cfg.rollout.n / engines)
        return VllmInfo(pool, weights, kv, per_token, int(kv // per_token), seqs, seqs * self.S)

    def phases(self, s: Setup) -> tuple[list[Phase], list[Phase], VllmInfo | None]:
        st, shape, b, gpu = self.state(s), self.shape, self.b, self.gpu
        resident = [st[k] for k in ("weights", "optimizer", "reference", "copy") if k in st]
        m = self.rows(s)
        A = activation_bytes_per_token_layer(shape, b)
        L, h, V = shape.num_hidden_layers, shape.hidden_size, shape.vocab_size
        info = self.vllm(s) if s.rollout_engine == "vllm" else None

        # rollout
        roll = list(resident)
        problem = ""
        if info is not None:
            roll.append(Term("vllm", f"vLLM pool ({s.gpu_memory_utilization:g} × GPU)", info.pool, "weights P·b/TP + KV cache"))
            if info.tokens_fit < self.S:
                problem = (f"vLLM's KV cache holds {info.tokens_fit} tokens, less than one worst-case sequence ({self.S}): "
                           "raise rollout.gpu_memory_utilization or rollout.tensor_parallel_size")
        else:
            gen_rows = self.cfg.rollout.batch_size or max(1, self.per_round * self.cfg.rollout.n // s.world_size)
            roll.append(Term("kv_cache", f"hf KV cache ({gen_rows} rows × S)", gen_rows * self.S * kv_bytes_per_token(shape, b),
                             "rows·S·2·L·kv·b"))
            roll.append(Term("next_logits", "hf next-token logits", gen_rows * V * 4 * 2, "rows·V·4·2"))
        if st["sync"].gpu > 0:
            roll.append(st["sync"])
        phases = [Phase("rollout", roll, gpu, problem=problem)]

        # old log-probs (no grad) and the update, vLLM as configured
        def vllm_term(level: int) -> list[Term]:
            if info is None:
                return []
            if level == 0:
                return [Term("vllm", "vLLM awake (sleep_level 0)", info.pool, "gpu_memory_utilization × GPU")]
            if level == 1:
                return [Term("vllm", "vLLM asleep (sleep_level 1)", 0.0, "KV freed; P·b/TP to the CPU", cpu=info.weights)]
            return [Term("vllm", "vLLM asleep (sleep_level 2)", 0.0, "KV and weights dropped")]

        gathered = [st["gathered"]] if "gathered" in st else []
        mo = self.rows(s, update=False)
        chunk = self.cfg.engine.logprob_chunk
        old = list(resident) + gathered + [
            Term("activations", f"activations, no grad ({mo} × {self.S})", mo * self.S * A, "m·S·A"),
            logits_term(mo * (self.R + 1), V, b, entropy=True, chunk=chunk, grad=False),
        ] + vllm_term(s.sleep_level)
        phases.append(Phase("old log-probs", old, gpu))

        if s.gradient_checkpointing:
            act = Term("activations", f"activations, checkpointed ({m} × {self.S})", m * self.S * (L * h * b + 2 * A), "m·S·(L·h·b + 2A)")
        else:
            act = Term("activations", f"activations ({m} × {self.S})", m * self.S * L * A, "m·S·L·A")
        update_core = list(resident) + [st["gradients"]]
        if gathered:
            update_core.append(Term("gathered", "ZeRO-3 gathered parameters + grads", 2 * gathered[0].gpu, "2·(2 layers + V·h)·b"))
        entropy = self.cfg.algorithm.entropy_coeff > 0
        update_core += [act, logits_term(m * (self.R + 1), V, b, entropy=entropy, chunk=chunk, grad=True)]
        phases.append(Phase("update", update_core + vllm_term(s.sleep_level), gpu))
        alternatives: list[Phase] = []
        if info is not None:
            other = 1 if s.sleep_level == 0 else 0
            label = "update, vLLM awake" if other == 0 else "update, vLLM asleep (sleep_level 1)"
            alternatives.append(Phase(label, update_core + vllm_term(other), gpu))
        return phases, alternatives, info


def sync_term(shape: ModelShape, b: int, *, zero_stage: int, lora: bool) -> Term:
    """The weight sync's extra bytes (one tensor in flight): the largest parameter gathered under ZeRO-3
    (``max(V, I, q)·h·b``: the (un)embedding, an MLP or a query projection), the largest merged LoRA layer
    (``max(I, q)·h·b``; the embedding is never adapted), else 0 (the live module's tensors are sent as they are).
    Measured on 2 gloo ranks (tests/distributed/test_distributed_zero3.py): the peak equals this term."""
    h = shape.hidden_size
    linear = max(shape.intermediate_size, shape.q_width) * h
    if zero_stage == 3:
        return Term("sync", "weight sync: one gathered parameter", max(shape.vocab_size * h, linear) * b, "max(V, I, q)·h·b")
    if lora:
        return Term("sync", "weight sync: one merged LoRA layer", linear * b, "max(I, q)·h·b")
    return Term("sync", "weight sync: the module's own tensors", 0.0, "0")


def logits_term(tokens: int, V: int, b: int, *, entropy: bool, chunk: int, grad: bool) -> Term:
    """The logits of ``tokens`` scored positions (``m·(R+1)``) over the vocabulary ``V``.

    Full (``chunk`` 0, or the DeepSpeed engine): ``tokens·V·c``, ``c = b + 8`` (the model's output, the fp32
    scaled copy autograd keeps, one fp32 transient) + 4 for the softmax with entropy (always for old
    log-probs). Chunked (``engine.logprob_chunk`` > 0, the torch engine): only ``k = min(chunk, tokens)``
    rows at a time, and nothing kept for the backward (``algo.logits.chunked_head_log_probs``):
    ``k·V·c'`` with ``c' = 8`` (the fp32 scaled logits and one fp32 transient: logsumexp's, or the
    backward's gradient) + 4 for the entropy's probabilities + ``b`` for the head's output when it is 16-bit.
    The term's name prints the full size beside the chunked one."""
    full_c = b + 8 + (4 if entropy else 0)
    full = tokens * V * full_c
    what = "logits + entropy" if entropy and not grad else "logits"
    if chunk <= 0:
        return Term("logits", what, full, f"m·(R+1)·V·(b+{full_c - b})")
    k = min(chunk, tokens)
    c = 8 + (4 if entropy else 0) + (b if b < 4 else 0)
    return Term("logits", f"{what}, {k}-token chunks (full: {full / GIB:.1f} GiB)", k * V * c,
                f"k·V·{c}, k = min(logprob_chunk, m·(R+1))")


# ---------------------------------------------------------------- verdicts and knobs


def verdict(phase: Phase) -> str:
    gib = phase.gpu_bytes / GIB
    if phase.problem:
        return f"does not fit: {phase.problem}"
    room = phase.gpu_bytes - phase.total
    if room < 0:
        return f"does not fit: {phase.total / GIB:.1f} of {gib:g} GiB, over by {-room / GIB:.1f} GiB"
    tight = " (tight: under 10% headroom for what is not counted)" if room < TIGHT * phase.gpu_bytes else ""
    return f"fits: {phase.total / GIB:.1f} of {gib:g} GiB, {room / GIB:.1f} GiB free{tight}"


class _Knobs:
    """The knobs a phase that does not fit can turn: ``candidates`` lists (label, setup) pairs, cheapest first."""

    def __init__(self, est: _Estimator, cfg: Config) -> None:
        self.est, self.cfg = est, cfg

    def fits(self, s: Setup, name: str, *, comfortably: bool = False) -> bool:
        phases, _, _ = self.est.phases(s)
        p = next(p for p in phases if p.name == name)
        limit = (1 - TIGHT) * p.gpu_bytes if comfortably else p.gpu_bytes
        return not p.problem and p.total <= limit

    def pick(self, values: list[Any], make: Any, name: str) -> Any:
        """The first value whose setup fits ``name`` with headroom, else the first that fits, else None."""
        for comfortably in (True, False):
            for value in values:
                if self.fits(make(value), name, comfortably=comfortably):
                    return value
        return None

    def total(self, s: Setup, name: str) -> float:
        phases, _, _ = self.est.phases(s)
        p = next(p for p in phases if p.name == name)
        return math.inf if p.problem else p.total

    def candidates(self, s: Setup, name: str) -> list[tuple[str, Setup]]:
        """Each knob at the setting that makes ``name`` fit, else at its most memory-saving setting."""
        out: list[tuple[str, Setup]] = []
        rep = dataclasses.replace
        vllm = s.rollout_engine == "vllm"
        if vllm and s.sleep_level == 0:
            out.append(("rollout.sleep_level=1", rep(s, sleep_level=1)))
        if vllm:
            utils = [u / 20 for u in range(19, 0, -1) if abs(u / 20 - s.gpu_memory_utilization) > 1e-9]
            pick = self.pick(utils, lambda u: rep(s, gpu_memory_utilization=u), name)
            if pick is not None:
                out.append((f"rollout.gpu_memory_utilization={pick:g}", rep(s, gpu_memory_utilization=pick)))
            tps = [t for t in self._tps(s.world_size) if t > s.tensor_parallel_size]
            pick_tp = self.pick(tps, lambda t: rep(s, tensor_parallel_size=t), name)
            if pick_tp is not None:  # vLLM's size is set by the rollout phase
                pick_tp = self.pick(tps, lambda t: rep(s, tensor_parallel_size=t), "rollout") or pick_tp
            if pick_tp is not None:
                out.append((f"rollout.tensor_parallel_size={pick_tp}", rep(s, tensor_parallel_size=pick_tp)))
        if not s.gradient_checkpointing:
            out.append(("engine.gradient_checkpointing=true", rep(s, gradient_checkpointing=True)))
        if s.micro_batch > 1:
            sizes = range(s.micro_batch - 1, 0, -1)
            pick_m = self.pick(list(sizes), lambda m: rep(s, micro_batch=m), name) or 1
            out.append((f"trainer.ppo_micro_batch_size={pick_m}", rep(s, micro_batch=pick_m)))
        if s.engine != "deepspeed":
            out.append(("engine.name=deepspeed engine.zero_stage=3", rep(s, engine="deepspeed", zero_stage=3)))
        elif s.zero_stage < 3:
            out.append(("engine.zero_stage=3", rep(s, zero_stage=3)))
        if not vllm:
            tps = self._tps(s.world_size)
            pick_tp = self.pick(tps, lambda t: rep(s, rollout_engine="vllm", tensor_parallel_size=t), name)
            if pick_tp is not None:  # vLLM's size is set by the rollout phase
                pick_tp = self.pick(tps, lambda t: rep(s, rollout_engine="vllm", tensor_parallel_size=t), "rollout") or tps[-1]
                out.append((f"rollout.engine=vllm rollout.tensor_parallel_size={pick_tp}",
                            rep(s, rollout_engine="vllm", tensor_parallel_size=pick_tp)))
        worlds = [w for w in range(s.world_size + 1, MAX_WORLD + 1) if self._valid_world(s, w)]
        pick_w = next((w for w in worlds if self.fits(rep(s, world_size=w), name)), None)
        if pick_w is not None:
            nodes = math.ceil(pick_w / self.est.gpus_per_node)
            out.append((f"--world-size {pick_w} ({nodes} node{'s' if nodes > 1 else ''})", rep(s, world_size=pick_w)))
        prefix = "" if s.engine == "deepspeed" else "engine.name=deepspeed "
        if not s.offload_optimizer:
            out.append((prefix + "engine.offload_optimizer=true", rep(s, engine="deepspeed", offload_optimizer=True)))
        if not s.offload_params:
            z3 = "" if s.zero_stage == 3 else "engine.zero_stage=3 "
            out.append((prefix + z3 + "engine.offload_params=true", rep(s, engine="deepspeed", zero_stage=3, offload_params=True)))
        return out

    def _tps(self, world_size: int) -> list[int]:
        """Tensor-parallel sizes vLLM can use here: within a node, dividing the world and the heads."""
        heads, kv = self.est.shape.num_attention_heads, self.est.shape.num_key_value_heads
        return [
            t for t in (1, 2, 4, 8, 16)
            if t <= self.est.gpus_per_node and world_size % t == 0 and heads % t == 0 and (kv % t == 0 if kv >= t else t % kv == 0)
        ]

    def _valid_world(self, s: Setup, w: int) -> bool:
        if w > self.est.gpus_per_node and w % self.est.gpus_per_node:
            return False  # whole nodes beyond one node
        if w % s.tensor_parallel_size:
            return False
        return valid_world_size(
            self.cfg, w, num_attention_heads=self.est.shape.num_attention_heads,
            num_kv_heads=self.est.shape.num_key_value_heads, gpus_per_node=self.est.gpus_per_node,
        )

    def advice(self, s: Setup, name: str) -> str:
        """The first single knob that makes ``name`` fit without breaking a phase that fits, else a
        cumulative sequence."""
        phases, _, _ = self.est.phases(s)
        keep = [p.name for p in phases if p.fits]
        alone = [
            f"{label} (→ {self.total(cand, name) / GIB:.1f} GiB)"
            for label, cand in self.candidates(s, name)
            if self.fits(cand, name) and all(self.fits(cand, other) for other in keep)
        ]
        if alone:
            also = f"; also alone: {', '.join(alone[1:3])}" if len(alone) > 1 else ""
            return f"first knob: {alone[0]}{also}"
        steps: list[str] = []
        cur = s
        for _ in range(8):
            best = None
            for label, cand in self.candidates(cur, name):
                if self.total(cand, name) < self.total(cur, name) - 1:
                    best = (label, cand)
                    break
            if best is None:
                break
            steps.append(best[0])
            cur = best[1]
            if self.fits(cur, name):
                return f"no single knob suffices; together: {', then '.join(steps)} (→ {self.total(cur, name) / GIB:.1f} GiB)"
        end = self.total(cur, name)
        shown = "no finite estimate" if end == math.inf else f"{end / GIB:.1f} GiB"
        if not steps:
            return "no knob here helps: a larger GPU (--gpu-memory-gib) or a smaller model"
        return f"still over after {', then '.join(steps)} ({shown}): shorten max_response_length or use larger GPUs"


def memory_plan(cfg: Config, shape: ModelShape, *, world_size: int, gpu_memory_gib: float = 80.0, gpus_per_node: int = 8) -> MemoryPlan:
    """Estimate every phase at ``world_size`` ranks on GPUs of ``gpu_memory_gib``, with verdicts and knobs."""
    gpu = gpu_memory_gib * GIB
    est = _Estimator(cfg, shape, gpu, gpus_per_node)
    setup = Setup.of(cfg, world_size)
    phases, alternatives, info = est.phases(setup)
    knobs = _Knobs(est, cfg)
    for phase in phases + alternatives:
        phase.verdict = verdict(phase)
    for phase in phases:
        if not phase.fits:
            phase.knob = knobs.advice(setup, phase.name)
    cpu = max(p.cpu for p in phases + alternatives)
    return MemoryPlan(
        gpu_bytes=gpu, parameters=est.P, phases=phases, alternatives=alternatives, vllm=info,
        cpu_per_rank=cpu, ranks_per_node=min(world_size, gpus_per_node),
    )


__all__ = [
    "DTYPE_BYTES", "GIB", "MemoryPlan", "Phase", "Setup", "Term", "VllmInfo",
    "activation_bytes_per_token_layer", "memory_plan", "verdict",
]
