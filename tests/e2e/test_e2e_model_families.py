"""`dapo train`, `dapo eval` and `dapo ablate` on real model families (tiny random-init Qwen2 and
Llama/Mistral with their real tokenizers), both local rollout engines; hub ids and `aime24` from a
Hugging Face cache in the documented layout, offline; context limits refused before generating."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fixtures.experiment import experiment_runs, write_experiment
from fixtures.hub_cache import populate
from fixtures.model_families import Family
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.data.schema import make_row, write_dapo_parquet
from dapo_cli.models import format_prompt

AIME = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "aime-2024.parquet"
needs_aime = pytest.mark.skipif(not AIME.is_file(), reason=f"shared data not found at {AIME}")
LONG = "a " * 400
runner = CliRunner()


def one_line_error(result) -> str:
    """The one ``error:`` line of an exit-2 failure (progress lines such as "loading ..." may precede it)."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in result.stderr, result.stderr
    return errors[0]


@pytest.fixture(autouse=True)
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hub cache of the test's own (never the machine's), offline."""
    cache = tmp_path / "hf-hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("DAPO_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    return cache


@pytest.fixture(autouse=True)
def restore_threads():
    """run_train sets torch's process-wide thread count from engine.num_threads; give it back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def write_data(tmp: Path) -> Path:
    """Six short problems and one far longer than data.max_prompt_length (dropped, and said so)."""
    rows = [make_row(f"What is {i} + {i + 1}?", str(2 * i + 1), index=i) for i in range(6)]
    rows.append(make_row(f"What is {LONG}?", "0", index=6))
    path = tmp / "train.parquet"
    write_dapo_parquet(rows, path)
    return path


def write_config(tmp: Path, model: Path | str, engine: str, steps: int = 1) -> Path:
    """2 prompts × 2 samples of ≤ 6 tokens, one mini-batch, 2 validation problems × 1 sample."""
    data = write_data(tmp)
    cfg = {
        "data": {"train_files": [str(data)], "val_files": [str(data)], "train_batch_size": 2, "max_prompt_length": 160},
        "model": {"path": str(model)},
        "rollout": {"n": 2, "max_response_length": 6, "engine": engine},
        "algorithm": {"overlong_buffer": {"len": 2}},
        "trainer": {"total_steps": steps, "ppo_mini_batch_size": 2, "ppo_micro_batch_size": 2, "lr": 1e-4,
                    "lr_warmup_steps": 1, "save_freq": steps, "test_freq": 0, "log_samples_freq": 1},
        "validation": {"k": 1},
        "engine": {"device": "cpu", "num_threads": 1},
    }
    return write_experiment(tmp, cfg, "families")


def runs(tmp: Path):
    return experiment_runs(tmp, "families")


