"""vLLM's weight sync and sleep levels without vLLM: the real ``VLLMRolloutEngine`` (and the real training loop) on
the fake ``vllm`` of ``fake_vllm.py``, which models vLLM 0.32's sleep levels and wake-up tags exactly.

Runs in ``.venv`` (no vLLM needed); ``test_rollout_vllm.py`` checks the sync against the real CPU build.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import weakref
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from fake_vllm import RELOAD_LOGGER, install  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from fakes import Recorder  # noqa: E402

from dapo_cli.config import load_config  # noqa: E402
from dapo_cli.data.schema import make_row, write_dapo_parquet  # noqa: E402
from dapo_cli.errors import ENVIRONMENT, EnvironmentFailure  # noqa: E402
from dapo_cli.rollout import vllm as vllm_rollout  # noqa: E402
from dapo_cli.rollout.vllm import DropRotaryWarning, executor_layout, serving_dtype, stream_weights  # noqa: E402


# ---------------------------------------------------------------- pure decisions


@pytest.mark.parametrize(
    ("setting", "model_dtype", "device", "served"),
    [
        ("auto", "float32", "cuda", "bfloat16"),   # the default config on a GPU: bf16, not the trainer's float32
        ("auto", "bfloat16", "cuda", "bfloat16"),  # DeepSpeed bf16
        ("auto", "float32", "cpu", "float32"),     # vLLM's CPU build: the policy's dtype
        ("auto", "bfloat16", "cpu", "bfloat16"),
        ("float32", "float32", "cuda", "float32"),  # the user's setting wins
        ("float16", "bfloat16", "cpu", "float16"),
    ],
)
def test_vllm_serves_bfloat16_on_gpus_unless_told_and_the_policy_dtype_on_cpu(setting, model_dtype, device, served):
    assert serving_dtype(setting, model_dtype, device) == served


def test_the_executor_layout_reaches_tensor_parallelism_in_one_process():
    assert executor_layout(1, 1) == ("uni", {})
    assert executor_layout(1, 2) == ("mp", {})  # dapo eval --engine vllm on 2 GPUs (was unreachable)
    assert executor_layout(4, 2) == ("external_launcher", {"data_parallel_size": 2})
    assert executor_layout(2, 1) == ("external_launcher", {"data_parallel_size": 2})
    with pytest.raises(ValueError, match="does not divide the world size 3"):
        executor_layout(3, 2)


def test_the_rotary_warning_is_dropped_and_every_other_reload_warning_is_kept():
    keep = DropRotaryWarning().filter

    def record(msg: str, level: int = logging.WARNING) -> logging.LogRecord:
        return logging.LogRecord(RELOAD_LOGGER, level, __file__, 1, "%s: Failed to load weights", (msg,), None)

    assert not keep(record("RotaryEmbedding")) and not keep(record("Llama3RotaryEmbedding"))
    assert keep(record("QKVParallelLinear")) and keep(record("VocabParallelEmbedding"))


class Source:
    """A weight source that yields copies (as a ZeRO-3 gather does) and checks, each time it is asked for the
    next, that nobody holds the one it yielded before."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state
        self.held_back: list[str] = []

    def export_weights(self):
        previous: weakref.ref | None = None
        last = ""
        for name, tensor in self.state.items():
            if previous is not None and previous() is not None:
                self.held_back.append(last)
            gathered = tensor.detach().clone()
            previous, last = weakref.ref(gathered), name
            yield name, gathered
            del gathered


def test_the_stream_releases_each_tensor_before_asking_for_the_next_and_casts_it():
    source = Source({f"w{i}": torch.full((3,), float(i)) for i in range(5)})
    out = []
    for name, tensor in stream_weights(source.export_weights(), torch.bfloat16):
        out.append((name, tensor.dtype, float(tensor[0])))
        del tensor
    assert source.held_back == []
    assert out == [(f"w{i}", torch.bfloat16, float(i)) for i in range(5)]
    # negative control: a list (the old sync) holds every gathered tensor at once
    control = Source(source.state)
    listed = list(control.export_weights())
    assert len(control.held_back) == 4 and listed


# ---------------------------------------------------------------- the engine on the fake vLLM


def make_engine(path: Path, *, sleep_level: int, dtype: str = "float32"):
    from dapo_cli.engine.torch import TorchEngine
    from dapo_cli.models import load_policy

    model, tokenizer = load_policy(path)
    trainer = TorchEngine(model, lr=1e-2, weight_decay=0.0, warmup_steps=0, grad_clip=1.0)
    rollout = vllm_rollout.VLLMRolloutEngine(path, tokenizer, sleep_level=sleep_level, dtype=dtype, weights=trainer)
    return rollout, trainer, tokenizer


