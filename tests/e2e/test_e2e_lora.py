"""`dapo train --set model.lora.rank=4` end to end on the tiny policy: metrics, a plain merged checkpoint
that transformers and `dapo eval` read unchanged, PEFT's adapter beside it, and a resume equal to an
uninterrupted run (the base reloaded from model.path, the adapters and AdamW from the checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.data.schema import make_row, write_dapo_parquet

from test_e2e_train import RUN, last_values, only_run, write_config

LORA = ["--no-dynamic-sampling", "--set", "model.lora.rank=4", "--set", "model.lora.alpha=8", "--set", "trainer.lr=1e-2"]
KEYS = ["actor/pg_loss", "actor/entropy", "reward/score_mean", "response_length/mean", "actor/grad_norm"]


@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory) -> Path:
    """tiny_model_dir's policy with 512 positions: room for dapo eval's DAPO prompt (~250 characters)."""
    from dapo_cli.config.tiny import TinyModelConfig
    from dapo_cli.models import build_char_tokenizer, save_policy
    from dapo_cli.models.tiny import build_tiny_model_for

    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=512)
    tokenizer = build_char_tokenizer()
    out = tmp_path_factory.mktemp("tiny-model-512")
    save_policy(build_tiny_model_for(cfg, tokenizer), tokenizer, out)
    return out


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def without_validation(config: Path) -> Path:
    """The experiment with no validation set: a run stopped at step 2 then validates nothing the
    uninterrupted run does not (each run validates after its last step)."""
    cfg = yaml.safe_load(config.read_text())
    cfg["data"]["val_files"] = []
    config.write_text(yaml.safe_dump(cfg))
    return config


@pytest.mark.lora
def test_lora_run_records_metrics_and_writes_a_plain_merged_checkpoint(workdir, long_model_dir):
    from transformers import AutoModelForCausalLM

    config = write_config(workdir, long_model_dir, steps=2)
    result = CliRunner().invoke(app, ["train", str(config), *LORA])
    assert result.exit_code == 0, result.output
    client, run = only_run(workdir)
    assert run.data.params["model.lora.rank"] == "4"
    for key in KEYS:
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2], key
    # the rollout copy samples with the merged policy: its log-probs are the trainer's
    assert last_values(client, run.info.run_id, ["rollout/logprob_diff_max"], 2)["rollout/logprob_diff_max"] < 1e-4

    checkpoint = workdir / "runs" / "e2e" / RUN / "checkpoints" / "step_000002"
    trained = AutoModelForCausalLM.from_pretrained(checkpoint / "model").state_dict()  # plain transformers, no PEFT
    base = AutoModelForCausalLM.from_pretrained(long_model_dir).state_dict()
    assert trained.keys() == base.keys()
    for key, value in base.items():
        moved = not torch.equal(trained[key], value)
        assert moved == key.endswith("_proj.weight"), key  # adapters on every linear layer of the blocks, nothing else
    adapter = checkpoint / "engine" / "adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    assert (adapter / "adapter_model.safetensors").is_file()

    # dapo eval reads the merged folder as it reads any checkpoint
    data = workdir / "two.parquet"
    write_dapo_parquet([make_row("What is 1+1?", "2", index=0), make_row("What is 2+2?", "4", index=1)], data)
    out = workdir / "eval"
    result = CliRunner().invoke(app, ["eval", str(checkpoint / "model"), "--dataset", str(data), "--engine", "fast", "--avg", "1",
                                      "--max-tokens", "4", "--no-track", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["metrics"]["num_samples"] == 2


@pytest.mark.lora
def test_a_resumed_lora_run_equals_an_uninterrupted_one(workdir, tiny_model_dir, tmp_path_factory):
    steps = 4
    ref_dir = tmp_path_factory.mktemp("reference")
    result = CliRunner().invoke(app, ["train", str(without_validation(write_config(ref_dir, tiny_model_dir, steps))), *LORA])
    assert result.exit_code == 0, result.output
    ref_client, ref_run = only_run(ref_dir)
    reference = last_values(ref_client, ref_run.info.run_id, KEYS, steps)

    # the same run stopped after its step-2 checkpoint, then extended to 4 steps with --resume
    config = without_validation(write_config(workdir, tiny_model_dir, steps))
    first = CliRunner().invoke(app, ["train", str(config), *LORA, "--set", "trainer.total_steps=2"])
    assert first.exit_code == 0, first.output
    result = CliRunner().invoke(app, ["train", str(config), *LORA, "--resume"])
    assert result.exit_code == 0, result.output
    client, run = only_run(workdir)
    assert run.data.tags["dapo.resumed_from_step"] == "2"
    resumed = last_values(client, run.info.run_id, KEYS, steps)
    for key in KEYS:
        assert resumed[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-7), key
    # the final merged weights too
    ours = workdir / "runs" / "e2e" / RUN / "checkpoints" / "step_000004" / "model"
    theirs = ref_dir / "runs" / "e2e" / RUN / "checkpoints" / "step_000004" / "model"
    from safetensors.torch import load_file

    a, b = load_file(ours / "model.safetensors"), load_file(theirs / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)


def test_without_peft_lora_is_one_line_exit_2(workdir, tiny_model_dir, monkeypatch):  # unmarked: runs in .venv too
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    config = write_config(workdir, tiny_model_dir, steps=1)
    result = CliRunner().invoke(app, ["train", str(config), *LORA])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'dapo-cli[lora]'" in lines[0], result.stderr
    assert not (workdir / "runs").exists()  # nothing claimed


@pytest.mark.lora
@pytest.mark.slow
def test_the_worker_process_samples_with_the_merged_lora_policy(tiny_model_dir, tmp_path_factory):
    # the rollout worker copies export_weights() (merged, plain names) into its own plain model: at
    # max_staleness 0 every metric and final weight equals the inline loop's, bit for bit
    from test_e2e_async import final_weights, histories, train
    from test_e2e_async import write_config as async_config

    lora = ["--set", "model.lora.rank=4", "--set", "model.lora.alpha=8"]
    inline, process = tmp_path_factory.mktemp("inline"), tmp_path_factory.mktemp("process")
    train(async_config(inline, tiny_model_dir), *lora)
    train(async_config(process, tiny_model_dir, worker="process"), *lora)
    a, _ = histories(inline)
    b, _ = histories(process)
    compared = sorted(k for k in a if not k.startswith(("timing/", "perf/", "async/")))
    assert "actor/pg_loss" in compared and "rollout/logprob_diff_max" in compared
    for key in compared:
        assert a[key] == b[key], key
    assert max(v for _, v in a["rollout/logprob_diff_max"]) < 1e-4  # the sampler's policy is the trainer's
    wa, wb = final_weights(inline), final_weights(process)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
