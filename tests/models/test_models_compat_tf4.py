"""dapo's checkpoints, written with transformers 5.x, load unchanged in transformers 4.57.

The 4.57 side runs in ``.venv-tf4`` (``make venv-tf4``; built here on first use, ~1 min) as a
subprocess: it loads the checkpoint with plain ``AutoTokenizer`` / ``AutoModelForCausalLM`` and
writes what it read -- its version, ``rope_theta``, token ids, logits -- for this side to compare.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from fixtures.model_families import Family

from dapo_cli.models import format_prompt, load_policy, save_policy

REPO = Path(__file__).resolve().parents[2]
TF4_PYTHON = REPO / ".venv-tf4" / "bin" / "python"
TEXTS = ["What is 17 + 25?\n\n  Think step by step.", "Ünïcödé 中文\t<|im_end|> [INST] x", "a\n\nb"]

READER = r"""
import json, sys, torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
path, texts, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
messages = [{"role": "user", "content": texts[0]}]
prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in [prompt, *texts]]
with torch.no_grad():
    logits = model(torch.tensor([ids[0]])).logits[0]
torch.save(logits, out + ".pt")
json.dump({"version": transformers.__version__, "rope_theta": model.config.rope_theta,
           "prompt": prompt, "ids": ids, "eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id,
           "tokenizer": type(tokenizer).__name__}, open(out, "w"))
"""


@pytest.fixture(scope="module")
def tf4_python() -> Path:
    """``.venv-tf4/bin/python`` with transformers 4.57 (``make venv-tf4`` builds it once)."""
    if not (TF4_PYTHON.parent.parent / ".installed-tf4").is_file():
        proc = subprocess.run(["make", "-s", "-C", str(REPO), "venv-tf4"], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            pytest.skip(f"could not build .venv-tf4 (make venv-tf4): {proc.stderr.strip()[-500:]}")
    return TF4_PYTHON


def read_in_tf4(python: Path, checkpoint: Path, tmp_path: Path) -> tuple[dict, torch.Tensor]:
    out = tmp_path / "tf4.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [str(python), "-c", READER, str(checkpoint), json.dumps(TEXTS), str(out)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), torch.load(f"{out}.pt")


@pytest.mark.parametrize("name", ["qwen2", "mistral"])
@pytest.mark.slow
def test_a_dapo_checkpoint_reads_the_same_in_transformers_457(
    name: str, tf4_python: Path, qwen2_dir: Family, mistral_dir: Family, tmp_path: Path
) -> None:
    family = qwen2_dir if name == "qwen2" else mistral_dir
    model, tokenizer = load_policy(family.path)
    save_policy(model, tokenizer, tmp_path / "model")  # what dapo train writes into a checkpoint
    seen, logits = read_in_tf4(tf4_python, tmp_path / "model", tmp_path)
    assert seen["version"].startswith("4.57.")
    assert seen["rope_theta"] == 1_000_000.0  # not 4.x's default of 10,000
    prompt = format_prompt(tokenizer, [{"role": "user", "content": TEXTS[0]}])
    assert seen["prompt"] == prompt
    assert seen["ids"] == [tokenizer(t, add_special_tokens=False)["input_ids"] for t in [prompt, *TEXTS]]
    assert (seen["eos"], seen["pad"]) == (family.eos_ids[0], family.pad_id)
    with torch.no_grad():
        expected = model(torch.tensor([seen["ids"][0]])).logits[0]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_the_tiny_char_policy_checkpoint_reads_in_transformers_457(tf4_python: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """The generic fast tokenizer is saved under a name 4.x has (5.x writes ``TokenizersBackend``)."""
    model, tokenizer = load_policy(tiny_model_dir)
    save_policy(model, tokenizer, tmp_path / "model")
    assert json.loads((tmp_path / "model" / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    seen, logits = read_in_tf4(tf4_python, tmp_path / "model", tmp_path)
    assert seen["tokenizer"] == "PreTrainedTokenizerFast"
    assert seen["ids"][1:] == [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    with torch.no_grad():
        expected = model(torch.tensor([seen["ids"][0]])).logits[0]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


def test_make_portable_copies_rope_theta_up_and_renames_the_backend(tmp_path: Path) -> None:
    from dapo_cli.models.compat import make_portable, portable_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TokenizersBackend", "eos_token": "<eos>"}))
    make_portable(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rope_theta"] == 5e5 and "rope_scaling" not in config
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>"}
    scaled = portable_config({"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": 2.0}, "rope_theta": 1e4})
    assert scaled["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert portable_config({"rope_theta": 1e4}) == {"rope_theta": 1e4}  # a 4.x-style config stays as it is

