"""``dapo train CONFIG --dry-run``: the cluster plan through the CLI (no weights, no GPU, no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.config import dump_yaml, load_config

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "experiments" / "tiny.yaml")
PAPER_32B = REPO / "experiments" / "dapo-qwen2.5-32b.yaml"

Q32 = {
    "data": {"train_batch_size": 512, "gen_batch_size": 1536, "max_prompt_length": 2048},
    "model": {"path": "Qwen/Qwen2.5-32B", "dtype": "bfloat16"},
    "rollout": {"engine": "vllm", "n": 16, "max_response_length": 20480, "tensor_parallel_size": 4,
                "gpu_memory_utilization": 0.5, "sleep_level": 1},
    "trainer": {"ppo_mini_batch_size": 32, "ppo_micro_batch_size": 16},
    "engine": {"name": "deepspeed", "zero_stage": 3, "gradient_checkpointing": True},
}


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # an empty cache
    return tmp_path


def invoke(*args: str):
    return CliRunner().invoke(app, ["train", *args])


def q32_config(tmp_path: Path, **changes: dict) -> str:
    data = json.loads(json.dumps(Q32))
    for section, values in changes.items():
        data[section].update(values)
    path = tmp_path / "q32.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def test_tiny_dry_run_prints_the_plan_and_writes_nothing(in_tmp: Path) -> None:
    result = invoke(TINY, "--dry-run")
    assert result.exit_code == 0, result.output
    out = result.output
    for text in ("Batch per RL step", "1,064,320 parameters", "16 × n=8 = 128 responses", "= 2 mini-batches",
                 "at most max_num_gen_batches = 10 rounds = 160 prompts", "worst 81,920", "world size 1",
                 "Memory per GPU in GiB", "update: fits", "rollout: fits", "engine.device=cpu"):
        assert text in out, text
    assert list(in_tmp.iterdir()) == []  # a dry run writes nothing


@pytest.mark.slow
def test_json_plan_and_world_size_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    data = json.loads(invoke(TINY, "--dry-run", "--json").output)
    assert data["world"] == {"world_size": 2, "source": "$WORLD_SIZE", "gpus_per_node": 8, "nodes": 1}
    assert data["model"]["parameters"] == 1_064_320 and data["runnable"] is True
    assert {p["name"] for p in data["memory"]["phases"]} == {"rollout", "old log-probs", "update"}
    assert data["batch"]["updates"] == 2
    data = json.loads(invoke(TINY, "--dry-run", "--json", "--world-size", "4", "--gpu-memory-gib", "24").output)
    assert data["world"]["world_size"] == 4 and data["memory"]["gpu_gib"] == 24


def test_yaml_keeps_the_resolved_config() -> None:
    result = invoke(TINY, "--dry-run", "--yaml")
    assert result.exit_code == 0
    assert result.output == dump_yaml(load_config(TINY))


def test_world_size_that_does_not_divide_the_batch_exits_2_after_the_plan() -> None:
    result = invoke(TINY, "--dry-run", "--world-size", "3")
    assert result.exit_code == 2
    assert "Memory per GPU" in result.output
    assert "error: the settings cannot run at world size 3: data.gen_batch_size (or train_batch_size)=16 is not divisible" in result.output


def test_32b_plan_without_gpu_or_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dapo_cli.cli import preflight

    def no_vllm(*args, **kwargs):
        raise AssertionError("the dry run must not check the rollout engine")

    monkeypatch.setattr(preflight, "check_engines", no_vllm)
    monkeypatch.setattr(preflight, "check_vllm", no_vllm)
    result = invoke(q32_config(tmp_path), "--dry-run", "--world-size", "32")
    assert result.exit_code == 0, result.output
    out = result.output
    for text in ("32,763,876,352 parameters", "world size 32 = 4 nodes × 8 GPUs", "tensor_parallel_size=4 divides",
                 "update: does not fit", "first knob: trainer.ppo_micro_batch_size=1", "65,536 bytes a token per GPU",
                 "405,391 tokens", "at most 17 run", "CPU memory: 15.3 GiB per rank"):
        assert text in out, text


@pytest.mark.slow
def test_32b_tensor_parallel_must_divide_the_world(tmp_path: Path) -> None:
    result = invoke(q32_config(tmp_path), "--dry-run")  # world size 1, TP 4
    assert result.exit_code == 2
    assert "error: the settings cannot run at world size 1: rollout.tensor_parallel_size=4 does not divide" in result.output


def test_32b_fits_with_micro_batch_one(tmp_path: Path) -> None:
    path = q32_config(tmp_path, trainer={"ppo_micro_batch_size": 1})
    data = json.loads(invoke(path, "--dry-run", "--json", "--world-size", "32").output)
    assert data["memory"]["fits"] is True
    assert data["memory"]["vllm"]["tokens_fit"] == 405_391


@pytest.mark.slow
def test_the_paper_32b_experiment_plans_for_the_cluster_it_is_written_for() -> None:
    # no --world-size and no $WORLD_SIZE: the file's cluster section (16 nodes × 8 GPUs of 80 GB)
    result = invoke(str(PAPER_32B), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["model"]["parameters"] == 32_763_876_352 and data["runnable"] is True
    assert data["world"] == {"world_size": 128, "source": "cluster.world_size in the config", "gpus_per_node": 8, "nodes": 16}
    printed = invoke(str(PAPER_32B), "--dry-run")
    assert printed.exit_code == 0, printed.output
    assert "world size 128 = 16 nodes × 8 GPUs (from cluster.world_size in the config)" in printed.output


@pytest.mark.slow
def test_flags_and_the_environment_override_the_configs_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    data = json.loads(invoke(str(PAPER_32B), "--dry-run", "--json", "--world-size", "256", "--gpus-per-node", "16").output)
    assert data["world"] == {"world_size": 256, "source": "--world-size", "gpus_per_node": 16, "nodes": 16}
    monkeypatch.setenv("WORLD_SIZE", "64")  # a launcher's world is the one about to run
    data = json.loads(invoke(str(PAPER_32B), "--dry-run", "--json").output)
    assert data["world"]["world_size"] == 64 and data["world"]["source"] == "$WORLD_SIZE"


@pytest.mark.parametrize(("preset", "world", "per_node"), [("dapo-qwen2.5-7b.yaml", 8, 8), ("dapo-qwen2.5-1.5b.yaml", 1, 1)])
def test_every_paper_preset_plans_as_it_is(preset: str, world: int, per_node: int) -> None:
    result = invoke(str(PAPER_32B.parent / preset), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["world"]["world_size"] == world and data["world"]["gpus_per_node"] == per_node
    assert data["runnable"] is True


def test_model_from_the_hugging_face_cache(in_tmp: Path) -> None:
    snap = in_tmp / "hf-cache" / "models--someone--small" / "snapshots" / "rev1"
    snap.mkdir(parents=True)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("rev1")
    (snap / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "tie_word_embeddings": True,
    }))
    result = invoke(TINY, "--dry-run", "--set", "model.path=someone/small")
    assert result.exit_code == 0, result.output
    assert "Hugging Face cache" in result.output


def test_unknown_model_offline_is_one_line_exit_2() -> None:
    result = invoke(TINY, "--dry-run", "--set", "model.path=someone/not-here")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot plan model 'someone/not-here'")
    assert "hf download someone/not-here config.json" in lines[0]


def test_plan_options_need_dry_run() -> None:
    result = invoke(TINY, "--world-size", "8", "--gpus-per-node", "4")
    assert result.exit_code == 2
    assert result.output.startswith("error: --world-size, --gpus-per-node only work with --dry-run")
    result = invoke(TINY, "--yaml")  # --json is not here: without --dry-run it prints the run's results
    assert result.output == "error: --yaml only works with --dry-run (add --dry-run, or drop it)\n"
