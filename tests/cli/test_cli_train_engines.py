"""`dapo train` engine settings from the command line: one-line errors, and DeepSpeed in one process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dapo_cli.cli import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from test_e2e_train import only_run, write_config  # noqa: E402


def error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(
    ("sets", "env", "message"),
    [
        (["engine.offload_optimizer=true"], {}, "needs engine.name=deepspeed"),
        (["engine.zero_stage=5"], {}, "engine.zero_stage=5 is not a ZeRO stage"),
        (["data.train_batch_size=3", "trainer.ppo_mini_batch_size=3"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, None),
        ([], {"RANK": "0", "WORLD_SIZE": "2"}, "LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set; launch with: torchrun"),
    ],
    ids=["offload-without-deepspeed", "bad-zero-stage", "world-size-does-not-divide", "launch-without-launcher-vars"],
)
def test_bad_engine_settings_exit_2_with_one_line(tmp_path, monkeypatch, tiny_model_dir, sets, env, message):
    monkeypatch.chdir(tmp_path)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if message is None:  # a world of 2 whose batch of 3 prompts cannot be split: caught before any process group forms
        from dapo_cli import components

        monkeypatch.setattr(components, "build_collective", lambda _cfg: _FakeWorld(2))
        message = "is not divisible by the world size 2"
    config = write_config(tmp_path, tiny_model_dir, steps=1)
    args = ["train", str(config)]
    for item in sets:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and message in lines[0], result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


class _FakeWorld:
    def __init__(self, n: int) -> None:
        self.rank, self.world_size, self.local_rank = 0, n, 0
        self.is_main = True

    def close(self) -> None:
        pass


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
@pytest.mark.slow
def test_deepspeed_zero3_in_one_process_with_a_sharded_kl_reference_matches_the_torch_engine(
    tmp_path_factory, monkeypatch, tiny_model_dir
):
    # ZeRO-3 shards the policy: the rollout engine samples with a private copy synced from
    # export_weights() after every update, and the KL reference is its own ZeRO-3 engine. In one
    # fp32 process that is the same math as the torch engine, so the logged values must agree.
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)  # set by the engine for DeepSpeed, restored afterwards
    keys = ["actor/kl_loss", "actor/pg_loss", "actor/grad_norm", "response_length/mean"]
    values = {}
    for engine in ("torch", "deepspeed"):
        work = tmp_path_factory.mktemp(engine)
        monkeypatch.chdir(work)
        config = write_config(work, tiny_model_dir, steps=2)
        result = CliRunner().invoke(app, [
            "train", str(config), "--no-dynamic-sampling", "--set", f"engine.name={engine}", "--set", "engine.zero_stage=3",
            "--set", "algorithm.use_kl_loss=true", "--set", "engine.device=cpu",
        ])
        assert result.exit_code == 0, result.output
        client, run = only_run(work)
        values[engine] = {k: [m.value for m in client.get_metric_history(run.info.run_id, k)] for k in keys}
        assert [m.step for m in client.get_metric_history(run.info.run_id, "timing/weight_sync")] == [1, 2]
        checkpoint = run.data.tags["dapo.checkpoint"]
    assert values["torch"]["actor/kl_loss"][1] > 0  # the policy has moved away from the reference
    for key in keys:
        assert values["deepspeed"][key] == pytest.approx(values["torch"][key], rel=1e-4, abs=1e-7), key
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint)  # the ZeRO-3 run's export, gathered from the shards
    assert sum(p.numel() for p in model.parameters()) > 1000


@pytest.mark.slow
def test_each_engine_check_runs_once_per_train_command(tmp_path, monkeypatch, tiny_model_dir):
    """The preflight checks the engines and the session the world size, each once; the builders check nothing."""
    from dapo_cli.cli import preflight
    from dapo_cli.config import validate as rules

    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    calls: list[str] = []

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(preflight, "check_engines", counted("engines", preflight.check_engines))
    monkeypatch.setattr(rules, "check_engine", counted("engine rules", rules.check_engine))
    import dapo_cli.train.session as session

    monkeypatch.setattr(session, "check_world_size", counted("world size", session.check_world_size))
    config = write_config(tmp_path, tiny_model_dir, steps=1)
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 0, result.output
    assert sorted(calls) == ["engine rules", "engines", "world size"]
