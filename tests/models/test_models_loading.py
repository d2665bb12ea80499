"""resolve_model / load_policy: builtin:tiny cache path, local folders, hub ids offline, errors."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from fixtures.hub_cache import populate
from fixtures.tiny import QUICK_TINY
from transformers import PreTrainedTokenizerFast

import dapo_cli.models.hub as hub
import dapo_cli.models.loading as loading
from dapo_cli.errors import UserError
from dapo_cli.models.loading import MODEL_CARD, default_cache_dir, is_hub_id, load_policy, resolve_model, tiny_cache_path
from dapo_cli.models.tiny import build_tiny_model_for, save_policy
from dapo_cli.models.tokenizer import build_char_tokenizer, char_vocab
from dapo_cli.warmstart import ensure_model

SMALL = QUICK_TINY
TEXT = "What is 1+2?\n\n x"


@pytest.fixture(scope="module")
def builtin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_model("builtin:tiny", SMALL, cache_dir=tmp_path_factory.mktemp("cache"))


def test_resolve_model_names_the_builtin_cache_folder_and_builds_nothing(tmp_path, capsys):
    # pure path resolution: the folder a build would go to, built or not (dapo_cli.warmstart.ensure_model builds)
    path = resolve_model("builtin:tiny", SMALL, cache_dir=tmp_path)
    assert path == tmp_path / f"tiny-{SMALL.fingerprint()}" == tiny_cache_path(SMALL, tmp_path)
    assert list(tmp_path.iterdir()) == [] and capsys.readouterr().err == ""
    other = dataclasses.replace(SMALL, seed=1)  # another config is another cache entry
    assert resolve_model("builtin:tiny", other, cache_dir=tmp_path) == tmp_path / f"tiny-{other.fingerprint()}" != path


def test_cache_dir_defaults_to_env_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("DAPO_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("DAPO_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "dapo"


def test_resolve_model_other_specs(tmp_path):
    assert resolve_model(str(tmp_path), SMALL) == tmp_path
    assert str(resolve_model("Qwen/Qwen2.5-0.5B", SMALL)) == "Qwen/Qwen2.5-0.5B"
    with pytest.raises(UserError, match=r"unknown built-in model 'builtin:huge' \(valid: builtin:tiny\)"):
        resolve_model("builtin:huge", SMALL)


def test_load_builtin_gives_a_char_tokenizer_padding_left(builtin_dir):
    model, tok = load_policy(builtin_dir)
    assert isinstance(tok, PreTrainedTokenizerFast) and tok.padding_side == "left"
    assert tok(TEXT)["input_ids"] == [char_vocab()[c] for c in TEXT]
    assert tok.decode(tok(TEXT)["input_ids"]) == TEXT
    assert model.dtype == torch.float32 and model.device.type == "cpu"
    assert model.config.vocab_size == len(tok) == 114


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_load_a_plain_save_pretrained_dir_keeps_the_char_tokenizer(tmp_path, architecture):
    # no dapo_model.json here (like a training checkpoint); qwen2 is the AutoTokenizer trap
    tok = build_char_tokenizer()
    cfg = dataclasses.replace(SMALL, architecture=architecture)
    original = build_tiny_model_for(cfg, tok)
    save_policy(original, tok, tmp_path)
    model, loaded = load_policy(tmp_path, dtype=torch.bfloat16)
    assert loaded(TEXT)["input_ids"] == tok(TEXT)["input_ids"]
    assert model.dtype == torch.bfloat16 and model.config.model_type == architecture
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    with torch.no_grad():
        expected = original(ids).logits
        got = model.float()(ids).logits
    assert torch.allclose(got, expected, atol=0.1)  # bfloat16 weights: ~3 significant digits


def test_tokenizer_without_pad_gets_eos_as_pad(tmp_path):
    tok = build_char_tokenizer()
    save_policy(build_tiny_model_for(SMALL, tok), tok, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del config["pad_token"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    _, loaded = load_policy(tmp_path)
    assert loaded.pad_token == "<eos>" and loaded.pad_token_id == loaded.eos_token_id == 1


def test_missing_or_invalid_directories_raise_user_error(tmp_path):
    with pytest.raises(UserError, match="model directory not found: ./nope"):
        load_policy("./nope")
    with pytest.raises(UserError, match="is not a model directory \\(no config.json\\)"):
        load_policy(tmp_path)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(UserError, match="is not a model directory"):
        load_policy(tmp_path / "file.txt")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="config.json is not valid JSON: line 1 column 2: .*; re-save it"):
        load_policy(tmp_path)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A freshly saved untrained tiny policy (its own copy: the tests below damage it)."""
    tokenizer = build_char_tokenizer()
    save_policy(build_tiny_model_for(SMALL, tokenizer), tokenizer, tmp_path / "m")
    return tmp_path / "m"


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_truncate, r"model\.safetensors is truncated or corrupt: \d+ bytes, its header promises \d+"),
        (lambda p: p.write_bytes(b"\x00" * 3), r"model\.safetensors is truncated \(3 bytes\)"),
        (lambda p: p.write_bytes(b"\xff" * 64), r"model\.safetensors has a corrupt header \(not a safetensors file, or truncated\)"),
        (lambda p: p.write_bytes((2).to_bytes(8, "little") + b"[]"), r"model\.safetensors has a corrupt header \(not a JSON object\)"),
        (lambda p: p.unlink(), r"it holds no weights \(no \*\.safetensors or pytorch_model\.bin\)"),
    ],
    ids=["truncated", "tiny", "garbage", "not-an-object", "missing"],
)
def test_damaged_weights_are_one_line_errors_before_loading(saved: Path, damage, message: str) -> None:
    damage(saved / "model.safetensors")
    assert loading.model_dir_problem(saved) is not None
    with pytest.raises(UserError, match=f"model {re.escape(str(saved))}: {message}; re-save it") as info:
        load_policy(saved)
    assert "\n" not in str(info.value)


