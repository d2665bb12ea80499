"""Cross-field validation: each check names the key and says how to fix it."""

from __future__ import annotations

from dapo_cli.config.schema import (  # noqa: F401 (ConfigError re-exported)
    LOCAL_ROLLOUT_ENGINES,
    Config,
    ConfigError,
    DataConfig,
    EngineConfig,
    LORA_ALL_LINEAR,
    flatten,
    require,
    uses_worker,
)
from dapo_cli.config.techniques import PAPER_CLIP_RATIO_HIGH, PAPER_CLIP_RATIO_LOW
from dapo_cli.config.validate_direct_advantage import check_direct_advantage

MAX_AVG_K = 4096
"""Most samples per problem ``dapo eval --avg`` / ``eval.avg_k`` accept (the DAPO protocol uses 32)."""


def sampling_problem(
    *, temperature: float, top_p: float, max_tokens: int, names: tuple[str, str, str], zero_tokens: str | None = None
) -> str | None:
    """What is wrong with sampling settings of validation or evaluation (None: nothing).

    ``names`` spell the three settings in the message (``validation.temperature`` or
    ``--temperature``); ``zero_tokens`` is what ``max_tokens = 0`` means where it is allowed.
    Temperature 0 is greedy decoding; below 0 is no temperature at all (it used to turn greedy silently).
    """
    t_name, p_name, m_name = names
    if not temperature >= 0.0:
        return f"{t_name}={temperature} must be >= 0 (0: greedy decoding; the DAPO paper samples at 1.0)"
    if not 0.0 < top_p <= 1.0:
        return f"{p_name}={top_p} must be in (0, 1] (1.0: no nucleus truncation; the DAPO paper evaluates with 0.7)"
    if max_tokens < (0 if zero_tokens else 1):
        allowed = f">= 0 ({zero_tokens})" if zero_tokens else ">= 1"
        return f"{m_name}={max_tokens} must be {allowed}"
    return None


def eval_problem(*, k: int, batch_size: int, names: tuple[str, str]) -> str | None:
    """What is wrong with ``dapo eval``'s samples per problem and batch size (None: nothing)."""
    k_name, b_name = names
    if k < 1:
        return f"{k_name}={k} must be >= 1"
    if k > MAX_AVG_K:
        return f"{k_name}={k} is more than {MAX_AVG_K} samples per problem; pass at most {MAX_AVG_K} (the DAPO protocol uses 32)"
    if batch_size < 0:
        return f"{b_name}={batch_size} must be >= 0 (0: auto, whole problems up to 64 sequences per generate call)"
    return None


def engine_problems(engine: EngineConfig) -> list[tuple[str, str]]:
    """Engine settings that cannot work together whatever the machine, as (check name, message):
    the training commands' preflight raises the first (:func:`check_engine`), a ``--dry-run`` plan
    lists them all as failed checks."""
    problems = []
    if engine.name != "deepspeed" and (engine.offload_optimizer or engine.offload_params):
        problems.append(("offload needs DeepSpeed", "CPU offload (engine.offload_optimizer / engine.offload_params) needs engine.name=deepspeed"))
    if engine.offload_params and engine.zero_stage != 3:
        problems.append(("offload_params needs ZeRO-3", "engine.offload_params needs engine.zero_stage=3 (parameters are sharded only at stage 3)"))
    if (problem := optimizer_problem(engine)) is not None:
        problems.append(("optimizer fits the engine", problem))
    return problems


def optimizer_problem(engine: EngineConfig) -> str | None:
    """``engine.optimizer`` against the engine and its offload (None: it fits): DeepSpeed's optimizers need DeepSpeed,
    FusedAdam steps GPU tensors (not the CPU partitions of ``offload_optimizer``), DeepSpeedCPUAdam CPU ones (only those)."""
    opt = engine.optimizer
    if opt != "torch" and engine.name != "deepspeed":
        return f"engine.optimizer={opt} is DeepSpeed's; set engine.name=deepspeed or engine.optimizer=torch"
    if opt == "fused_adam" and engine.offload_optimizer:
        return ("engine.optimizer=fused_adam steps GPU tensors, but engine.offload_optimizer keeps the optimizer states on the CPU; "
                "set engine.optimizer=cpu_adam (DeepSpeed's, C++-built) or engine.optimizer=torch (no compiler)")
    if opt == "cpu_adam" and not engine.offload_optimizer:
        return "engine.optimizer=cpu_adam steps CPU tensors: set engine.offload_optimizer=true, or engine.optimizer=torch / fused_adam"
    return None


