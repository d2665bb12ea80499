"""What a dry run says a real run would build: read off the cache, never built."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_cli.ablate.estimate import LADDER_SFT_STEPS, LADDER_WARM_START_S, policy_to_build
from dapo_cli.config.load import build_config
from dapo_cli.models.loading import MODEL_CARD, tiny_cache_path


def test_a_missing_builtin_policy_is_named_with_its_scaled_cost_and_a_cached_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAPO_CACHE", str(tmp_path))
    cfg = build_config(None, ["model.path=builtin:tiny", "model.tiny.sft_steps=300"])
    line = policy_to_build(cfg)
    assert line is not None and list(tmp_path.iterdir()) == []  # looked, built nothing
    # 300 of the measured 600 steps: half of 12 min 23 s = 6.19 min → "about 6 min"
    assert LADDER_WARM_START_S == 743 and LADDER_SFT_STEPS == 600
    assert f"builtin:tiny (task {cfg.model.tiny.task}, 300 SFT steps) is not cached yet ({tiny_cache_path(cfg.model.tiny)})" in line
    assert "a real run builds it first, about 6 min on 2 cores" in line
    card = tiny_cache_path(cfg.model.tiny) / MODEL_CARD
    card.parent.mkdir(parents=True)
    card.write_text("{}")
    assert policy_to_build(cfg) is None


def test_a_folder_or_hub_id_needs_no_build(tmp_path: Path) -> None:
    assert policy_to_build(build_config(None, [f"model.path={tmp_path}"])) is None
    assert policy_to_build(build_config(None, ["model.path=HuggingFaceTB/SmolLM2-135M-Instruct"])) is None