def test_weights_that_do_not_fit_the_config_are_one_line_errors(saved: Path, capfd) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(saved / "model.safetensors")
    name = next(iter(tensors))
    tensors[name] = torch.zeros(3, 3)  # a complete file whose tensor has the wrong shape
    save_file(tensors, saved / "model.safetensors", metadata={"format": "pt"})
    assert loading.model_dir_problem(saved) is None  # the header is fine: only loading finds it
    with pytest.raises(UserError, match=f"its weights do not fit its config.json \\({re.escape(name)} MISMATCH"):
        load_policy(saved)
    assert "LOAD REPORT" not in capfd.readouterr().err  # transformers' report is replaced by the one line


def test_an_intact_folder_has_no_problem(saved: Path) -> None:
    assert loading.model_dir_problem(saved) is None
    loading.check_model_dir(saved)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty hub cache of the test's own, offline."""
    cache = tmp_path / "hf-hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_hub_id_loads_offline_from_the_standard_cache(hub_cache, saved, monkeypatch):
    """HF_HUB_OFFLINE=1 and a cache in the documented layout: the id loads like the folder it holds."""
    files = {p.name: p for p in saved.iterdir()}
    snapshot = populate(hub_cache, "dapo-test/tiny-policy", files)
    assert loading.local_model_dir("dapo-test/tiny-policy") == snapshot
    model, tokenizer = load_policy("dapo-test/tiny-policy")
    reference, _ = load_policy(saved)
    assert isinstance(tokenizer, PreTrainedTokenizerFast) and tokenizer.padding_side == "left"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    assert loading.load_tokenizer("dapo-test/tiny-policy")(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]
    # and through HF_HOME (HF_HOME/hub) when HF_HUB_CACHE is unset
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(hub_cache.parent / "home"))
    populate(hub_cache.parent / "home" / "hub", "dapo-test/other", files)
    assert loading.local_model_dir("dapo-test/other").is_relative_to(hub_cache.parent / "home" / "hub")


def test_hub_id_offline_raises_user_error(monkeypatch, hub_cache):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    expected = r"cannot load model 'dapo-test/absent-model': HF_HUB_OFFLINE is set.*give a local directory"
    with pytest.raises(UserError, match=expected):
        load_policy("dapo-test/absent-model")


def test_hub_id_unreachable_raises_user_error_without_waiting(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("dapo_cli.models.hub.hub_reachable", lambda timeout_s=3.0: False)
    expected = r"cannot load model 'dapo-test/absent-model': the Hugging Face hub cannot be reached"
    with pytest.raises(UserError, match=expected):
        load_policy("dapo-test/absent-model")


def test_hub_reachable_is_false_for_a_closed_port(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    assert hub.hub_reachable(timeout_s=1.0) is False


@pytest.mark.parametrize(
    ("spec", "hub"),
    [
        ("Qwen/Qwen2.5-0.5B", True),
        ("gpt2", True),
        ("runs/exp/ckpt", False),
        ("./model", False),
        ("/abs/model", False),
        ("~/model", False),
        ("a b/c", False),
    ],
)
def test_is_hub_id(spec, hub):
    assert is_hub_id(spec) is hub
