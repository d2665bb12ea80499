"""Round sources (``dapo_cli/train/rounds.py``): the staleness rule in ``collect_batch``, the worker process's rounds,
and where the checkpointed prompt stream points when rounds were drawn ahead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from fakes import ScriptedRollout  # noqa: E402

from dapo_cli.config import apply_techniques, load_config  # noqa: E402
from dapo_cli.data.loader import Prompt, PromptStream  # noqa: E402
from dapo_cli.engine.dist import SingleProcess  # noqa: E402
from dapo_cli.train.rounds import InlineRounds, Round, RoundPlanner, WorkerRounds  # noqa: E402
from dapo_cli.train import collect_batch  # noqa: E402

PROMPTS = [Prompt(text=f"p{k}", ground_truth=str(k), problem_id=str(k)) for k in range(40)]


def mixed(prompt: str, j: int) -> tuple[str, int, bool]:
    """Every group informative: samples 0-1 right, 2-3 wrong."""
    k = int(prompt[1:])
    return (f"Answer: {k if j < 2 else k + 100}", 4, False)


def config(*sets: str):
    return load_config(None, [
        "rollout.n=4", "data.train_batch_size=2", "trainer.ppo_mini_batch_size=2", "rollout.max_response_length=10",
        "algorithm.overlong_buffer.len=4", *sets,
    ])


class VersionedRounds:
    """A round source whose rounds carry the versions a test chooses (what a worker that ran ahead returns)."""

    def __init__(self, cfg, versions: list[int]) -> None:
        self.inline = InlineRounds(ScriptedRollout(mixed), PromptStream(PROMPTS, seed=0, shuffle=False), cfg)
        self.versions = list(versions)
        self.served: list[list[str]] = []

    def next_round(self, step: int) -> Round:
        rnd = self.inline.next_round(step)
        rnd.version = self.versions.pop(0)
        self.served.append([p.text for p in rnd.prompts])
        return rnd


def test_rounds_older_than_the_bound_are_dropped_whole_and_counted_never_trained():
    cfg = config("rollout.max_staleness=1")
    # step 5 updates version 4: rounds of versions 2 (lag 2) and 1 (lag 3) are too old, then 3 (lag 1) is kept
    source = VersionedRounds(cfg, [2, 1, 3])
    collected = collect_batch(source, cfg, step=5, pad_id=0, worker=True)
    assert source.served == [["p0", "p1"], ["p2", "p3"], ["p4", "p5"]]
    assert sorted(set(collected.batch.ground_truths)) == ["4", "5"]  # only the fresh round's groups
    assert collected.batch.versions.tolist() == [3] * 8
    assert collected.metrics["async/stale_groups_dropped"] == 4.0
    assert collected.metrics["train/num_gen_batches"] == 1.0  # dropped rounds are not examined
    assert collected.rounds_used == 1  # what the loop reads: the same count, typed


def test_dynamic_sampling_takes_fresh_rounds_until_the_batch_is_full():
    cfg = config("rollout.max_staleness=2", "data.train_batch_size=4", "data.gen_batch_size=2", "trainer.ppo_mini_batch_size=4")
    source = VersionedRounds(cfg, [6, 9, 7])  # step 10 updates version 9: lags 3 (dropped), 0 and 2 (kept)
    collected = collect_batch(source, cfg, step=10, pad_id=0, worker=True)
    assert collected.metrics["train/num_gen_batches"] == 2.0
    assert collected.rounds_used == 2
    assert collected.metrics["async/stale_groups_dropped"] == 2.0
    assert sorted(set(collected.batch.ground_truths), key=int) == ["2", "3", "4", "5"]
    assert sorted(collected.batch.versions.tolist()) == [7] * 8 + [9] * 8
    # group ids number the examined rounds (0-1, then 2-3), as in the synchronous loop
    assert sorted(set(collected.batch.group_ids.tolist())) == [0, 1, 2, 3]


def test_the_synchronous_loop_has_no_staleness_rule_and_no_async_metrics():
    cfg = config()
    collected = collect_batch(InlineRounds(ScriptedRollout(mixed), PromptStream(PROMPTS, seed=0, shuffle=False), cfg), cfg,
                              step=3, pad_id=0)
    assert collected.batch.versions.tolist() == [0] * 8  # the inline source's weights: version 0 until an update
    assert not any(k.startswith("async/") for k in collected.metrics)


def test_the_planner_gives_each_step_the_synchronous_loops_seeds_whatever_is_planned_ahead():
    from dapo_cli.runs import derive_seed

    cfg = config("trainer.seed=7")
    planner = RoundPlanner(PromptStream(PROMPTS, seed=0, shuffle=False), cfg, SingleProcess(), seeds_per_prompt=False)
    seeds = [planner.plan(step)[1].seed for step in (3, 4, 4, 3, 5, 4)]
    assert seeds == [derive_seed(7, "rollout", s, i) for s, i in ((3, 0), (4, 0), (4, 1), (3, 1), (5, 0), (4, 2))]


@pytest.fixture(scope="module")
def engine_on_tiny(tiny_model_dir):
    from dapo_cli.engine.torch import TorchEngine
    from dapo_cli.models import load_policy

    model, tokenizer = load_policy(tiny_model_dir, dtype=torch.float32)
    return TorchEngine(model, lr=1e-3, weight_decay=0.0, warmup_steps=0, grad_clip=0.0), tokenizer


def tiny_config(tiny_model_dir, *sets: str):
    return apply_techniques(load_config(None, [
        f"model.path={tiny_model_dir}", "rollout.n=3", "data.train_batch_size=2", "rollout.max_response_length=8",
        "algorithm.overlong_buffer.len=4", "rollout.worker_threads=1", "trainer.ppo_mini_batch_size=2", *sets,
    ]), dynamic_sampling=False)


@pytest.mark.slow
def test_the_worker_samples_what_the_inline_engine_samples_with_the_same_weights(tiny_model_dir, engine_on_tiny):
    from dapo_cli.components import build_policy_rollout

    engine, tokenizer = engine_on_tiny
    cfg = tiny_config(tiny_model_dir, "rollout.worker=process")
    prompts = [Prompt(text=f"{k}+1=", ground_truth=str(k + 1), problem_id=str(k)) for k in range(8)]
    inline = InlineRounds(build_policy_rollout("fast", engine.module, tokenizer), PromptStream(prompts, seed=0), cfg)
    worker = WorkerRounds(cfg, PromptStream(prompts, seed=0), SingleProcess(), engine, model_path=str(tiny_model_dir),
                          version=0, threads=1, seeds_per_prompt=True)
    try:
        for step in (1, 2):
            a, b = inline.next_round(step), worker.next_round(step)
            assert [p.text for p in a.prompts] == [p.text for p in b.prompts]
            assert torch.equal(a.rollouts.response_ids, b.rollouts.response_ids)
            assert torch.equal(a.rollouts.logprobs, b.rollouts.logprobs)
            assert b.version == step - 1
            with torch.no_grad():  # an "update": the worker must sample with the new weights from now on
                for p in engine.module.parameters():
                    p.add_(0.05 * torch.randn_like(p))
            inline.after_update(engine, step, updated=True)
            metrics = worker.after_update(engine, step, updated=True)
            assert metrics["timing/weight_sync"] >= 0 and "timing/worker_generate" in metrics
    finally:
        worker.close()
    assert worker.process is None


@pytest.mark.slow
def test_rounds_drawn_ahead_are_rewound_in_the_checkpointed_stream(tiny_model_dir, engine_on_tiny):
    engine, _ = engine_on_tiny
    cfg = tiny_config(tiny_model_dir, "rollout.max_staleness=2")
    stream = PromptStream(PROMPTS, seed=0, shuffle=False)
    worker = WorkerRounds(cfg, stream, SingleProcess(), engine, model_path=str(tiny_model_dir), version=0, threads=1,
                          seeds_per_prompt=True)
    try:
        first = worker.next_round(1)
        assert worker.stream_state() == {"epoch": 0, "position": 2}  # nothing drawn ahead yet
        worker.before_update(1, rounds_used=1)  # k = 2 steps of 1 round each are queued for steps 2 and 3
        assert stream.state_dict() == {"epoch": 0, "position": 6}
        assert worker.stream_state() == {"epoch": 0, "position": 2}  # a checkpoint now resumes at the queued rounds
        worker.after_update(engine, 1, updated=True)
        second = worker.next_round(2)
        assert [p.text for p in second.prompts] == ["p2", "p3"] and second.version in (0, 1)
        assert worker.stream_state() == {"epoch": 0, "position": 4}
        assert first.version == 0
    finally:
        worker.close()


def test_a_worker_that_dies_is_an_environment_failure(tiny_model_dir, engine_on_tiny):
    from dapo_cli.errors import ENVIRONMENT, EnvironmentFailure

    engine, _ = engine_on_tiny
    cfg = tiny_config(tiny_model_dir, "rollout.max_staleness=1")
    worker = WorkerRounds(cfg, PromptStream(PROMPTS, seed=0), SingleProcess(), engine, model_path=str(tiny_model_dir),
                          version=0, threads=1, seeds_per_prompt=True)
    try:
        worker.process.kill()
        worker.process.join()
        with pytest.raises(EnvironmentFailure, match="rollout worker process died") as info:
            worker.next_round(1)
        assert info.value.exit_code == ENVIRONMENT
    finally:
        worker.close()


@pytest.mark.slow
def test_the_worker_process_loads_its_module_without_the_training_loop():
    """The spawned worker imports ``dapo_cli.train.worker``, so the package runs first: its re-exports of the
    loop (``from dapo_cli.train import run_train``) load ``loop.py`` on first use, not then."""
    code = (
        "import sys, dapo_cli.train.worker, dapo_cli.train as package\n"
        "assert 'dapo_cli.train.loop' not in sys.modules\n"
        "assert package.run_train is sys.modules['dapo_cli.train.loop'].run_train\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_run_samples_rounds_and_validations_from_one_builder() -> None:
    from dapo_cli.config import load_config
    from dapo_cli.config.schema import rank_share, round_sequences
    from dapo_cli.train.rounds import sampling_params

    cfg = load_config(None, ["rollout.top_k=5", "rollout.temperature=0.9", "validation.top_p=0.7", "validation.max_tokens=7"])
    train = sampling_params(cfg, seed=3)
    assert (train.temperature, train.top_p, train.top_k, train.max_tokens, train.seed, train.logprobs) == (
        0.9, 1.0, 5, cfg.rollout.max_response_length, 3, True)
    val = sampling_params(cfg, seed=4, validation=True)
    assert (val.temperature, val.top_p, val.top_k, val.max_tokens, val.seed, val.logprobs) == (1.0, 0.7, 0, 7, 4, False)
    # validation.max_tokens 0: the rollout's response limit
    assert sampling_params(load_config(None), seed=0, validation=True).max_tokens == load_config(None).rollout.max_response_length
    # a round of 8 prompts over 2 ranks: 4 a rank, x n responses for the engine's sizing
    cfg = load_config(None, ["data.train_batch_size=8", "rollout.n=4"])
    assert rank_share(cfg.data, 2) == 4 and round_sequences(cfg.data, cfg.rollout, 2) == 16