def check_engine(engine: EngineConfig) -> None:
    """Raise the first of :func:`engine_problems`."""
    problems = engine_problems(engine)
    require(not problems, problems[0][1] if problems else "")


def lora_engine_problem(engine_name: str, lora_rank: int) -> str | None:
    """LoRA trains adapters on the torch engine only: the one place this rule is written. Validation reads it
    (:func:`lora_problem`), and so does ``components.build_training_engine``, which a config built in code reaches
    without validation (``train.loop.run_train`` does not validate)."""
    if lora_rank > 0 and engine_name != "torch":
        return f"model.lora.rank={lora_rank} trains adapters on the torch engine only; set engine.name=torch or model.lora.rank=0"
    return None


def lora_problem(cfg: Config) -> str | None:
    """What is wrong with ``model.lora`` for this run (None: nothing, or LoRA is off)."""
    lora = cfg.model.lora
    if lora.rank < 0:
        return f"model.lora.rank={lora.rank} must be >= 0 (0: off; rank <= 32 on all linear layers is the usual RL choice)"
    if lora.rank == 0:
        return None
    if not lora.alpha > 0:
        return f"model.lora.alpha={lora.alpha} must be > 0 (the update is scaled by alpha / rank; 32 is common)"
    if not 0.0 <= lora.dropout < 1.0:
        return f"model.lora.dropout={lora.dropout} must be in [0, 1) (0: none)"
    if not lora.target_modules or any(not str(m).strip() for m in lora.target_modules):
        return "model.lora.target_modules is empty or has an empty name; use [all-linear] or names like q_proj, v_proj"
    if LORA_ALL_LINEAR in lora.target_modules and len(lora.target_modules) > 1:
        return f"model.lora.target_modules={lora.target_modules}: {LORA_ALL_LINEAR} already takes every linear layer; give it alone"
    if (problem := lora_engine_problem(cfg.engine.name, lora.rank)) is not None:
        return problem
    if cfg.algo != "dapo":
        return f"model.lora.rank={lora.rank} is supported by algo=dapo only; set model.lora.rank=0 for algo={cfg.algo}"
    return None


def check_world_size(data: DataConfig, world_size: int) -> None:
    """Every rank generates an equal share of each round's prompts.

    Mini-batches need no such condition: they are drawn from all ranks' groups, and a rank that
    holds fewer of the chosen groups runs empty micro-batches in lockstep (``train.update.update_policy``).
    """
    if world_size == 1:
        return
    per_round = data.prompts_per_round
    if per_round % world_size:
        raise ConfigError(
            f"data.gen_batch_size (or train_batch_size)={per_round} is not divisible by the world size {world_size}; "
            f"pick a multiple of {world_size}"
        )


INT64_MAX = 2**63 - 1
"""The largest whole-number setting: what torch (a seed, a step, a size) and the files dapo writes can hold."""


def check_int_ranges(cfg: Config) -> None:
    """Every whole-number setting within 64 bits (``trainer.seed: 10**30`` passed validation and overflowed in
    ``torch.manual_seed``; ``trainer.total_steps: 10**30`` was planned)."""
    for key, value in flatten(cfg).items():
        if isinstance(value, int) and not isinstance(value, bool):
            require(-INT64_MAX - 1 <= value <= INT64_MAX,
                    f"{key}={value:.3g} is past what 64 bits hold (|value| < 9.2e18); give a smaller number")


