"""The named-dataset registry (dapo_cli/data/registry.py): resolution, checksums, download fallbacks."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
import pytest
from fixtures.hub_cache import populate

from dapo_cli.data import registry as D
from dapo_cli.data.schema import make_row, write_dapo_parquet
from dapo_cli.errors import UserError
from dapo_cli.fileio import sha256_file

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
AIME = DATA / "aime-2024.parquet"
needs_data = pytest.mark.skipif(not AIME.is_file(), reason=f"shared data not found at {DATA}")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))  # never the machine's own cache
    monkeypatch.delenv("DAPO_DATA_DIR", raising=False)


def test_registry_is_read_from_the_package_and_lists_aime24() -> None:
    registry = D.load_registry()
    assert D.registry_path().resolve() == (Path(__file__).resolve().parents[2] / "datasets" / "registry.yaml")
    entry = registry["aime24"]
    assert (entry.repo_id, entry.path_in_repo, entry.num_rows, entry.format) == (
        "BytedTsinghua-SIA/AIME-2024", "data/aime-2024.parquet", 960, "dapo",
    )


@needs_data
def test_registered_sha256_is_that_of_the_released_aime_file() -> None:
    assert D.get_dataset_entry("aime24").sha256 == sha256_file(AIME)


def test_unknown_name_lists_registered_names() -> None:
    with pytest.raises(UserError, match=r"unknown dataset 'aime25'.*registered names: aime24, dapo-math-17k"):
        D.resolve_dataset_path("aime25")


@needs_data
def test_aime24_resolves_through_dapo_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAPO_DATA_DIR", str(DATA))
    assert D.resolve_dataset("aime24") == DATA / "aime-2024.parquet"
    data = D.load_dataset_rows("aime24")
    assert len(data.rows) == 960 and data.source == DATA / "aime-2024.parquet" and data.raw_rows is None


def test_checksum_mismatch_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "data"
    fake.mkdir()
    (fake / "aime-2024.parquet").write_bytes(b"not the file")
    monkeypatch.setenv("DAPO_DATA_DIR", str(fake))
    with pytest.raises(UserError, match="does not match the registered 'aime24' file"):
        D.resolve_dataset("aime24")


@pytest.fixture
def hub_online(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the hub answers (tests never touch the network: hf_hub_download is faked too)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("dapo_cli.models.hub.hub_reachable", lambda timeout_s=3.0: True)


def test_offline_machine_fails_fast_saying_what_to_place_where(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as info:
        D.resolve_dataset("aime24")
    message = str(info.value)
    assert "is not cached and HF_HUB_OFFLINE is set" in message
    assert "place aime-2024.parquet" in message and str(tmp_path / "cache" / "datasets" / "aime-2024.parquet") in message
    assert f"the Hugging Face cache ({tmp_path / 'hf-hub'}" in message


@needs_data
@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_aime24_resolves_offline_from_the_standard_hub_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str
) -> None:
    """What hf_hub_download finds, dapo finds: HF_HUB_CACHE, or HF_HOME/hub, in the documented layout."""
    cache = tmp_path / "hf-home" / "hub" if variable == "HF_HOME" else tmp_path / "hf-hub"
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv(variable, str(cache.parent if variable == "HF_HOME" else cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = populate(cache, "BytedTsinghua-SIA/AIME-2024", {"data/aime-2024.parquet": AIME}, repo_type="dataset")
    assert D.resolve_dataset("aime24") == snapshot / "data" / "aime-2024.parquet"
    assert len(D.load_dataset_rows("aime24").rows) == 960
    # the same answer as the hub client's own offline lookup
    found = huggingface_hub.hf_hub_download(
        "BytedTsinghua-SIA/AIME-2024", "data/aime-2024.parquet", repo_type="dataset", cache_dir=cache, local_files_only=True
    )
    assert Path(found) == snapshot / "data" / "aime-2024.parquet"


def test_a_hub_cached_file_with_another_checksum_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not the file")
    populate(tmp_path / "hf-hub", "BytedTsinghua-SIA/AIME-2024", {"data/aime-2024.parquet": bad}, repo_type="dataset")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="does not match the registered 'aime24' file"):
        D.resolve_dataset("aime24")


def test_download_failure_is_a_user_error(monkeypatch: pytest.MonkeyPatch, hub_online: None) -> None:
    def failing(*args: object, **kwargs: object) -> str:
        raise huggingface_hub.errors.LocalEntryNotFoundError("no connection to the hub. Retry later")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", failing)
    with pytest.raises(UserError, match=r"cannot download dataset 'aime24' from the hub \(LocalEntryNotFoundError: no connection to the hub\); place aime-2024.parquet"):
        D.resolve_dataset("aime24")


@needs_data
def test_download_lands_in_the_hub_cache_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, hub_online: None) -> None:
    calls = []

    def fake_download(repo_id: str, filename: str, *, repo_type: str, cache_dir: Path) -> str:
        calls.append((repo_id, filename, repo_type))
        return str(populate(Path(cache_dir), repo_id, {filename: AIME}, repo_type=repo_type) / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    path = D.resolve_dataset("aime24")
    assert path.is_relative_to(tmp_path / "hf-hub")  # the hub's own cache, not a private copy
    assert sha256_file(path) == sha256_file(AIME)
    assert D.resolve_dataset("aime24") == path  # second time from the cache, no download
    assert calls == [("BytedTsinghua-SIA/AIME-2024", "data/aime-2024.parquet", "dataset")]


def test_raw_entry_without_hub_copy_points_to_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match=r"has no hub copy: download https://github.com/QwenLM/.*amc23"):
        D.resolve_dataset("amc23")


def test_dapo_jsonl_and_parquet_paths_load(tmp_path: Path) -> None:
    rows = [make_row("What is 1+1?", "2", index=0), make_row("What is 2+3?", "5", index=1)]
    write_dapo_parquet(rows, tmp_path / "set.parquet")
    (tmp_path / "set.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("set.parquet", "set.jsonl"):
        data = D.load_dataset_rows(str(tmp_path / name))
        assert [r["reward_model"]["ground_truth"] for r in data.rows] == ["2", "5"] and data.source.name == name


def test_malformed_jsonl_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"prompt": 1}\n{oops\n')
    with pytest.raises(UserError, match="bad.jsonl: line 2 is not valid JSON"):
        D.load_dataset_rows(str(tmp_path / "bad.jsonl"))


def test_registry_validation_names_the_problem() -> None:
    with pytest.raises(ValueError, match="format must be one of dapo, raw"):
        D.parse_registry({"x": {"filename": "x", "format": "csv", "description": "", "license": "", "source_url": ""}})
    with pytest.raises(ValueError, match="unexpected keyword argument 'colour'"):
        D.parse_registry({"x": {"filename": "x", "format": "dapo", "description": "", "license": "", "source_url": "", "colour": 1}})


@needs_data
def test_raw_registered_file_is_converted_by_prepare_data(monkeypatch: pytest.MonkeyPatch) -> None:
    # raw-amc23.jsonl: 40 problems with float answers such as 27.0, all integers → all kept
    monkeypatch.setenv("DAPO_DATA_DIR", str(DATA))
    data = D.load_dataset_rows("amc23")
    assert (data.raw_rows, len(data.rows)) == (40, 40)
    assert data.describe() == "raw-amc23.jsonl: 40 raw rows, 40 kept by the prepare-data conversion"
    first = data.rows[0]
    assert first["reward_model"]["ground_truth"] == "27"  # source line 1: "answer": 27.0
    assert first["prompt"][0]["content"].startswith("Solve the following math problem step by step.")


def test_registry_marks_what_is_unverified() -> None:
    registry = D.load_registry()
    entry = registry["dapo-math-17k"]
    # no copy of the file could be checked: no invented checksum or row count, and a note saying so
    assert (entry.verified, entry.sha256, entry.num_rows) == (False, None, None)
    assert "1.79 M rows" in entry.note and "issues/36" in entry.note
    assert all(e.verified for name, e in registry.items() if name != "dapo-math-17k")


@needs_data
def test_verified_entries_match_the_shared_files() -> None:
    from dapo_cli.data.readers import open_input

    for entry in D.load_registry().values():
        if entry.verified:
            path = DATA / entry.filename
            assert (sha256_file(path), open_input(path).rows_read) == (entry.sha256, entry.num_rows), entry.name


def test_registry_validation_of_verified() -> None:
    base = {"filename": "x", "format": "dapo", "description": "", "license": "", "source_url": ""}
    with pytest.raises(ValueError, match="verified: true needs sha256 and num_rows"):
        D.parse_registry({"x": {**base, "verified": True, "num_rows": 3}})
    with pytest.raises(ValueError, match="verified: false needs a note"):
        D.parse_registry({"x": base})
    assert D.parse_registry({"x": {**base, "note": "not checked"}})["x"].verified is False


def _dapo_file(path: Path, n: int) -> Path:
    write_dapo_parquet([make_row(f"Problem {i}?", str(i), index=i) for i in range(n)], path)
    return path


def test_unverified_entry_prints_rows_and_sha256_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    path = _dapo_file(data / "dapo-math-17k.parquet", 7)
    monkeypatch.setenv("DAPO_DATA_DIR", str(data))
    rows = D.load_dataset_rows("dapo-math-17k")
    line = (
        f"note: dataset 'dapo-math-17k' (dapo-math-17k.parquet): 7 rows found, expected unknown; "
        f"registry entry unverified (no checked sha256 or row count); sha256 {sha256_file(path)}"
    )
    assert len(rows.rows) == 7 and rows.check == line
    assert capsys.readouterr().err.strip() == line
    D.load_dataset_rows(str(path))  # a path is not a registered name: nothing to compare
    assert capsys.readouterr().err == ""


def test_row_count_mismatch_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _dapo_file(data / "mine.parquet", 4)
    entry = D.DatasetEntry("mine", "mine.parquet", "dapo", "", "", "", num_rows=5, note="row count from a card")
    monkeypatch.setattr(D, "load_registry", lambda: {"mine": entry})
    monkeypatch.setenv("DAPO_DATA_DIR", str(data))
    D.load_dataset_rows("mine")
    assert capsys.readouterr().err.startswith("warning: dataset 'mine' (mine.parquet): 4 rows found, expected 5; registry entry unverified")


@needs_data
def test_verified_entry_with_matching_rows_is_silent(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DAPO_DATA_DIR", str(DATA))
    assert D.load_dataset_rows("aime24").check is None and D.load_dataset_rows("amc23").check is None
    assert capsys.readouterr().err == ""
