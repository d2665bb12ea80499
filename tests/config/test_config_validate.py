"""Tests for ``dapo_cli.config.validate``: every check fails with the key and the fix, and its boundary passes.

Configs are built from the schema defaults (the paper's values) and changed
field by field, so these tests do not depend on ``experiments/tiny.yaml``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dapo_cli.config import Config, ConfigError
from dapo_cli.config.validate import validate


def changed(**paths: object) -> Config:
    """``Config()`` with ``section__field[__sub]=value`` changes applied."""
    cfg = Config()
    for path, value in paths.items():
        *parents, leaf = path.split("__")
        node: object = cfg
        for name in parents:
            node = getattr(node, name)
        assert hasattr(node, leaf), path
        setattr(node, leaf, value)
    return cfg


def test_schema_defaults_are_valid() -> None:
    validate(Config())


# (changes, fragment of the message): each must name the key and say what to do
INVALID: list[tuple[dict[str, object], str]] = [
    # the classes the issue names
    ({"algorithm__clip_ratio_high": -0.01}, "algorithm.clip_ratio_high=-0.01 must be >= 0; the paper uses 0.28"),
    (
        {"algorithm__overlong_buffer__len": 20481},
        "algorithm.overlong_buffer.len=20481 must be in (0, rollout.max_response_length=20480]; lower it or raise max_response_length",
    ),
    ({"rollout__n": 1}, "rollout.n=1: group advantages (grpo) need at least 2 responses per prompt; set rollout.n >= 2"),
    ({"rollout__n": 0, "algorithm__adv_estimator": "rloo"}, "rollout.n=0: group advantages (rloo) need at least 2"),
    (
        {"data__train_batch_size": 500},
        "data.train_batch_size=500 must be a multiple of trainer.ppo_mini_batch_size=32",
    ),
    # the rest
    ({"algorithm__clip_ratio_low": 0.0}, "algorithm.clip_ratio_low=0.0 must be in (0, 1); the paper uses 0.2"),
    ({"algorithm__clip_ratio_low": 1.0}, "algorithm.clip_ratio_low=1.0 must be in (0, 1)"),
    ({"algorithm__clip_ratio_c": 1.0}, "algorithm.clip_ratio_c=1.0 must be > 1 (e.g. 3.0) or null"),
    ({"algorithm__overlong_buffer__len": 0}, "algorithm.overlong_buffer.len=0 must be in (0,"),
    ({"algorithm__overlong_buffer__penalty_factor": -1.0}, "algorithm.overlong_buffer.penalty_factor=-1.0 must be >= 0"),
    ({"rollout__max_response_length": 0, "algorithm__overlong_buffer__enable": False}, "rollout.max_response_length must be >= 1"),
    ({"rollout__temperature": 0.0}, "rollout.temperature=0.0 must be > 0"),
    ({"rollout__top_p": 0.0}, "rollout.top_p=0.0 must be in (0, 1]"),
    ({"rollout__top_p": 1.01}, "rollout.top_p=1.01 must be in (0, 1]"),
    ({"rollout__top_k": -1}, "rollout.top_k must be >= 0 (0 = off)"),
    ({"rollout__batch_size": -1}, "rollout.batch_size must be >= 0"),
    ({"data__train_files": []}, "data.train_files is empty; give at least one dataset"),
    ({"data__train_batch_size": 0}, "data.train_batch_size must be >= 1"),
    ({"trainer__ppo_mini_batch_size": 0}, "trainer.ppo_mini_batch_size must be >= 1"),
    ({"trainer__ppo_micro_batch_size": 0}, "trainer.ppo_micro_batch_size must be >= 1"),
    ({"trainer__ppo_epochs": 0}, "trainer.ppo_epochs must be >= 1"),
    ({"trainer__total_steps": 0}, "trainer.total_steps must be >= 1"),
    ({"trainer__lr": 0.0}, "trainer.lr=0.0 must be > 0"),
    ({"trainer__lr": float("nan")}, "trainer.lr=nan must be > 0"),
    ({"trainer__lr_warmup_steps": -1}, "trainer.lr_warmup_steps must be >= 0"),
    ({"validation__k": 0}, "validation.k=0 must be >= 1"),
    ({"validation__top_p": 0.0}, "validation.top_p must be in (0, 1]"),
    ({"eval__avg_k": 0}, "eval.avg_k=0 must be >= 1"),
    ({"eval__pass_k": [1, 0, -2]}, "eval.pass_k has values < 1: [0, -2]"),
    ({"ablate__seeds": 0}, "ablate.seeds must be >= 1"),
    ({"ablate__nproc": 0}, "ablate.nproc=0 must be >= 1"),
    ({"ablate__jobs": 0}, "ablate.jobs=0 must be >= 1 (--jobs N: children trained at once; 1: one after another)"),
    ({"ablate__slurm__nodes": 0}, "ablate.slurm.nodes=0 must be >= 1"),
    ({"ablate__slurm__gpus_per_node": -1}, "ablate.slurm.gpus_per_node=-1 must be >= 0"),
    ({"ablate__slurm__cpus_per_task": 0}, "ablate.slurm.cpus_per_task=0 must be >= 1"),
    ({"ablate__slurm__mem_gb": -1}, "ablate.slurm.mem_gb=-1 must be >= 0 (0: the scheduler's default)"),
    ({"ablate__slurm__timeout_min": 0}, "ablate.slurm.timeout_min=0 must be >= 1"),
    ({"ablate__slurm__timeout_min": 5}, "ablate.slurm.signal_delay_s=300 must be >= 0 and below the time limit "
     "(ablate.slurm.timeout_min=5: 300 s)"),
    ({"ablate__slurm__signal_delay_s": -1}, "ablate.slurm.signal_delay_s=-1 must be >= 0"),
    ({"ablate__slurm__max_requeues": -1}, "ablate.slurm.max_requeues=-1 must be >= 0 (0: never requeued)"),
    ({"ablate__slurm__folder": " "}, "ablate.slurm.folder is empty"),
    ({"engine__zero_stage": 4}, "engine.zero_stage=4 is not a ZeRO stage; use 0, 1, 2 or 3"),
    ({"engine__num_threads": -1}, "engine.num_threads=-1 must be >= 0"),
    ({"rollout__gpu_memory_utilization": 0.0}, "rollout.gpu_memory_utilization=0.0 must be in (0, 1]"),
    ({"rollout__gpu_memory_utilization": 1.5}, "rollout.gpu_memory_utilization=1.5 must be in (0, 1]"),
    ({"rollout__kv_cache_gib": 0.0}, "rollout.kv_cache_gib=0.0 must be > 0 (GiB) or null"),
    ({"rollout__kv_cache_gib": -2.0}, "rollout.kv_cache_gib=-2.0 must be > 0 (GiB) or null"),
    ({"rollout__tensor_parallel_size": 0}, "rollout.tensor_parallel_size=0 must be >= 1"),
    ({"rollout__sleep_level": 3}, "rollout.sleep_level=3 must be 0 (awake), 1 or 2"),
    ({"algorithm__rollout_is__cap": 0.5}, "algorithm.rollout_is.cap=0.5 must be >= 1"),
    # an inverted clip, sampling of validation and eval, synthetic sizes, the tiny model
    (
        {"algorithm__clip_ratio_high": 0.1},
        "algorithm.clip_ratio_high=0.1 must be >= algorithm.clip_ratio_low=0.2; equal turns clip-higher off",
    ),
    ({"algorithm__clip_ratio_high": 0.0}, "algorithm.clip_ratio_high=0.0 must be >= algorithm.clip_ratio_low=0.2"),
    ({"validation__max_tokens": -7}, "validation.max_tokens=-7 must be >= 0 (0: rollout.max_response_length)"),
    ({"validation__temperature": -1.0}, "validation.temperature=-1.0 must be >= 0 (0: greedy decoding"),
    ({"eval__temperature": -0.5}, "eval.temperature=-0.5 must be >= 0"),
    ({"eval__top_p": 0.0}, "eval.top_p=0.0 must be in (0, 1]"),
    ({"eval__top_p": 1.5}, "eval.top_p=1.5 must be in (0, 1]"),
    ({"eval__max_tokens": 0}, "eval.max_tokens=0 must be >= 1"),
    ({"eval__batch_size": -3}, "eval.batch_size=-3 must be >= 0"),
    ({"eval__avg_k": 10**12}, "eval.avg_k=1000000000000 is more than 4096 samples per problem"),
    ({"data__synthetic_val_size": 0}, "data.synthetic_val_size=0 must be >= 1: data.val_files generates synthetic:add-3digit"),
    ({"data__synthetic_train_size": -1}, "data.synthetic_train_size=-1 must be >= 1: data.train_files generates"),
    ({"model__tiny__hidden_size": 0}, "model.tiny.hidden_size=0 must be >= 1"),
    ({"model__tiny__hidden_size": 30}, "model.tiny.hidden_size=30 must be divisible by model.tiny.num_heads=4"),
    ({"model__tiny__sft_direct_frac": 1.5}, "model.tiny.sft_direct_frac=1.5 must be in [0, 1]"),
    ({"model__tiny__sft_loop_frac": -0.1}, "model.tiny.sft_loop_frac=-0.1 must be in [0, 1]"),
    ({"model__tiny__sft_loop_continue": 1.0}, "model.tiny.sft_loop_continue=1.0 must be in [0, 1) (1 would never end a loop)"),
    ({"rollout__max_staleness": -1}, "rollout.max_staleness=-1 must be >= 0 (0: synchronous)"),
    ({"rollout__worker_threads": -2}, "rollout.worker_threads=-2 must be >= 0 (0: half the cores)"),
    ({"rollout__max_staleness": 1, "rollout__worker": "inline"}, "rollout.max_staleness=1 needs the rollout worker process; set rollout.worker=process"),
    ({"rollout__max_staleness": 2, "rollout__engine": "vllm"}, "the rollout worker process runs the fast or hf engine, not vllm"),
    ({"rollout__worker": "process", "rollout__engine": "vllm"}, "the rollout worker process runs the fast or hf engine, not vllm"),
    ({"model__lora__rank": -1}, "model.lora.rank=-1 must be >= 0 (0: off"),
    ({"model__lora__rank": 4, "model__lora__alpha": 0.0}, "model.lora.alpha=0.0 must be > 0"),
    ({"model__lora__rank": 4, "model__lora__dropout": 1.0}, "model.lora.dropout=1.0 must be in [0, 1)"),
    ({"model__lora__rank": 4, "model__lora__dropout": -0.1}, "model.lora.dropout=-0.1 must be in [0, 1)"),
    ({"model__lora__rank": 4, "model__lora__target_modules": []}, "model.lora.target_modules is empty or has an empty name; use [all-linear]"),
    ({"model__lora__rank": 4, "model__lora__target_modules": ["all-linear", "q_proj"]}, "all-linear already takes every linear layer; give it alone"),
    ({"model__lora__rank": 4, "engine__name": "deepspeed"}, "model.lora.rank=4 trains adapters on the torch engine only; set engine.name=torch"),
    ({"model__lora__rank": 4, "algo": "direct-advantage"}, "model.lora.rank=4 is supported by algo=dapo only; set model.lora.rank=0"),
]


@pytest.mark.parametrize(("changes", "message"), INVALID, ids=[next(iter(c)) for c, _ in INVALID])
def test_invalid_value_names_the_key_and_the_fix(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate(changed(**changes))
    assert message in str(info.value)


VALID_BOUNDARIES: list[dict[str, object]] = [
    {"algorithm__clip_ratio_high": 0.2},  # = clip_ratio_low: clip-higher off
    {"validation__max_tokens": 0},  # 0: rollout.max_response_length
    {"validation__temperature": 0.0, "eval__temperature": 0.0},  # greedy
    {"eval__avg_k": 4096, "eval__batch_size": 0},
    {"data__synthetic_val_size": 0, "data__val_files": []},  # no synthetic set: the size is unused
    {"algorithm__overlong_buffer__len": 20480},  # = max_response_length
    {"algorithm__overlong_buffer__len": 99999, "algorithm__overlong_buffer__enable": False},  # unchecked when off
    {"algorithm__overlong_buffer__penalty_factor": 0.0},
    {"algorithm__clip_ratio_c": 1.0001},
    {"algorithm__clip_ratio_c": None},
    {"rollout__n": 2},
    {"rollout__top_p": 1.0},
    {"rollout__top_k": 0},
    {"data__train_batch_size": 32},  # = ppo_mini_batch_size
    {"data__train_batch_size": 64, "trainer__ppo_mini_batch_size": 64},
    {"trainer__lr_warmup_steps": 0},
    {"eval__pass_k": [1]},
    {"engine__zero_stage": 0},
    {"rollout__max_staleness": 0, "rollout__worker": "inline", "rollout__engine": "vllm"},  # synchronous vLLM
    {"rollout__max_staleness": 0, "rollout__worker": "process"},  # the synchronous loop in the worker process
    {"rollout__max_staleness": 3, "rollout__engine": "hf", "rollout__worker_threads": 1},
    {"model__lora__rank": 0, "model__lora__alpha": -1.0, "model__lora__target_modules": []},  # unchecked when off
    {"model__lora__rank": 4, "model__lora__dropout": 0.0, "algorithm__use_kl_loss": True},  # the reference is the base
    {"model__lora__rank": 32, "model__lora__dropout": 0.999, "model__lora__target_modules": ["q_proj", "v_proj"]},
]


@pytest.mark.parametrize("changes", VALID_BOUNDARIES, ids=[",".join(c) for c in VALID_BOUNDARIES])
def test_boundary_values_pass(changes: dict[str, object]) -> None:
    validate(changed(**changes))


@pytest.mark.parametrize(
    ("tweak", "fragment"),
    [
        (lambda c: setattr(c.algorithm, "clip_ratio_high", -1.0), "clip_ratio_high"),
        (lambda c: setattr(c.rollout, "n", 1), "rollout.n"),
    ],
)
def test_errors_are_one_line(tweak: Callable[[Config], None], fragment: str) -> None:
    cfg = Config()
    tweak(cfg)
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_the_rollout_worker_and_the_trainer_split_the_cores() -> None:
    from dapo_cli.config.schema import RolloutConfig, thread_split

    # 0 means: the worker half the cores (at least one), the trainer the rest (at least one)
    assert thread_split(RolloutConfig(), 0, cores=2) == (1, 1)
    assert thread_split(RolloutConfig(), 0, cores=16) == (8, 8)
    assert thread_split(RolloutConfig(), 0, cores=1) == (1, 1)  # oversubscribed rather than none
    assert thread_split(RolloutConfig(worker_threads=3), 0, cores=8) == (5, 3)
    assert thread_split(RolloutConfig(worker_threads=1), 4, cores=2) == (4, 1)  # explicit settings win