def validate(cfg: Config) -> None:
    """Reject configs that cannot run or cannot mean what they say."""
    check_int_ranges(cfg)
    check_direct_advantage(cfg)  # algo, and the section of the one it does not use (first: its message is the one that helps)
    algo, rollout, trainer, data = cfg.algorithm, cfg.rollout, cfg.trainer, cfg.data
    require(0.0 < algo.clip_ratio_low < 1.0, f"algorithm.clip_ratio_low={algo.clip_ratio_low} must be in (0, 1); the paper uses {PAPER_CLIP_RATIO_LOW}")
    require(algo.clip_ratio_high >= 0.0, f"algorithm.clip_ratio_high={algo.clip_ratio_high} must be >= 0; the paper uses {PAPER_CLIP_RATIO_HIGH} (set it equal to clip_ratio_low to turn clip-higher off)")
    require(
        not algo.clip_inverted,
        f"algorithm.clip_ratio_high={algo.clip_ratio_high} must be >= algorithm.clip_ratio_low={algo.clip_ratio_low}; "
        f"equal turns clip-higher off (the paper uses {PAPER_CLIP_RATIO_HIGH} vs {PAPER_CLIP_RATIO_LOW})",
    )
    require(algo.clip_ratio_c is None or algo.clip_ratio_c > 1.0, f"algorithm.clip_ratio_c={algo.clip_ratio_c} must be > 1 (e.g. 3.0) or null to turn the dual clip off")
    buf = algo.overlong_buffer
    if buf.enable and cfg.algo == "dapo":  # direct-advantage shapes no reward by length
        require(0 < buf.len <= rollout.max_response_length, f"algorithm.overlong_buffer.len={buf.len} must be in (0, rollout.max_response_length={rollout.max_response_length}]; lower it or raise max_response_length")
        require(buf.penalty_factor >= 0.0, f"algorithm.overlong_buffer.penalty_factor={buf.penalty_factor} must be >= 0")
    require(rollout.n >= 2, f"rollout.n={rollout.n}: group advantages ({algo.adv_estimator}) need at least 2 responses per prompt; set rollout.n >= 2")
    require(rollout.max_response_length >= 1, "rollout.max_response_length must be >= 1")
    require(rollout.temperature > 0.0, f"rollout.temperature={rollout.temperature} must be > 0 for on-policy sampling")
    require(0.0 < rollout.top_p <= 1.0, f"rollout.top_p={rollout.top_p} must be in (0, 1]")
    require(rollout.top_k >= 0, "rollout.top_k must be >= 0 (0 = off)")
    require(rollout.batch_size >= 0, "rollout.batch_size must be >= 0 (0 = all at once)")
    require(0.0 < rollout.gpu_memory_utilization <= 1.0, f"rollout.gpu_memory_utilization={rollout.gpu_memory_utilization} must be in (0, 1]; colocated with training, 0.4-0.6 is typical")
    require(rollout.kv_cache_gib is None or rollout.kv_cache_gib > 0, f"rollout.kv_cache_gib={rollout.kv_cache_gib} must be > 0 (GiB) or null to size it from the round")
    require(rollout.tensor_parallel_size >= 1, f"rollout.tensor_parallel_size={rollout.tensor_parallel_size} must be >= 1")
    require(rollout.sleep_level in (0, 1, 2), f"rollout.sleep_level={rollout.sleep_level} must be 0 (awake), 1 or 2")
    require(rollout.max_staleness >= 0, f"rollout.max_staleness={rollout.max_staleness} must be >= 0 (0: synchronous)")
    require(rollout.worker_threads >= 0, f"rollout.worker_threads={rollout.worker_threads} must be >= 0 (0: half the cores)")
    require(
        rollout.worker != "inline" or rollout.max_staleness == 0,
        f"rollout.max_staleness={rollout.max_staleness} needs the rollout worker process; set rollout.worker=process (or auto), or max_staleness=0",
    )
    require(
        rollout.engine in LOCAL_ROLLOUT_ENGINES or not uses_worker(rollout),
        f"the rollout worker process runs the {' or '.join(LOCAL_ROLLOUT_ENGINES)} engine, not {rollout.engine}; "
        "set rollout.engine=fast (or rollout.max_staleness=0 and rollout.worker=auto)",
    )
    require(algo.rollout_is.cap >= 1.0, f"algorithm.rollout_is.cap={algo.rollout_is.cap} must be >= 1 (weights above it are truncated; 2.0 is common)")
    ris, gspo, cispo, gmpo = algo.rollout_is, algo.gspo, algo.cispo, algo.gmpo
    require(ris.geo_bound > 1.0, f"algorithm.rollout_is.geo_bound={ris.geo_bound} must be > 1 (responses whose geometric-mean ratio leaves [1/c, c] are dropped; verl uses 1.001)")
    require(ris.opsm_delta >= 0.0, f"algorithm.rollout_is.opsm_delta={ris.opsm_delta} must be >= 0 (slime's default 1e-4)")
    require(0.0 <= gspo.clip_ratio_low < 1.0, f"algorithm.gspo.clip_ratio_low={gspo.clip_ratio_low} must be in [0, 1); the GSPO paper uses 3e-4")
    require(
        gspo.clip_ratio_high >= 0.0, f"algorithm.gspo.clip_ratio_high={gspo.clip_ratio_high} must be >= 0; the GSPO paper uses 4e-4",
    )
    require(cispo.clip_ratio_high > 0.0, f"algorithm.cispo.clip_ratio_high={cispo.clip_ratio_high} must be > 0 (the IS weight's cap is 1 + it; 3.0 caps it at 4)")
    require(
        cispo.clip_ratio_low is None or 0.0 < cispo.clip_ratio_low <= 1.0,
        f"algorithm.cispo.clip_ratio_low={cispo.clip_ratio_low} must be in (0, 1], or null for no lower bound (MiniMax-M1's choice)",
    )
    for side, value in (("log_clip_low", gmpo.log_clip_low), ("log_clip_high", gmpo.log_clip_high)):
        require(value > 0.0, f"algorithm.gmpo.{side}={value} must be > 0 (the clip range in log space; the GMPO paper uses 0.4)")
    require(bool(data.train_files), "data.train_files is empty; give at least one dataset")
    cluster = cfg.cluster
    require(cluster.world_size >= 0, f"cluster.world_size={cluster.world_size} must be >= 0 (0: $WORLD_SIZE, else 1)")
    require(cluster.gpus_per_node >= 1, f"cluster.gpus_per_node={cluster.gpus_per_node} must be >= 1")
    require(cluster.gpu_memory_gib > 0, f"cluster.gpu_memory_gib={cluster.gpu_memory_gib} must be > 0")
    for files, size_key, size in (
        ("data.train_files", "data.synthetic_train_size", data.synthetic_train_size),
        ("data.val_files", "data.synthetic_val_size", data.synthetic_val_size),
    ):
        synthetic = [f for f in getattr(data, files.split(".")[1]) if f.startswith("synthetic:")]
        if synthetic:
            require(size >= 1, f"{size_key}={size} must be >= 1: {files} generates {synthetic[0]} with that many problems")
    require(data.train_batch_size >= 1, "data.train_batch_size must be >= 1")
    require(data.gen_batch_size >= 0, "data.gen_batch_size must be >= 0 (0 = train_batch_size)")
    require(trainer.ppo_mini_batch_size >= 1, "trainer.ppo_mini_batch_size must be >= 1")
    require(
        data.train_batch_size % trainer.ppo_mini_batch_size == 0,
        f"data.train_batch_size={data.train_batch_size} must be a multiple of trainer.ppo_mini_batch_size={trainer.ppo_mini_batch_size}",
    )
    require(trainer.ppo_micro_batch_size >= 1, "trainer.ppo_micro_batch_size must be >= 1")
    require(trainer.ppo_epochs >= 1, "trainer.ppo_epochs must be >= 1")
    require(trainer.total_steps >= 1, "trainer.total_steps must be >= 1")
    require(trainer.lr > 0.0, f"trainer.lr={trainer.lr} must be > 0")
    require(trainer.lr_warmup_steps >= 0, "trainer.lr_warmup_steps must be >= 0")
    require(cfg.validation.k >= 1, f"validation.k={cfg.validation.k} must be >= 1")
    require(0.0 < cfg.validation.top_p <= 1.0, "validation.top_p must be in (0, 1]")
    v, ev = cfg.validation, cfg.eval
    for problem in (
        sampling_problem(
            temperature=v.temperature, top_p=v.top_p, max_tokens=v.max_tokens,
            names=("validation.temperature", "validation.top_p", "validation.max_tokens"), zero_tokens="0: rollout.max_response_length",
        ),
        sampling_problem(
            temperature=ev.temperature, top_p=ev.top_p, max_tokens=ev.max_tokens,
            names=("eval.temperature", "eval.top_p", "eval.max_tokens"),
        ),
        eval_problem(k=ev.avg_k, batch_size=ev.batch_size, names=("eval.avg_k", "eval.batch_size")),
    ):
        require(problem is None, problem or "")
    bad = [k for k in cfg.eval.pass_k if not 1 <= k]
    require(not bad, f"eval.pass_k has values < 1: {bad}")
    require(cfg.ablate.seeds >= 1, "ablate.seeds must be >= 1")
    require(cfg.ablate.nproc >= 1, f"ablate.nproc={cfg.ablate.nproc} must be >= 1 (1: each child in one process, N: torchrun with N)")
    require(cfg.ablate.jobs >= 1, f"ablate.jobs={cfg.ablate.jobs} must be >= 1 (--jobs N: children trained at once; 1: one after another)")
    slurm = cfg.ablate.slurm
    require(slurm.nodes >= 1, f"ablate.slurm.nodes={slurm.nodes} must be >= 1")
    require(slurm.gpus_per_node >= 0, f"ablate.slurm.gpus_per_node={slurm.gpus_per_node} must be >= 0 (0: no GPUs)")
    require(slurm.cpus_per_task >= 1, f"ablate.slurm.cpus_per_task={slurm.cpus_per_task} must be >= 1")
    require(slurm.mem_gb >= 0, f"ablate.slurm.mem_gb={slurm.mem_gb} must be >= 0 (0: the scheduler's default)")
    require(slurm.timeout_min >= 1, f"ablate.slurm.timeout_min={slurm.timeout_min} must be >= 1")
    require(0 <= slurm.signal_delay_s < slurm.timeout_min * 60,
            f"ablate.slurm.signal_delay_s={slurm.signal_delay_s} must be >= 0 and below the time limit "
            f"(ablate.slurm.timeout_min={slurm.timeout_min}: {slurm.timeout_min * 60} s)")
    require(slurm.poll_s > 0, f"ablate.slurm.poll_s={slurm.poll_s} must be > 0 (seconds)")
    require(slurm.max_requeues >= 0, f"ablate.slurm.max_requeues={slurm.max_requeues} must be >= 0 (0: never requeued)")
    require(bool(slurm.folder.strip()), "ablate.slurm.folder is empty; give a directory for submitit's logs (default runs/slurm)")
    tiny = cfg.model.tiny
    for key, value, low in (
        ("hidden_size", tiny.hidden_size, 1), ("num_layers", tiny.num_layers, 1), ("num_heads", tiny.num_heads, 1),
        ("intermediate_size", tiny.intermediate_size, 1), ("max_position_embeddings", tiny.max_position_embeddings, 1),
        ("sft_steps", tiny.sft_steps, 0), ("sft_batch_size", tiny.sft_batch_size, 1), ("sft_warmup_steps", tiny.sft_warmup_steps, 0),
        ("eval_problems", tiny.eval_problems, 1), ("eval_max_tokens", tiny.eval_max_tokens, 1),
    ):
        require(value >= low, f"model.tiny.{key}={value} must be >= {low}")
    require(
        tiny.hidden_size % tiny.num_heads == 0,
        f"model.tiny.hidden_size={tiny.hidden_size} must be divisible by model.tiny.num_heads={tiny.num_heads}",
    )
    require(tiny.rope_theta > 0.0, f"model.tiny.rope_theta={tiny.rope_theta} must be > 0")
    require(tiny.sft_lr > 0.0, f"model.tiny.sft_lr={tiny.sft_lr} must be > 0")
    require(0.0 <= tiny.sft_direct_frac <= 1.0, f"model.tiny.sft_direct_frac={tiny.sft_direct_frac} must be in [0, 1]")
    require(0.0 <= tiny.sft_loop_frac <= 1.0, f"model.tiny.sft_loop_frac={tiny.sft_loop_frac} must be in [0, 1]")
    require(0.0 <= tiny.sft_loop_continue < 1.0,
            f"model.tiny.sft_loop_continue={tiny.sft_loop_continue} must be in [0, 1) (1 would never end a loop)")
    require(tiny.sft_loop_max_chars >= 1, f"model.tiny.sft_loop_max_chars={tiny.sft_loop_max_chars} must be >= 1")
    lora = lora_problem(cfg)
    require(lora is None, lora or "")
    engine = cfg.engine
    require(
        engine.zero_stage in (0, 1, 2, 3),
        f"engine.zero_stage={engine.zero_stage} is not a ZeRO stage; use 0, 1, 2 or 3 (3 shards parameters too)",
    )
    require(engine.num_threads >= 0, f"engine.num_threads={engine.num_threads} must be >= 0 (0: torch's default)")
    require(engine.logprob_chunk >= 0, f"engine.logprob_chunk={engine.logprob_chunk} must be >= 0 (0: the full logits at once)")
    require(
        engine.name != "deepspeed" or engine.autocast == "none",
        "engine.autocast is the torch engine's mixed precision; with DeepSpeed set model.dtype=bfloat16 (its bf16 mode) "
        "and engine.autocast=none",
    )