def test_a_sleeping_engine_wakes_its_weights_streams_them_then_wakes_its_kv_cache(tiny_model_dir, monkeypatch):
    fake = install(monkeypatch)
    rollout, trainer, _ = make_engine(tiny_model_dir, sleep_level=1, dtype="bfloat16")
    llm = fake.instances[-1]
    rollout.sleep()
    rollout.sync_weights(trainer)
    assert llm.calls[-4:] == [("wake_up", ("weights",)), ("reload_weights",), ("wake_up", ("kv_cache",)), ("reset_prefix_cache",)]
    assert llm.sleeping == set() and not rollout.asleep and llm.warnings == []
    assert llm.max_alive == 1  # one streamed tensor alive at a time on vLLM's side
    assert llm.received_dtypes == {torch.bfloat16}  # cast per tensor from the trainer's float32
    for name, p in trainer.module.named_parameters():
        assert torch.equal(dict(llm.model.named_parameters())[name], p.detach().to(torch.bfloat16)), name


@pytest.mark.parametrize("level", [1, 2])
def test_waking_without_an_update_gives_the_policys_own_samples_at_both_levels(tiny_model_dir, monkeypatch, level):
    from dapo_cli.rollout.base import SamplingParams

    fake = install(monkeypatch)
    rollout, trainer, _ = make_engine(tiny_model_dir, sleep_level=level)
    llm = fake.instances[-1]
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=3, logprobs=True)
    before = rollout.generate(["Q1", "Q2"], 2, params)
    rollout.sleep()
    rollout.wake_up()  # a step with no update
    after = rollout.generate(["Q1", "Q2"], 2, params)
    assert torch.equal(before.response_ids, after.response_ids)
    assert torch.allclose(before.logprobs, after.logprobs, atol=1e-6)
    resynced = ("reload_weights",) in llm.calls
    assert resynced is (level == 2)  # level 2 discarded them: synced again from the trainer, never woken without


def test_the_fake_refuses_to_sample_from_discarded_weights(tiny_model_dir, monkeypatch):
    """The fake's own negative control: vLLM's plain wake_up() after a level-2 sleep (what dfe96ef did) samples garbage."""
    from fake_vllm import SampledDiscardedWeights

    from dapo_cli.rollout.base import SamplingParams

    fake = install(monkeypatch)
    rollout, _, _ = make_engine(tiny_model_dir, sleep_level=2)
    rollout.sleep()
    fake.instances[-1].wake_up()
    rollout.sleeping = set()
    with pytest.raises(SampledDiscardedWeights):
        rollout.generate(["Q1"], 1, SamplingParams(max_tokens=4, seed=0))


def test_the_engine_is_given_the_serving_dtype_under_each_engine_config(tiny_model_dir, monkeypatch):
    from dapo_cli import components
    from dapo_cli.config.schema import RolloutConfig

    fake = install(monkeypatch, device="cuda")
    _, trainer, tokenizer = make_engine(tiny_model_dir, sleep_level=0)
    given = {}
    for model_dtype, setting in (("float32", "auto"), ("bfloat16", "auto"), ("float32", "float32")):
        components.build_train_rollout(
            RolloutConfig(engine="vllm", dtype=setting), trainer, tokenizer, lambda: None, tiny_model_dir, max_model_len=64,
            max_sequences=4, dtype=model_dtype, seed=0,
        )
        given[(model_dtype, setting)] = fake.instances[-1].kwargs["dtype"]
    assert given == {("float32", "auto"): "bfloat16", ("bfloat16", "auto"): "bfloat16", ("float32", "float32"): "float32"}
    install(monkeypatch, device="cpu", sleep_mode=False)
    components.build_train_rollout(
        RolloutConfig(engine="vllm"), trainer, tokenizer, lambda: None, tiny_model_dir, max_model_len=64, max_sequences=4,
        dtype="float32", seed=0, note=lambda _m: None,
    )
    assert fake.instances[-1].kwargs["dtype"] == "float32"


# ---------------------------------------------------------------- the real training loop on the fake vLLM


BARREN = {2}
"""Steps whose every sample is wrong: no informative group, no update."""


def scripted(calls: list[int]):
    """Samples 0-1 answer right and 2-3 wrong; in the rounds of a BARREN step all answer wrong."""
    import re

    def script(prompt: str, j: int) -> str:
        k = int(re.search(r"What is (\d+)\?", prompt).group(1))
        right = j < 2 and calls[0] not in BARREN
        return f"Answer: {k if right else k + 1}"

    return script


def train_on_fake(tmp_path: Path, model_dir: Path, monkeypatch, *, level: int, extra: tuple[str, ...] = ()):
    from dapo_cli.train import loop

    fake = install(monkeypatch)
    rows = [make_row(f"What is {k}?", str(k), index=k, template="{problem}") for k in range(32)]
    write_dapo_parquet(rows, tmp_path / "train.parquet")
    recorder = Recorder()

    @contextlib.contextmanager
    def fake_tracker(*_a, **_k):
        yield recorder

    monkeypatch.setattr(loop, "open_tracker", fake_tracker)
    steps = [0]
    from dapo_cli.train import rounds as rounds_mod

    real_next = rounds_mod.InlineRounds.next_round

    def next_round(self, step):
        steps[0] = step
        fake.instances[-1].script = scripted(steps)
        return real_next(self, step)

    monkeypatch.setattr(rounds_mod.InlineRounds, "next_round", next_round)
    cfg = load_config(None, [
        f"model.path={model_dir}", f"data.train_files=[{tmp_path / 'train.parquet'}]", "data.val_files=[]",
        "data.train_batch_size=2", "data.max_prompt_length=64", "rollout.engine=vllm", f"rollout.sleep_level={level}",
        "rollout.dtype=float32", "rollout.n=4", "rollout.max_response_length=12", "algorithm.overlong_buffer.len=4",
        "algorithm.filter_groups.max_num_gen_batches=1", "trainer.total_steps=3", "trainer.ppo_mini_batch_size=2",
        "trainer.save_freq=0", "trainer.test_freq=0", "trainer.log_samples_freq=0", "trainer.collapse_patience=0",
        f"trainer.output_dir={tmp_path / 'out'}", "tracking.backend=null", "engine.device=cpu", "trainer.lr=1e-2",
        "trainer.lr_warmup_steps=0", *extra,
    ])
    error = None
    try:
        loop.run_train(cfg, quiet=True)
    except EnvironmentFailure as exc:
        error = exc
    return fake.instances[-1], recorder.metrics, error