def check_checkpoint(checkpoint: Path, family: Family) -> None:
    """Plain transformers loads it, renders the family's prompt once, and generates."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id) == (family.eos_ids[0], family.pad_id, family.bos_id)
    ids = tokenizer(format_prompt(tokenizer, [{"role": "user", "content": "What is 1 + 2?"}]), add_special_tokens=False)["input_ids"]
    if family.bos_id is not None:
        assert ids[0] == family.bos_id and ids.count(family.bos_id) == 1
    else:
        assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    out = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False, pad_token_id=family.pad_id)
    assert out.shape[1] > len(ids)
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["rope_theta"] == 1_000_000.0 and config["max_position_embeddings"] == family.context


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_train_then_eval_each_family(family: Family, engine: str, tmp_path: Path, offline_hub: Path) -> None:
    config = write_config(tmp_path, family.path, engine)
    result = runner.invoke(app, ["train", str(config), "--no-dynamic-sampling"])
    assert result.exit_code == 0, result.output
    # the long prompt was left out of training and of validation, and the run said so
    assert "dropped 1 of 7 training prompts longer than data.max_prompt_length=160 tokens" in result.output
    assert "dropped 1 of 7 validation problems" in result.output
    client, [run] = runs(tmp_path)
    assert run.info.status == "FINISHED" and run.data.params["rollout.engine"] == engine
    lengths = [m.value for m in client.get_metric_history(run.info.run_id, "response_length/max")]
    assert lengths and max(lengths) <= 6
    manifest = json.loads(Path(client.download_artifacts(run.info.run_id, "dataset_manifest.json", str(tmp_path))).read_text())
    assert (manifest["train_prompts"], manifest["train_prompts_dropped_too_long"]) == (6, 1)
    checkpoint = Path(json.loads((next((tmp_path / "runs").rglob("summary.json"))).read_text())["checkpoint"])
    check_checkpoint(checkpoint, family)

    # the trained checkpoint as a hub id from the offline cache, on aime24 from that same cache
    if not AIME.is_file():
        pytest.skip(f"shared data not found at {AIME}")
    populate(offline_hub, "BytedTsinghua-SIA/AIME-2024", {"data/aime-2024.parquet": AIME}, repo_type="dataset")
    populate(offline_hub, f"dapo-test/{family.name}-tiny", {p.name: p for p in checkpoint.iterdir()})
    args = ["eval", f"dapo-test/{family.name}-tiny", "--dataset", "aime24", "--engine", engine, "--avg", "1", "--limit", "2",
            "--no-track", "--output", str(tmp_path / "eval")]
    result = runner.invoke(app, [*args, "--max-tokens", "4"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["metrics"]["num_samples"] == 2

    # prompt + max tokens beyond the 512-position context: one line naming the numbers, before generating
    line = one_line_error(runner.invoke(app, [*args[:-2], "--output", str(tmp_path / "eval2"), "--max-tokens", "500"]))
    assert "+ max_tokens 500 =" in line and f"context of {family.context} positions" in line and "--max-tokens" in line


def test_a_length_budget_over_the_context_is_refused_before_anything_is_created(qwen2_dir: Family, tmp_path: Path) -> None:
    config = write_config(tmp_path, qwen2_dir.path, "fast")
    line = one_line_error(runner.invoke(app, ["train", str(config), "--set", "rollout.max_response_length=400"]))
    assert "data.max_prompt_length (160) + rollout.max_response_length (400) = 560 exceeds the model's context of 512" in line
    assert "lower data.max_prompt_length or rollout.max_response_length" in line
    line = one_line_error(runner.invoke(app, ["train", str(config), "--set", "validation.max_tokens=353"]))
    assert "validation.max_tokens (353) = 513" in line
    assert not (tmp_path / "runs").exists() and runs(tmp_path)[1] == []


def test_a_hub_id_or_dataset_not_in_the_cache_offline_is_one_line(qwen2_dir: Family, tmp_path: Path, offline_hub: Path) -> None:
    data = write_data(tmp_path)
    line = one_line_error(runner.invoke(app, ["eval", "dapo-test/not-there", "--dataset", str(data), "--no-track"]))
    assert "cannot load model 'dapo-test/not-there': HF_HUB_OFFLINE is set" in line and str(offline_hub) in line
    line = one_line_error(runner.invoke(app, ["eval", str(qwen2_dir.path), "--dataset", "aime24", "--no-track"]))
    assert "dataset 'aime24' is not cached and HF_HUB_OFFLINE is set; place aime-2024.parquet" in line


def test_ablate_runs_a_variant_on_each_family(family: Family, tmp_path: Path) -> None:
    config = write_config(tmp_path, family.path, "fast" if family.name == "qwen2" else "hf")
    result = runner.invoke(app, ["ablate", str(config), "--ladder", "--only", "dapo", "--seeds", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    _, found = runs(tmp_path)
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId")]
    assert len(children) == 1 and children[0].info.status == "FINISHED"
    assert children[0].data.params["model.path"] == str(family.path)
