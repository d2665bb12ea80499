"""``generations.partial.jsonl`` read back by a resumed ``dapo eval --output DIR`` (``eval/generations.py``): its header
and every field of every record checked against the evaluation's settings, batches and K before anything is kept or
rewritten; each problem one error line naming the file, the line and the fix (issue 54)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from dapo_cli.errors import UserError
from dapo_cli.eval.generations import CHECKPOINT_FILE, GenerationCheckpoint, SampleRecord

SETTINGS = {"checkpoint": "m", "avg_k": 2, "seed": 0}
BATCHES = [["a"], ["b", "c"]]
FIX = "; delete it or use another --output DIR"


def sample(pid: str, j: int) -> SampleRecord:
    return SampleRecord(pid, j, "Answer: 2", "2", True, 1.0, "2", 3, False)


def partial(tmp_path: Path) -> list[str]:
    """A file as an evaluation killed after its 2 batches (K=2) leaves it; its lines."""
    ckpt = GenerationCheckpoint(tmp_path, SETTINGS, batches=BATCHES, k=2)
    for b, ids in enumerate(BATCHES):
        ckpt.append(b, [sample(pid, j) for pid in ids for j in range(2)])
    return (tmp_path / CHECKPOINT_FILE).read_text().splitlines()


def test_a_partial_file_as_written_resumes_every_batch(tmp_path: Path) -> None:
    partial(tmp_path)
    back = GenerationCheckpoint(tmp_path, SETTINGS, batches=BATCHES, k=2)
    assert sorted(back.done) == [0, 1] and back.records()[0] == sample("a", 0)


def line_edit(number: int, change: Callable[[Any], Any]) -> Callable[[list[str]], list[str]]:
    """Change line ``number`` (1-based) of the file, as JSON (``change`` returns the new value, or edits in place)."""
    def apply(lines: list[str]) -> list[str]:
        value = json.loads(lines[number - 1])
        out = change(value)
        lines[number - 1] = json.dumps(value if out is None else out)
        return lines
    return apply


def record(field: str, value: Any, line: int = 2, index: int = 0) -> Callable[[list[str]], list[str]]:
    def change(entry: dict) -> None:
        if value is KeyError:
            del entry["records"][index][field]
        else:
            entry["records"][index][field] = value
    return line_edit(line, change)


P = f"{{path}}: line"
CASES = [
    # ------------------------------------------------------------ the header
    ("header-not-json", lambda l: ["{settings", *l[1:]], f"{P} 1 is corrupt (not valid JSON: line 1 column 2: "),
    ("header-no-object", line_edit(1, lambda h: [h]), f"{P} 1 is not its settings header"),
    ("header-extra-key", line_edit(1, lambda h: h.update(more=1)), f"{P} 1 is not its settings header"),
    ("header-settings-list", line_edit(1, lambda h: {"settings": [1]}), f"{P} 1 is not its settings header"),
    ("header-other-model", line_edit(1, lambda h: h["settings"].update(checkpoint="other\x1b[2J")),
     f"{P} 1 says it holds generations made with other settings (checkpoint: 'other\\x1b[2J' then, 'm' now); use another --output DIR"),
    ("header-big-number", lambda l: ['{"settings": ' + "9" * 5000 + "}", *l[1:]], f"{P} 1 is corrupt (a number of more than 4,300 digits)"),
    ("empty", lambda l: [], "{path}: line 1 is not its settings header"),
    # ------------------------------------------------------------ a batch line
    ("batch-not-json", lambda l: [l[0], "{oops", l[2]], f"{P} 2 is corrupt (not valid JSON"),
    ("batch-deep", lambda l: [l[0], "[" * 100_000 + "]" * 100_000, l[2]], f"{P} 2 is corrupt (nested too deeply to read)"),
    ("batch-no-object", line_edit(2, lambda e: [e]), f'{P} 2 is not a finished batch ({{"batch": b, "records": [...]}})'),
    ("batch-extra-key", line_edit(2, lambda e: e.update(more=1)), f"{P} 2 is not a finished batch"),
    ("batch-records-not-list", line_edit(2, lambda e: e.update(records={})), f"{P} 2 is not a finished batch"),
    ("batch-index-string", line_edit(2, lambda e: e.update(batch="0")), f"{P} 2 is batch '0'; this evaluation's batches are 0..1"),
    ("batch-index-bool", line_edit(2, lambda e: e.update(batch=False)), f"{P} 2 is batch False"),
    ("batch-index-past-end", line_edit(2, lambda e: e.update(batch=2)), f"{P} 2 is batch 2; this evaluation's batches are 0..1"),
    ("batch-index-negative", line_edit(2, lambda e: e.update(batch=-1)), f"{P} 2 is batch -1"),
    ("batch-repeated", lambda l: [*l, l[1]], f"{P} 4 repeats batch 0"),
    ("batch-too-few", line_edit(3, lambda e: e["records"].__delitem__(-1)), f"{P} 3 holds 3 samples; batch 1 is 2 problem(s) x 2 samples, each once"),
    ("batch-duplicate-sample", line_edit(3, lambda e: e["records"].__setitem__(1, e["records"][0])), f"{P} 3 holds 4 samples"),
    ("batch-other-problem", record("problem_id", "c"), f"{P} 2 holds sample 0 of problem 'c'; batch 0 is samples 0..1 of problem(s) 'a'"),
    # ------------------------------------------------------------ one record's fields
    ("record-not-object", line_edit(2, lambda e: e["records"].__setitem__(0, 5)), f"{P} 2, record 1 is 5, not a sample record"),
    ("record-missing-field", record("score", KeyError), f"{P} 2, record 1 lacks score"),
    ("record-unknown-field", line_edit(2, lambda e: e["records"][1].update(extra=1)), f"{P} 2, record 2 has no field extra"),
    ("problem_id", record("problem_id", 0), f"{P} 2, record 1: problem_id is 0, not of type string"),
    ("sample_index-type", record("sample_index", "0"), f"{P} 2, record 1: sample_index is '0', not of type int64"),
    ("sample_index-bool", record("sample_index", False), f"{P} 2, record 1: sample_index is False, not of type int64"),
    ("sample_index-negative", record("sample_index", -1), f"{P} 2, record 1: sample_index is -1; it counts from 0"),
    ("sample_index-past-k", record("sample_index", 2), f"{P} 2 holds sample 2 of problem 'a'; batch 0 is samples 0..1"),
    ("response", record("response", ["x"]), f"{P} 2, record 1: response is ['x'], not of type string"),
    ("pred", record("pred", None), f"{P} 2, record 1: pred is None, not of type string"),
    ("acc", record("acc", "yes"), f"{P} 2, record 1: acc is 'yes', not of type bool"),
    ("score-type", record("score", "1"), f"{P} 2, record 1: score is '1', not of type float64"),
    ("score-nan", record("score", float("nan")), f"{P} 2, record 1: score is nan, not a finite number"),
    ("ground_truth", record("ground_truth", 2), f"{P} 2, record 1: ground_truth is 2, not of type string"),
    ("length-type", record("length", 3.5), f"{P} 2, record 1: length is 3.5, not of type int64"),
    ("length-negative", record("length", -3), f"{P} 2, record 1: length is -3; it counts from 0"),
    ("truncated", record("truncated", 0), f"{P} 2, record 1: truncated is 0, not of type bool"),
]


@pytest.mark.parametrize(("damage", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_field_of_the_partial_file_is_checked_and_nothing_is_rewritten(tmp_path: Path, damage, message: str) -> None:
    path = tmp_path / CHECKPOINT_FILE
    lines = damage(partial(tmp_path))
    path.write_text("".join(line + "\n" for line in lines) + '{"batch": 1, "rec')  # and a torn last write after them
    before = path.read_bytes()
    with pytest.raises(UserError) as info:
        GenerationCheckpoint(tmp_path, SETTINGS, batches=BATCHES, k=2)
    text = str(info.value)
    assert text.startswith(message.replace("{path}", str(path))), text
    assert text.endswith(FIX) or text.endswith("(or delete the file to start afresh)")
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_FILE]


def test_a_file_that_is_no_utf8_text_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_FILE
    lines = partial(tmp_path)
    path.write_bytes((lines[0] + "\n" + lines[1] + "\n").encode() + b"\xff\xfe\n")
    with pytest.raises(UserError, match=rf"^{path}: line 3 is not UTF-8 text{FIX}$"):
        GenerationCheckpoint(tmp_path, SETTINGS, batches=BATCHES, k=2)


def test_only_a_last_line_without_its_newline_is_a_torn_write(tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_FILE
    lines = partial(tmp_path)
    path.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:30])  # killed while writing batch 1
    assert sorted(GenerationCheckpoint(tmp_path, SETTINGS, batches=BATCHES, k=2).done) == [0]
    assert path.read_text() == lines[0] + "\n" + lines[1] + "\n"  # rewritten without it: appends start clean
    path.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:30] + "\n")  # a whole line that is no JSON: damage
    with pytest.raises(UserError, match=rf"{path}: line 3 is corrupt"):
        GenerationCheckpoint(tmp_path, SETTINGS, batches=BATCHES, k=2)
    path.write_text(lines[0] + "\n" + lines[1])  # complete but for its newline: kept, and the newline added
    assert sorted(GenerationCheckpoint(tmp_path, SETTINGS, batches=BATCHES, k=2).done) == [0]
    assert path.read_text() == lines[0] + "\n" + lines[1] + "\n"


def test_without_the_evaluations_layout_the_records_are_still_typed(tmp_path: Path) -> None:
    lines = partial(tmp_path)
    assert sorted(GenerationCheckpoint(tmp_path, SETTINGS).done) == [0, 1]
    entry = json.loads(lines[1])
    entry["records"][0] = {**asdict(sample("a", 0)), "acc": 1}
    (tmp_path / CHECKPOINT_FILE).write_text("\n".join([lines[0], json.dumps(entry)]) + "\n")
    with pytest.raises(UserError, match="line 2, record 1: acc is 1, not of type bool"):
        GenerationCheckpoint(tmp_path, SETTINGS)
