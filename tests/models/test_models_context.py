"""The model's context and the length budget: config.json without weights, hub ids from the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.hub_cache import populate

from dapo_cli.config import load_config
from dapo_cli.errors import UserError
from dapo_cli.models.context import check_budget, check_fits, context_of_config, context_of_spec


def test_context_is_read_from_the_config_or_its_text_config() -> None:
    assert context_of_config({"max_position_embeddings": 32768}) == 32768
    assert context_of_config({"n_positions": 1024}) == 1024  # GPT-2 style
    assert context_of_config({"text_config": {"max_position_embeddings": 8192}}) == 8192  # multimodal wrappers
    assert context_of_config({"hidden_size": 8}) is None


def test_context_of_each_kind_of_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert context_of_spec("builtin:tiny", 256) == (256, "model.tiny.max_position_embeddings")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    assert context_of_spec(str(folder), 256)[0] == 512
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert context_of_spec("org/model", 256)[0] is None  # not cached: checked when it generates
    populate(tmp_path / "hub", "org/model", {"config.json": folder / "config.json"})
    assert context_of_spec("org/model", 256) == (512, "max_position_embeddings of org/model")


def test_budget_names_every_term_and_what_to_lower() -> None:
    check_budget({"a": 100, "b": 412}, 512, "here")  # exactly fits
    check_budget({"a": 10**6}, None, "unknown")  # no context stated: nothing to check
    with pytest.raises(UserError, match=r"^a \(100\) \+ b \(413\) = 513 exceeds the model's context of 512 positions \(here\); lower a or b$"):
        check_budget({"a": 100, "b": 413}, 512, "here")


def test_fits_says_how_far_to_lower_or_that_the_prompt_alone_overruns() -> None:
    from types import SimpleNamespace

    Model = lambda: SimpleNamespace(config=SimpleNamespace(max_position_embeddings=100))
    check_fits(60, 40, Model())
    with pytest.raises(UserError, match="60 tokens \\+ max_tokens 41 = 101 .* lower max_tokens to at most 40 "):
        check_fits(60, 41, Model())
    with pytest.raises(UserError, match="the prompt alone does not fit"):
        check_fits(120, 1, Model())


def test_preflight_refuses_a_budget_over_builtin_tinys_context() -> None:
    from dapo_cli.cli.preflight import check_context

    cfg = load_config(None, ["rollout.max_response_length=193"])  # tiny.yaml: prompts 64, context 256
    with pytest.raises(UserError, match=r"data.max_prompt_length \(64\) \+ rollout.max_response_length \(193\) = 257 .* \(model.tiny.max_position_embeddings\)"):
        check_context(cfg)
    check_context(load_config(None, ["rollout.max_response_length=192"]))
