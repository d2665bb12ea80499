"""Tests for ``dapo_cli.data.loader``: dataset specs, prompt templating, and the resumable prompt stream."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from dapo_cli.data.loader import (
    SYNTHETIC_DATA_SEED,
    Prompt,
    PromptStream,
    build_prompts,
    dataset_manifest,
    load_rows,
)
from dapo_cli.data.schema import make_row, write_dapo_parquet
from dapo_cli.errors import UserError
from dapo_cli.fileio import sha256_file

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
AIME = DATA / "aime-2024.parquet"
HAS_SYNTHETIC = importlib.util.find_spec("dapo_cli.data.synthetic") is not None
HAS_DATASETS = importlib.util.find_spec("dapo_cli.data.registry") is not None


def prompts(n: int) -> list[Prompt]:
    return [Prompt(text=f"q{i}", ground_truth=str(i), problem_id=str(i)) for i in range(n)]


def ids(batch: list[Prompt]) -> list[int]:
    return [int(p.problem_id) for p in batch]


# ---------------------------------------------------------------- PromptStream


def test_each_epoch_is_a_fresh_permutation() -> None:
    stream = PromptStream(prompts(10), seed=0)
    epoch0, epoch1 = ids(stream.next(10)), ids(stream.next(10))
    assert sorted(epoch0) == sorted(epoch1) == list(range(10))
    assert epoch0 != epoch1  # reshuffled (deterministic for seed 0)
    assert epoch0 != list(range(10))  # and actually shuffled
    assert stream.state_dict() == {"epoch": 1, "position": 10}


def test_crossing_the_epoch_boundary() -> None:
    whole = ids(PromptStream(prompts(5), seed=3).next(15))  # epochs 0, 1, 2 back to back
    stream = PromptStream(prompts(5), seed=3)
    assert ids(stream.next(3)) == whole[0:3]
    assert stream.state_dict() == {"epoch": 0, "position": 3}
    assert ids(stream.next(4)) == whole[3:7]  # 2 from epoch 0, then 2 from epoch 1
    assert stream.state_dict() == {"epoch": 1, "position": 2}
    assert ids(stream.next(8)) == whole[7:15]  # the rest of epoch 1 and all of epoch 2
    assert stream.state_dict() == {"epoch": 2, "position": 5}
    for start in (0, 5, 10):
        assert sorted(whole[start : start + 5]) == [0, 1, 2, 3, 4]


def test_a_request_larger_than_the_dataset_spans_epochs() -> None:
    out = ids(PromptStream(prompts(3), seed=1).next(7))
    assert len(out) == 7
    assert sorted(out[:3]) == sorted(out[3:6]) == [0, 1, 2]


def test_state_dict_replays_the_same_sequence() -> None:
    stream = PromptStream(prompts(7), seed=11)
    stream.next(5)
    stream.next(4)  # now mid epoch 1
    state = stream.state_dict()
    expected = ids(stream.next(12))

    resumed = PromptStream(prompts(7), seed=11)
    resumed.load_state_dict(dict(state))
    assert ids(resumed.next(12)) == expected
    assert resumed.state_dict() == stream.state_dict()


def test_order_depends_on_the_seed_only() -> None:
    assert ids(PromptStream(prompts(20), seed=5).next(40)) == ids(PromptStream(prompts(20), seed=5).next(40))
    assert ids(PromptStream(prompts(20), seed=5).next(20)) != ids(PromptStream(prompts(20), seed=6).next(20))


def test_no_shuffle_is_dataset_order_every_epoch() -> None:
    stream = PromptStream(prompts(4), seed=0, shuffle=False)
    assert ids(stream.next(6)) == [0, 1, 2, 3, 0, 1]


def test_empty_training_set_is_a_user_error() -> None:
    with pytest.raises(UserError, match="training set is empty"):
        PromptStream([], seed=0)


# ---------------------------------------------------------------- load_rows


@pytest.mark.skipif(not HAS_SYNTHETIC, reason="dapo_cli.data.synthetic is not built yet")
def test_load_rows_synthetic() -> None:
    rows = load_rows("synthetic:add-3digit", split="train", synthetic_size=25)
    assert len(rows) == 25
    assert rows == load_rows("synthetic:add-3digit", split="train", synthetic_size=25)  # fixed generation seed
    row = rows[0]
    assert row["data_source"] == "synthetic/add-3digit"
    assert row["prompt"][0]["role"] == "user"
    assert row["extra_info"]["split"] == "train"
    assert [r["extra_info"]["index"] for r in rows] == list(range(25))
    # every ground truth is the integer sum of "What is a+b?"
    for r in rows:
        problem = r["extra_info"]["raw_problem"]
        a, b = problem.removeprefix("What is ").removesuffix("?").split("+")
        assert r["reward_model"]["ground_truth"] == str(int(a) + int(b))
    val = load_rows("synthetic:add-3digit", split="val", synthetic_size=25)
    assert not {r["extra_info"]["raw_problem"] for r in val} & {r["extra_info"]["raw_problem"] for r in rows}


@pytest.mark.skipif(not HAS_SYNTHETIC, reason="dapo_cli.data.synthetic is not built yet")
def test_load_rows_unknown_synthetic_task() -> None:
    with pytest.raises(UserError, match="add-3digit"):
        load_rows("synthetic:nope", split="train", synthetic_size=5)


@pytest.mark.skipif(not AIME.is_file(), reason=f"shared data not found at {AIME}")
def test_load_rows_aime_2024_parquet() -> None:
    rows = load_rows(str(AIME), split="test", synthetic_size=0)
    assert len(rows) == 960  # 30 problems x 32 copies (the avg@32 layout)
    indices = [r["extra_info"]["index"] for r in rows]
    assert len(set(indices)) == 30
    assert all(indices.count(i) == 32 for i in set(indices))
    assert all(r["reward_model"]["ground_truth"].isdigit() for r in rows)  # AIME answers are integers 0-999


def test_load_rows_own_parquet(tmp_path: Path) -> None:
    path = tmp_path / "mine.parquet"
    write_dapo_parquet([make_row("1+1?", "2", index=7), make_row("2+2?", "4", index=8)], path)
    rows = load_rows(str(path), split="train", synthetic_size=0)
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", "4"]


@pytest.mark.skipif(not HAS_DATASETS, reason="dapo_cli.data.registry is not built yet")
def test_load_rows_dapo_jsonl_through_the_dataset_layer(tmp_path: Path) -> None:
    rows = [make_row("1+1?", "2", index=0), make_row("2+2?", "4", index=1)]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert load_rows(str(path), split="train", synthetic_size=0) == rows


@pytest.mark.parametrize("spec", ["missing.parquet", "data/missing", "/nonexistent/x.jsonl"])
def test_load_rows_missing_path_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=re.escape(spec)):
        load_rows(spec, split="train", synthetic_size=0)


def test_load_rows_unknown_name_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="no-such-dataset"):
        load_rows("no-such-dataset", split="train", synthetic_size=0)


# ---------------------------------------------------------------- prompts and manifest


def test_build_prompts_templates_and_drops_long_prompts() -> None:
    rows = [
        make_row("short", "1", index=10, template="{problem}"),
        make_row("much too long", "2", index=11, template="{problem}"),
        make_row("fits!", "3", index=12, template="{problem}"),
    ]
    rows[2]["extra_info"] = None  # no extra_info: the problem id is the row number

    def fmt(messages) -> str:
        return "U: " + messages[0]["content"]

    prompts_, dropped = build_prompts(rows, fmt, len, max_prompt_length=8)  # "U: short" is 8 characters
    assert dropped == 1
    assert prompts_ == [Prompt("U: short", "1", "10"), Prompt("U: fits!", "3", "2")]


def test_dataset_manifest(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    write_dapo_parquet([make_row("p", "1", index=0)], path)
    manifest = dataset_manifest(["synthetic:add-3digit", str(path), "aime24"], [100, 1, 30], synthetic_size=100)
    assert manifest == [
        {"spec": "synthetic:add-3digit", "rows": 100, "generator": "add-3digit", "size": 100, "seed": SYNTHETIC_DATA_SEED},
        {"spec": str(path), "rows": 1, "path": str(path.resolve()), "sha256": sha256_file(path)},
        {"spec": "aime24", "rows": 30},
    ]