@pytest.mark.slow
@pytest.mark.parametrize("level", [1, 2])
def test_the_training_loop_never_samples_from_discarded_weights_at_either_level(tmp_path, tiny_model_dir, monkeypatch, level):
    llm, metrics, error = train_on_fake(tmp_path, tiny_model_dir, monkeypatch, level=level)
    assert error is None
    assert "actor/pg_loss" not in metrics[2] and "actor/pg_loss" in metrics[1] and "actor/pg_loss" in metrics[3]
    calls = [c[0] if c[0] != "wake_up" else c for c in llm.calls if c[0] != "reset_prefix_cache"]
    sync = [("wake_up", ("weights",)), "reload_weights", ("wake_up", ("kv_cache",))]
    # step 1: generate, sleep, sync (weights first) ... ; step 2 (no update): level 1 wakes both, level 2 syncs again
    no_update = [("wake_up", ("weights", "kv_cache"))] if level == 1 else sync
    assert calls == ["generate", "sleep", *sync, "generate",   # step 1 + its probe
                     "generate", "sleep", *no_update, "generate",  # step 2 (barren) + probe
                     "generate", "sleep", *sync, "generate"]  # step 3 + probe
    assert llm.warnings == [] and llm.max_alive == 1
    for step in (1, 2, 3):  # the probe after each wake / sync: vLLM serves the trainer's float32 weights
        assert metrics[step]["rollout/sync_probe_gap"] < 1e-4, metrics[step]


@pytest.mark.slow
def test_a_sync_whose_log_probs_drift_from_the_trainers_stops_the_run_with_exit_5(tmp_path, tiny_model_dir, monkeypatch):
    from dapo_cli.train import rounds as rounds_mod

    real_sync = vllm_rollout.VLLMRolloutEngine.sync_weights

    def corrupt_after_sync(self, source):
        real_sync(self, source)
        self.llm.logprob_shift = -0.8  # what a layer left on wrong weights does to the served log-probs

    monkeypatch.setattr(vllm_rollout.VLLMRolloutEngine, "sync_weights", corrupt_after_sync)
    assert rounds_mod.check_gap  # the gate the loop runs
    llm, metrics, error = train_on_fake(tmp_path, tiny_model_dir, monkeypatch, level=1)
    assert error is not None and error.exit_code == ENVIRONMENT == 5
    message = str(error)
    assert "\n" not in message and "after the weight sync of step 1" in message and "rollout.sync_check_gap=0.5" in message
    assert 1 not in metrics  # stopped inside step 1, before it was recorded


def test_the_gate_rejects_a_gap_above_the_bound_or_not_a_number_and_0_turns_it_off():
    from dapo_cli.train.sync_check import check_gap

    check_gap(0.49, 0.5, 3)
    check_gap(7.0, 0.0, 3)
    for bad in (0.51, float("nan"), float("inf")):
        with pytest.raises(EnvironmentFailure, match="step 3"):
            check_gap(bad, 0.5, 3)


def test_dapo_eval_on_vllm_can_span_gpus_with_tensor_parallelism(tiny_model_dir, monkeypatch):
    from dapo_cli import components

    fake = install(monkeypatch, device="cuda")
    engine, _ = components.build_eval_rollout("vllm", str(tiny_model_dir), 0, lambda _m: None, tensor_parallel_size=2)
    given = fake.instances[-1].kwargs
    assert given["tensor_parallel_size"] == 2 and given["distributed_executor_backend"] == "mp"
    assert given["dtype"] == "bfloat16" and not given["enable_sleep_mode"]  # eval: bf16 on a GPU, no sleep
    with pytest.raises(RuntimeError, match="cannot take streamed weights"):  # never synced: said, not pickled
        engine.sync_weights(Source({}))


@pytest.mark.slow
def test_eval_refuses_tensor_parallelism_off_vllm(tiny_model_dir):
    from typer.testing import CliRunner

    from dapo_cli.cli import app

    out = CliRunner().invoke(app, ["eval", str(tiny_model_dir), "--engine", "fast", "--tensor-parallel-size", "2", "--no-track"])
    assert out.exit_code == 2 and "--tensor-parallel-size 2" in out.output
