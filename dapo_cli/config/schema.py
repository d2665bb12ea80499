"""The one configuration schema: every setting, its default and a one-line doc.

Defaults follow the DAPO paper's Qwen2.5-32B recipe (Yu et al. 2025, §4.1 and
verl's ``recipe/dapo``) wherever the paper fixes a value; the embedded tiny CPU
experiment (``experiments/tiny.yaml``) overrides only what the laptop scale needs.
Names follow verl where a verl user would look for them (``clip_ratio_low``,
``loss_agg_mode``, ``overlong_buffer.len``, ``filter_groups.max_num_gen_batches``).

Each field is declared with :func:`setting`, whose ``help`` is the field's only
documentation; ``dapo config`` (and the docs) render it from here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dapo_cli.config.fields import setting
from dapo_cli.config.tiny import TinyModelConfig
from dapo_cli.errors import UserError


ALGO_DAPO = "dapo"
ALGO_DIRECT_ADVANTAGE = "direct-advantage"
ALGOS: tuple[str, ...] = (ALGO_DAPO, ALGO_DIRECT_ADVANTAGE)
"""``algo`` values: the RL method a run uses."""
TRAINING_ENGINES: tuple[str, ...] = ("torch", "deepspeed")
"""``engine.name`` values (built by ``components.build_training_engine``)."""
ROLLOUT_ENGINES: tuple[str, ...] = ("fast", "hf", "vllm")
"""``rollout.engine`` / ``eval.engine`` values (built by ``components``)."""
LOCAL_ROLLOUT_ENGINES: tuple[str, ...] = ("fast", "hf")
"""Rollout engines that sample with a module in this process (``components.build_policy_rollout``)."""
ROLLOUT_WORKERS: tuple[str, ...] = ("auto", "inline", "process")
"""``rollout.worker`` values: where training rollouts are generated (``dapo_cli/train/rounds.py``)."""


@dataclass
class DataConfig:
    train_files: list[str] = setting(["synthetic:add-3digit"], "training sets: DAPO parquet paths, registered names, or synthetic:NAME")
    val_files: list[str] = setting(["synthetic:add-3digit"], "held-out sets for validation (same forms as train_files)")
    synthetic_train_size: int = setting(4000, "problems generated for a synthetic:NAME training set")
    synthetic_val_size: int = setting(200, "problems generated for a synthetic:NAME validation set")
    train_batch_size: int = setting(512, "prompts per RL step (after dynamic sampling), verl data.train_batch_size")
    gen_batch_size: int = setting(0, "prompts per generation round (0: train_batch_size); > train_batch_size oversamples for dynamic sampling")
    max_prompt_length: int = setting(2048, "prompts longer than this many tokens are dropped with a warning")
    shuffle: bool = setting(True, "shuffle the training prompts every epoch")

    @property
    def prompts_per_round(self) -> int:
        """Prompts one generation round samples, over all ranks: ``gen_batch_size``, or ``train_batch_size`` when 0."""
        return self.gen_batch_size or self.train_batch_size


LORA_ALL_LINEAR = "all-linear"
"""``model.lora.target_modules`` entry meaning every linear layer of the decoder blocks (PEFT's name; not ``lm_head``)."""


@dataclass
class LoraConfig:
    """LoRA (Hu et al. 2021, arXiv:2106.09685) through PEFT: W = W0 + (alpha / rank) B A on the targeted layers."""

    rank: int = setting(
        0, "LoRA rank r (0: off, full fine-tuning). In RL a small rank matches full fine-tuning: TRL's 'LoRA without "
        "regret' notes recommend rank <= 32 on all linear layers with ~10x the full fine-tuning trainer.lr",
    )
    alpha: float = setting(32.0, "LoRA alpha: the adapter's update is scaled by alpha / rank")
    target_modules: list[str] = setting(
        [LORA_ALL_LINEAR], "modules given adapters: all-linear (every linear layer of the blocks, as the LoRA-in-RL "
        "results use), or module names (Llama/Qwen2: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
    )
    dropout: float = setting(
        0.0, "dropout on the adapters' input in training (0: none; > 0 trains through the model's own forward, not "
        "engine.shared_prompt_forward)",
    )


@dataclass
class ModelConfig:
    path: str = setting("builtin:tiny", "policy: a save_pretrained directory, a hub id, builtin:tiny (built and cached on first use) or gguf:smollm2-135m-instruct (a registered GGUF, imported by make smollm2)")
    dtype: str = setting("float32", "parameter dtype for training", choices=("float32", "bfloat16", "float16"))
    tiny: TinyModelConfig = setting(TinyModelConfig(), "architecture and warm-start of builtin:tiny")
    lora: LoraConfig = setting(LoraConfig(), "train low-rank adapters instead of every weight (torch engine; needs the [lora] extra)")


@dataclass
class RolloutConfig:
    engine: str = setting(
        "fast", "rollout engine: fast (own decode loop, the CPU default), hf (transformers generate) or vllm (CUDA, or vLLM's CPU build)",
        choices=ROLLOUT_ENGINES,
    )
    n: int = setting(16, "responses sampled per prompt (the group size G)")
    temperature: float = setting(1.0, "sampling temperature for training rollouts")
    top_p: float = setting(1.0, "nucleus sampling for training rollouts (1.0 = off)")
    top_k: int = setting(0, "top-k sampling for training rollouts (0 = off)")
    max_response_length: int = setting(20480, "maximum generated tokens per response (L_max)")
    batch_size: int = setting(0, "sequences per generate call (0 = all at once)")
    gpu_memory_utilization: float = setting(
        0.5, "vLLM on GPUs: fraction of each GPU's memory vLLM may take (weights + KV cache), colocated with training "
        "(on vLLM's CPU build the KV cache is sized by rollout.kv_cache_gib instead)",
    )
    kv_cache_gib: float | None = setting(
        None, "vLLM's KV cache in GiB (null: on vLLM's CPU build, sized from the round: sequences per generate call x "
        "(max_prompt_length + max_response_length) x the model's KV bytes a token, x1.25, at most 80% of what the NUMA "
        "node has available; on GPUs, gpu_memory_utilization decides)",
    )
    tensor_parallel_size: int = setting(1, "vLLM only: GPUs one vLLM engine spans (tensor parallelism); must divide the world size")
    dtype: str = setting(
        "auto", "vLLM only: the dtype it serves the policy in (auto: bfloat16 on GPUs, model.dtype on vLLM's CPU build); "
        "the trainer's weights are cast per tensor as they sync", choices=("auto", "float32", "bfloat16", "float16"),
    )
    sync_check_gap: float = setting(
        0.5, "vLLM only: after each weight sync, the largest mean |log pi_vLLM - log pi_trainer| per token (nats) allowed "
        "on a fixed probe (4 of the run's prompts, 16 sampled tokens each); above it the run stops (exit 5): vLLM is not "
        "serving the trainer's weights (bfloat16 serving measures ~0.01-0.05; 0: no check)",
    )
    sleep_level: int = setting(
        1, "vLLM only: sleep mode during the update phase (0: stay awake, 1: offload weights and drop the KV cache, 2: drop both); "
        "vLLM's CPU build has none and stays awake",
    )
    max_staleness: int = setting(
        0, "asynchronous rollouts: a worker process generates the next steps' rounds while the trainer updates; a "
        "sample drawn with weights more than this many versions older than the policy being updated is never trained "
        "on (its group is dropped), and the loss corrects the rest with the decoupled objective (0: the synchronous loop)",
    )
    worker: str = setting(
        "auto", "where training rollouts are generated: inline (in the trainer's process, between updates), process (a "
        "worker process fed the newest weights after every optimizer step), auto (process when max_staleness > 0)",
        choices=ROLLOUT_WORKERS,
    )
    worker_threads: int = setting(
        0, "rollout worker process: its torch threads (0: half the CPU cores); the trainer then takes "
        "engine.num_threads, or the remaining cores when that is 0",
    )


def uses_worker(rollout: RolloutConfig) -> bool:
    """True when training rollouts come from the worker process (``rollout.worker``, auto: when ``max_staleness > 0``)."""
    return rollout.worker == "process" or (rollout.worker == "auto" and rollout.max_staleness > 0)


def rank_share(data: DataConfig, world_size: int) -> int:
    """Prompts of one generation round that one rank samples: ``prompts_per_round / world_size`` (whole: the
    config is checked against the world size before a run starts, ``validate.check_world_size``); the one place
    the loop, the round planner and the engine's sizing read it from."""
    return max(1, data.prompts_per_round // max(1, world_size))


def round_sequences(data: DataConfig, rollout: RolloutConfig, world_size: int) -> int:
    """Sequences one rollout engine receives in a training round's generate call: this rank's share of the
    round's prompts (:func:`rank_share`) × ``rollout.n``, times the ranks of a tensor-parallel group (they submit
    together)."""
    return rank_share(data, world_size) * rollout.n * max(1, rollout.tensor_parallel_size)


def thread_split(rollout: RolloutConfig, num_threads: int, cores: int) -> tuple[int, int]:
    """(trainer, worker) torch threads on ``cores`` cores: ``rollout.worker_threads`` (0: half the cores, at least 1)
    for the rollout worker process, ``engine.num_threads`` (``num_threads``; 0: the cores left, at least 1) for the trainer."""
    worker = rollout.worker_threads or max(1, cores // 2)
    trainer = num_threads or max(1, cores - worker)
    return trainer, worker


@dataclass
class OverlongBufferConfig:
    enable: bool = setting(True, "soft overlong punishment (DAPO Eq. 13), toggle --overlong-shaping")
    len: int = setting(4096, "punishment buffer length L_cache in tokens")
    penalty_factor: float = setting(1.0, "scale of the length penalty (1.0 = paper)")


@dataclass
class FilterGroupsConfig:
    enable: bool = setting(True, "dynamic sampling: keep only groups with mixed accuracy (DAPO Eq. 11)")
    metric: str = setting("acc", "value that must vary within a kept group: raw accuracy, or the shaped reward", choices=("acc", "score"))
    max_num_gen_batches: int = setting(10, "generation rounds per step before giving up (<= 0: unlimited)")
    on_exhausted: str = setting("train", "when rounds run out: train on the groups kept so far, or stop with an error", choices=("train", "error"))


POLICY_LOSSES: tuple[str, ...] = ("dapo", "gspo", "cispo", "gmpo")
"""``algorithm.policy_loss`` values (the registry ``algo/objectives.POLICY_LOSSES``; its settings: ``config/objectives.py``)."""
ROLLOUT_CORRECTIONS: tuple[str, ...] = ("token_tis", "seq_tis", "geo_mask", "opsm")
"""``algorithm.rollout_is.mode`` values (the registry ``algo/rollout_correction.ROLLOUT_CORRECTIONS``)."""
ROW_DROPPING_CORRECTIONS: tuple[str, ...] = ("geo_mask",)
"""Corrections that drop whole responses from the loss's denominators, decided from π_old before the update
(``algo/rollout_correction.ROW_FILTERS``)."""


@dataclass
class RolloutISConfig:
    enable: bool = setting(
        False, "correct the loss for the rollout engine's log-probs differing from the trainer's, with the correction "
        "named by mode (always on with rollout.max_staleness > 0: the decoupled objective's behaviour weights)",
    )
    mode: str = setting(
        "token_tis", "the correction: token_tis (each token weighted by min(pi_old / pi_rollout, cap); Yao et al. 2025), "
        "seq_tis (each response by min(its sequence ratio, cap)), geo_mask (a response whose geometric-mean ratio leaves "
        "[1/geo_bound, geo_bound] is dropped from the loss), opsm (a negative-advantage response whose mean "
        "log(pi_rollout / pi_theta) exceeds opsm_delta is masked; DeepSeek-V3.2)", choices=ROLLOUT_CORRECTIONS,
    )
    cap: float = setting(2.0, "token_tis / seq_tis: upper bound C of the truncated weight (per token / per response; verl's rollout_is_threshold 2.0)")
    geo_bound: float = setting(
        1.001, "geo_mask: bound c > 1 on a response's geometric-mean ratio pi_old / pi_rollout (verl's geometric rejection "
        "preset: 1.001, i.e. a mean per-token gap of 0.1%)",
    )
    opsm_delta: float = setting(
        1e-4, "opsm: divergence threshold delta on a response's mean log(pi_rollout / pi_theta) (DeepSeek-V3.2 publishes no "
        "value; 1e-4 is slime's --opsm-delta default)",
    )


@dataclass
class GspoConfig:
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): read only with ``algorithm.policy_loss: gspo``."""

    clip_ratio_low: float = setting(
        3e-4, "epsilon_low of GSPO's clip of the sequence ratio s_i = exp(mean log-ratio) (paper: 3e-4; a geometric mean "
        "moves ~1e-4 per update where token ratios move ~0.1)",
    )
    clip_ratio_high: float = setting(4e-4, "epsilon_high of GSPO's sequence-level clip (paper: 4e-4)")


@dataclass
class CispoConfig:
    """CISPO (MiniMax-M1, Chen et al. 2025, arXiv:2506.13585): read only with ``algorithm.policy_loss: cispo``."""

    clip_ratio_low: float | None = setting(
        None, "epsilon_low of the clipped IS weight's lower bound 1 - epsilon_low (null: no lower bound, as MiniMax-M1 sets it)",
    )
    clip_ratio_high: float = setting(
        3.0, "epsilon_high of the IS weight's upper bound 1 + epsilon_high (MiniMax-M1 tunes only this and gives no value; "
        "3.0 caps the weight at 4, the bound Tinker documents as CISPO's default, after ScaleRL)",
    )


@dataclass
class GmpoConfig:
    """GMPO (Zhao et al. 2025, arXiv:2507.20673): read only with ``algorithm.policy_loss: gmpo``."""

    log_clip_low: float = setting(0.4, "epsilon_low of GMPO's per-token clip in log space: ratios kept above exp(-epsilon_low) (paper: 0.4)")
    log_clip_high: float = setting(0.4, "epsilon_high of GMPO's per-token clip in log space: ratios kept below exp(epsilon_high) (paper: 0.4)")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = setting("grpo", "group advantage estimator", choices=("grpo", "dr_grpo", "rloo"))
    policy_loss: str = setting(
        "dapo", "the policy loss: dapo (decoupled token clip, DAPO Eq. 10: clip_ratio_low/high/c), gspo (one ratio and "
        "one clip per response: algorithm.gspo), cispo (clipped IS weight times log-prob, every token keeps its "
        "gradient: algorithm.cispo), gmpo (geometric mean of each response's token-clipped terms: algorithm.gmpo); "
        "docs/objectives.md", choices=POLICY_LOSSES,
    )
    clip_ratio_low: float = setting(0.2, "policy_loss dapo: epsilon_low of the decoupled clip (DAPO Eq. 10)")
    clip_ratio_high: float = setting(0.28, "policy_loss dapo: epsilon_high of the decoupled clip; = clip_ratio_low turns clip-higher off")
    clip_ratio_c: float | None = setting(None, "policy_loss dapo: dual-clip bound c > 1 for negative advantages (null = off)")
    gspo: GspoConfig = setting(GspoConfig(), "GSPO's sequence-level clip (policy_loss: gspo)")
    cispo: CispoConfig = setting(CispoConfig(), "CISPO's clipped IS weight (policy_loss: cispo)")
    gmpo: GmpoConfig = setting(GmpoConfig(), "GMPO's log-space token clip (policy_loss: gmpo)")
    loss_agg_mode: str = setting(
        "token-mean",
        "loss aggregation; token-mean is DAPO's token-level loss, seq-mean-token-mean is GRPO's",
        choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"),
    )
    overlong_buffer: OverlongBufferConfig = setting(OverlongBufferConfig(), "soft overlong punishment")
    overlong_filter: bool = setting(True, "drop truncated responses from the loss (overlong filtering)")
    filter_groups: FilterGroupsConfig = setting(FilterGroupsConfig(), "dynamic sampling")
    use_kl_loss: bool = setting(False, "add a KL penalty to a frozen reference policy (DAPO removes it)")
    kl_loss_coef: float = setting(0.001, "weight of the KL penalty when use_kl_loss")
    kl_loss_type: str = setting("low_var_kl", "KL estimator", choices=("kl", "abs", "mse", "low_var_kl"))
    entropy_coeff: float = setting(0.0, "entropy bonus weight (0 = none, as in DAPO)")
    loss_norm: str = setting(
        "mini_batch",
        "denominator of the loss mean: the whole mini-batch over all ranks (exact) or each micro-batch (what some frameworks do; for reproduction only)",
        choices=("mini_batch", "micro_batch"),
    )
    rollout_is: RolloutISConfig = setting(
        RolloutISConfig(), "correction for samples drawn by another policy than pi_old: the rollout engine's numbers, or "
        "stale weights (docs/objectives.md)",
    )

    @property
    def clip_higher(self) -> bool:
        """Clip-Higher is on (DAPO §3.1): ``clip_ratio_high > clip_ratio_low``; equal is off (how ``--no-clip-higher``
        writes it). The one place this is decided: techniques, lint and validation read it."""
        return self.clip_ratio_high > self.clip_ratio_low

    @property
    def clip_inverted(self) -> bool:
        """``clip_ratio_high < clip_ratio_low``: the upper clip tighter than the lower, neither on nor off (validation
        rejects it; lint's ``clip-inverted``)."""
        return self.clip_ratio_high < self.clip_ratio_low


@dataclass
class RewardConfig:
    verifier: str = setting("math_dapo", "answer checker", choices=("math_dapo", "strict_box", "math_equiv"))


@dataclass
class TrainerConfig:
    total_steps: int = setting(100, "RL steps (one step = one batch of train_batch_size prompts)")
    ppo_mini_batch_size: int = setting(32, "prompts per optimizer step; train_batch_size / this = updates per rollout")
    ppo_micro_batch_size: int = setting(16, "responses per forward/backward (gradient accumulation; no effect on the gradient)")
    ppo_epochs: int = setting(1, "passes over each rollout batch")
    lr: float = setting(1e-6, "AdamW learning rate")
    lr_warmup_steps: int = setting(10, "optimizer steps of linear warm-up, then constant")
    weight_decay: float = setting(0.1, "AdamW weight decay")
    grad_clip: float = setting(1.0, "max global gradient norm (<= 0: no clipping)")
    seed: int = setting(0, "seed for data order, sampling and initialisation")
    save_freq: int = setting(20, "checkpoint every N steps (and at the end; <= 0: only at the end)")
    test_freq: int = setting(10, "validate every N steps (and before the first and after the last; <= 0: only those)")
    log_samples_freq: int = setting(10, "log a table of sample completions every N steps (<= 0: never)")
    collapse_patience: int = setting(5, "stop when this many consecutive steps keep no informative group (<= 0: never)")
    output_dir: str = setting("runs", "root for checkpoints: <output_dir>/<experiment>/<run_name>/")
    run_name: str = setting("", "run name (empty: generated from the technique toggles and seed)")


@dataclass
class ValidationConfig:
    k: int = setting(4, "samples per held-out problem during training (avg@k)")
    temperature: float = setting(1.0, "validation sampling temperature")
    top_p: float = setting(0.7, "validation nucleus sampling (the DAPO paper evaluates with 0.7)")
    max_tokens: int = setting(0, "validation response limit (0: rollout.max_response_length)")


@dataclass
class EngineConfig:
    name: str = setting("torch", "training engine: torch (one process, DDP under torchrun) or deepspeed (ZeRO)", choices=TRAINING_ENGINES)
    device: str = setting("auto", "device for the torch engine (auto: cuda when available)", choices=("auto", "cpu", "cuda"))
    num_threads: int = setting(0, "torch CPU threads (0: torch's default)")
    zero_stage: int = setting(3, "DeepSpeed only: ZeRO stage 0-3 (0: plain data parallel, 1: optimizer states, 2: + gradients, 3: + parameters sharded)")
    offload_optimizer: bool = setting(False, "DeepSpeed only: keep optimizer states (and their update) in CPU memory")
    offload_params: bool = setting(False, "DeepSpeed ZeRO-3 only: keep sharded parameters in CPU memory between uses")
    optimizer: str = setting(
        "torch", "DeepSpeed only: the AdamW it steps: torch (torch.optim.AdamW, fused on CUDA, no compiler needed), fused_adam "
        "(DeepSpeed's FusedAdam, JIT-built with nvcc on first use) or cpu_adam (DeepSpeedCPUAdam, C++-built; with offload_optimizer)",
        choices=("torch", "fused_adam", "cpu_adam"),
    )
    gradient_checkpointing: bool = setting(False, "recompute activations in backward to save memory")
    shared_prompt_forward: bool = setting(
        True, "torch engine, Llama/Qwen2: compute each distinct prompt of a micro-batch once (its rows' responses attend to "
        "its keys/values) and logits only at response positions; same log-probs and gradients (other models: plain forward)",
    )
    logprob_chunk: int = setting(
        1024, "torch and DeepSpeed engines: score the output head this many tokens at a time (log-probs and entropy, forward and "
        "backward, each chunk's logits recomputed in the backward), so the [response tokens, vocabulary] logits never "
        "exist at once; the same numbers to float32 rounding (0: all tokens at once, the full logits kept)",
    )
    autocast: str = setting(
        "none", "torch engine: run the trainer's forwards (and so their backward) under torch.autocast in this dtype, "
        "parameters, gradients and AdamW staying float32 (mixed precision; TRL's default is bf16 autocast). Log-probs "
        "are then bfloat16 matmuls' (measured 1e-3 from float32 on the 1 M model, 3e-2 on SmolLM2-135M: dapo lint says "
        "where that moves an importance ratio); slow on a CPU without avx512_bf16/amx_bf16",
        choices=("none", "bfloat16"),
    )


@dataclass
class ClusterConfig:
    """The cluster a config is written for: what ``dapo train --dry-run`` plans for unless a flag says otherwise."""

    world_size: int = setting(0, "ranks (GPUs) the config is written for, planned by --dry-run (0: $WORLD_SIZE, else 1; --world-size overrides)")
    gpus_per_node: int = setting(8, "GPUs per node of that cluster (--gpus-per-node overrides)")
    gpu_memory_gib: float = setting(80.0, "memory of one of its GPUs in GiB (--gpu-memory-gib overrides)")


@dataclass
class TrackingConfig:
    backend: str = setting("mlflow", "where runs are recorded", choices=("mlflow", "null"))
    tracking_uri: str = setting("", "MLflow store (empty: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    experiment: str = setting("dapo", "MLflow experiment name")
    run_label: str = setting("", "MLflow run name shown in the UI (empty: the run directory's name); dapo ablate sets a short one per child")
    log_checkpoint: str = setting(
        "final", "copy checkpoints into MLflow's artifacts: the final one, none, or every saved one (each <= 64 MiB)",
        choices=("final", "none", "every"),
    )
    background: bool = setting(
        True, "write per-step metrics, sample tables and tags from a background thread (in order; drained before "
        "checkpoints, artifacts and the end of the run), so a step does not wait on the store",
    )


@dataclass
class EvalConfig:
    dataset: str = setting("aime24", "evaluation set: a registered name or a parquet/JSONL path")
    avg_k: int = setting(32, "samples per problem for avg@K")
    pass_k: list[int] = setting([1, 8, 32], "k values for unbiased pass@k (each <= avg_k)")
    temperature: float = setting(1.0, "sampling temperature (DAPO paper: 1.0)")
    top_p: float = setting(0.7, "nucleus sampling (DAPO paper: 0.7)")
    max_tokens: int = setting(20480, "maximum new tokens per response (DAPO paper: 20480)")
    verifier: str = setting("math_dapo", "answer checker", choices=("math_dapo", "strict_box", "math_equiv"))
    engine: str = setting(
        "fast", "rollout engine (fast: own decode loop, the training default too; hf: transformers generate; vllm: CUDA or "
        "vLLM's CPU build)", choices=ROLLOUT_ENGINES,
    )
    batch_size: int = setting(0, "sequences per generate call, whole problems (0: auto, 64 // avg_k problems per call; one problem's K when more)")
    seed: int = setting(0, "sampling seed")
    table_rows: int = setting(1000, "most samples in the MLflow generations table of dapo eval (0: none; AIME24 avg@32 is 960)")


@dataclass
class SlurmConfig:
    partition: str = setting("", "Slurm partition (empty: the cluster's default)")
    nodes: int = setting(1, "nodes per child job")
    gpus_per_node: int = setting(0, "GPUs per child job (0: none requested)")
    cpus_per_task: int = setting(2, "CPUs per child job (one task runs the child and its torchrun processes)")
    mem_gb: int = setting(0, "memory per child job in GB (0: the scheduler's default)")
    timeout_min: int = setting(240, "wall-time limit per child job in minutes")
    signal_delay_s: int = setting(
        300, "seconds before the time limit at which Slurm sends SIGUSR2: the child ends its step, saves a checkpoint "
        "and the job is requeued to resume it (allow one step and one checkpoint write)",
    )
    max_requeues: int = setting(3, "how many times a child's job is requeued after reaching its time limit")
    poll_s: float = setting(30.0, "seconds between the waiting driver's looks at its jobs (Slurm's sacct is asked at most this often)")
    folder: str = setting("runs/slurm", "where submitit keeps each job's script, pickles and logs")
    cluster: str = setting(
        "slurm", "submit to Slurm, or run the jobs as local processes (submitit's LocalExecutor: tests, one machine)",
        choices=("slurm", "local"),
    )


@dataclass
class AblateConfig:
    seeds: int = setting(1, "seeds per variant")
    launcher: str = setting(
        "local", "run children here, print one dapo train command per child, or submit one Slurm job per child",
        choices=("local", "print", "slurm"),
    )
    nproc: int = setting(1, "processes per child; > 1 launches each child with torchrun (torch DDP / DeepSpeed data parallel)")
    jobs: int = setting(
        1, "children trained at the same time by the local launcher, each as its own dapo train process "
        "(output in <ablation>/logs/); 1 = one after another in this process",
    )
    slurm: SlurmConfig = setting(SlurmConfig(), "the slurm launcher's job resources (through submitit)")


@dataclass
class DirectAdvantageConfig:
    """Direct Advantage-Based Policy Optimization (Liu et al. 2025, arXiv:2412.18279); used when ``algo: direct-advantage``."""

    iterations: int = setting(1, "rounds of generate -> mc_values -> critic -> advantages -> actor; each trained actor is the next round's reference")
    problems: int = setting(0, "training problems per iteration, drawn from data.train_files in seeded order (0: all of them)")
    samples_per_problem: int = setting(32, "solutions the generator (the iteration's reference policy) samples per problem (paper: 32)")
    chosen_per_problem: int = setting(6, "distinct solutions kept per problem, half right and half wrong where possible (paper: 6)")
    mc_completions: int = setting(16, "completions per solution prefix from the fixed completer; their success rate is the prefix's value target (paper: 16)")
    completer: str = setting("", "the fixed completer for Monte-Carlo values (empty: model.path, the initial policy, in every iteration)")
    step_delimiter: str = setting("\n", "text that ends a reasoning step (a run of it stays with the step before)")
    max_states_per_solution: int = setting(0, "prefixes of one solution given completions, evenly spaced from the problem alone (0: every prefix)")
    critic_path: str = setting("", "critic backbone: a save_pretrained causal LM (empty: a copy of model.path's transformer) under a new scalar head")
    critic_lr: float = setting(5e-6, "critic AdamW learning rate (paper: 5e-6)")
    critic_epochs: int = setting(1, "passes of the critic over the value targets (paper: 1)")
    critic_batch_size: int = setting(512, "prefixes per critic optimizer step (paper: 512)")
    critic_micro_batch_size: int = setting(64, "prefixes per critic forward/backward (gradient accumulation; no effect on the gradient)")
    critic_holdout: float = setting(0.1, "share of problems whose prefixes are held out of critic training for the calibration check")
    terminal_value: str = setting(
        "verifier", "value of a candidate step that ends the solution: the verifier's reward (exact), or the critic",
        choices=("verifier", "critic"),
    )
    min_gap: float = setting(0.1, "keep only states whose max - min advantage over candidate steps is at least this (paper: 0.1)")
    beta: float = setting(0.01, "advantage scale: the actor fits log(pi/pi_ref) of each step to A/beta (paper: 0.01; swept 0.002-0.1)")
    actor_lr: float = setting(5e-7, "actor AdamW learning rate (paper: 5e-7)")
    actor_epochs: int = setting(1, "passes of the actor over the advantage dataset")
    actor_batch_states: int = setting(64, "states per actor optimizer step; all candidate steps of a state share its batch")
    actor_micro_batch_size: int = setting(32, "candidate steps per actor forward/backward (gradient accumulation; no effect on the gradient)")
    weight_decay: float = setting(0.0, "AdamW weight decay of the critic and the actor")
    validate_sampled: bool = setting(True, "besides greedy accuracy, validate avg@k with the validation section's sampling")
    expected_steps: int = setting(0, "steps per solution assumed by --dry-run's cost estimate (0: a table over several step counts)")


@dataclass
class Config:
    """The whole resolved configuration of a run."""

    data: DataConfig = setting(DataConfig(), "training and validation data")
    model: ModelConfig = setting(ModelConfig(), "the policy")
    rollout: RolloutConfig = setting(RolloutConfig(), "sampling responses for training")
    algo: str = setting("dapo", "the RL algorithm: dapo (decoupled clip + dynamic sampling, online) or direct-advantage (step-level critic, offline)", choices=ALGOS)
    algorithm: AlgorithmConfig = setting(AlgorithmConfig(), "the DAPO objective and its techniques")
    direct_advantage: DirectAdvantageConfig = setting(DirectAdvantageConfig(), "Direct Advantage Policy Optimization (algo: direct-advantage)")
    reward: RewardConfig = setting(RewardConfig(), "scoring responses")
    trainer: TrainerConfig = setting(TrainerConfig(), "the RL loop and optimizer")
    validation: ValidationConfig = setting(ValidationConfig(), "held-out avg@k during training")
    engine: EngineConfig = setting(EngineConfig(), "where and how the policy is trained")
    cluster: ClusterConfig = setting(ClusterConfig(), "the cluster the config is written for (what dapo train --dry-run plans)")
    tracking: TrackingConfig = setting(TrackingConfig(), "experiment tracking")
    eval: EvalConfig = setting(EvalConfig(), "dapo eval defaults (the DAPO paper's AIME protocol)")
    ablate: AblateConfig = setting(AblateConfig(), "dapo ablate defaults")


PLANNING_SECTIONS: tuple[str, ...] = ("cluster",)
"""Sections that change no run's results (only what ``--dry-run`` plans for): left out of ablation ids, free to
change on ``--resume``, and absent from configs saved before they existed."""


def behaviour_correction(cfg: Config) -> bool:
    """True when the loss corrects for π_rollout ≠ π_old with ``algorithm.rollout_is.mode`` (by default each token
    weighted by min(π_old / π_rollout, C)): with ``algorithm.rollout_is.enable``, and always with asynchronous
    rollouts (``rollout.max_staleness > 0``), whose stale samples need the decoupled objective
    (:mod:`dapo_cli.algo.staleness`)."""
    return cfg.algorithm.rollout_is.enable or cfg.rollout.max_staleness > 0


def old_log_probs_from_update(cfg: Config) -> bool:
    """True when the update's own forwards can give log π_old and its entropy (no separate no-grad pass).

    With one epoch and one mini-batch per step (every trained group fits ``ppo_mini_batch_size``)
    the optimizer steps only after every micro-batch has run its forward, so each forward is
    π_old itself: its log-probs, detached, ARE the old log-probs (the ratio is exactly 1) and its
    entropy is the old policy's; with :func:`behaviour_correction` the same detached log-probs are
    π_prox of the decoupled objective, so its weights come from that forward too. Not with the KL
    term (its reference forward stays in :func:`dapo_cli.train.update.fill_old_log_probs`), nor with a correction that
    drops responses (:data:`ROW_DROPPING_CORRECTIONS`: which ones it drops must be known from π_old before the
    update's denominators). Decided from the config alone, so every rank agrees.
    """
    t = cfg.trainer
    most_groups = max(cfg.data.train_batch_size, cfg.data.gen_batch_size)  # trained groups in a step, at most
    drops = behaviour_correction(cfg) and cfg.algorithm.rollout_is.mode in ROW_DROPPING_CORRECTIONS
    return t.ppo_epochs == 1 and most_groups <= t.ppo_mini_batch_size and not cfg.algorithm.use_kl_loss and not drops


class ConfigError(UserError):
    """A config key or value the user must fix."""


def require(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless ``ok``."""
    if not ok:
        raise ConfigError(message)


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """``{"algorithm.clip_ratio_high": 0.28, ...}``: every leaf value by dotted key."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        dotted = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(value):
            out.update(flatten(value, dotted))
        else:
            out[dotted] = value
    return out


def is_section(tp: Any) -> bool:
    """True for a nested dataclass type (a config section)."""
    return hasattr(tp, "__dataclass_fields__")


__all__ = [name for name in dir() if name.endswith("Config")] + ["ConfigError", "flatten", "require", "setting", "is_section"]
