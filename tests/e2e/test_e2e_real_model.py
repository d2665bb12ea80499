"""`dapo train experiments/smollm2-135m.yaml` on the real pretrained model, shrunk to one short step:
train → checkpoint → `dapo eval`, and the checkpoint read back by plain transformers with its tokenizer
and chat template. The full run and its measured improvement are in docs/real-model.md.

``model.path`` stays the experiment's ``gguf:smollm2-135m-instruct``: the ``smollm2_dir`` fixture puts the
imported folder where that name resolves (the dapo cache), as `make smollm2` does for a user.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.experiment import experiment_runs, store_uri

pytestmark = pytest.mark.gguf
EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "smollm2-135m.yaml"
SHRINK = {  # one step of 2 prompts x 2 samples of <= 8 tokens, no extra generation rounds
    "data.synthetic_train_size": 16, "data.synthetic_val_size": 2, "data.train_batch_size": 2, "rollout.n": 2,
    "rollout.max_response_length": 8, "algorithm.overlong_buffer.len": 4, "trainer.total_steps": 1,
    "trainer.ppo_mini_batch_size": 2, "trainer.log_samples_freq": 0, "validation.k": 1,
}


@pytest.fixture(scope="module")
def trained(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("smollm2-train")
    sets = {**SHRINK, "trainer.output_dir": str(tmp / "runs"), "tracking.tracking_uri": store_uri(tmp)}
    args = ["train", str(EXPERIMENT), "--no-dynamic-sampling", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]
    # a process of its own, as a user runs it: the ~5 GB a 135 M-parameter update takes (weights, grads,
    # Adam) leave with it, where in this process they would count against the vLLM tests' CPU memory share
    return tmp, dapo(args)


def dapo(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dapo_cli", *args], capture_output=True, text=True, timeout=900)


def test_the_experiment_trains_the_real_model_and_checkpoints_it(trained, smollm2_dir: Path):
    tmp, result = trained
    assert result.returncode == 0, result.stderr[-3000:]
    _, [run] = experiment_runs(tmp, "dapo-smollm2")
    assert run.info.status == "FINISHED" and run.data.params["model.path"] == "gguf:smollm2-135m-instruct"
    assert run.data.metrics["train/batch_responses"] == 4 and run.data.metrics["response_length/max"] <= 8
    [model_dir] = (tmp / "runs").glob("dapo-smollm2/*/checkpoints/step_000001/model")
    config = json.loads((model_dir / "config.json").read_text())
    base = json.loads((smollm2_dir / "config.json").read_text())
    assert {k: config[k] for k in ("num_hidden_layers", "hidden_size", "vocab_size")} == {
        k: base[k] for k in ("num_hidden_layers", "hidden_size", "vocab_size")}


def test_plain_transformers_reads_the_checkpoint_with_its_tokenizer_and_template(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp, result = trained
    assert result.returncode == 0, result.stderr[-3000:]
    [model_dir] = (tmp / "runs").glob("dapo-smollm2/*/checkpoints/step_000001/model")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert type(model).__name__ == "LlamaForCausalLM" and model.num_parameters() == 134_515_008
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"
    del model


def test_dapo_eval_reads_the_checkpoint(trained, tmp_path: Path):
    from dapo_cli.data.schema import write_dapo_parquet
    from dapo_cli.data.synthetic import generate_rows

    tmp, result = trained
    assert result.returncode == 0, result.stderr[-3000:]
    [checkpoint] = (tmp / "runs").glob("dapo-smollm2/*/checkpoints/step_000001")
    data = tmp_path / "heldout.parquet"
    write_dapo_parquet(generate_rows("fewshot-add-2digit", 2, seed=1, split="test"), data)
    out = dapo(["eval", str(checkpoint), "--engine", "fast", "--dataset", str(data), "--avg", "2",
                "--max-tokens", "8", "--json", "--quiet", "--no-track"])
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads(out.stdout)["metrics"]
    assert metrics["num_problems"] == 2 and metrics["num_samples"] == 4 and 0.0 <= metrics["avg@2"] <= 1.0
