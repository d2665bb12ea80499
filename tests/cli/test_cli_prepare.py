"""`dapo prepare-data` through the CLI: every shared file with MLflow, the manifest, and bad inputs."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dapo_cli.cli import app
from dapo_cli.fileio import sha256_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))  # hf_layout: save_to_disk folders with pyarrow

from hf_layout import save_dict_to_disk

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data not found at {DATA}")
runner = CliRunner()


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for the module (creating a store costs about a second)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@needs_data
@pytest.mark.parametrize(
    ("name", "rows", "problems", "kept", "dropped"),
    [
        ("aime-2024.parquet", 30, 30, {"integer": 30}, 930),  # 30 problems × 32 copies → one row each
        ("raw-amc23.jsonl", 40, 40, {"integer": 40}, 0),
        # line 368 "$12\\times18\\times11$" is kept as an expression: 12 * 18 * 11 = 2376
        ("raw-gaokao2023en.jsonl", 264, 264, {"integer": 196, "expression": 1, "fraction": 37, "surd": 27, "pi": 3}, 121),
        ("raw-minerva_math.jsonl", 65, 65, {"integer": 64, "pi": 1}, 207),
    ],
)
@pytest.mark.slow
def test_prepare_each_shared_file_records_mlflow(
    tmp_path: Path, tracking_uri: str, name: str, rows: int, problems: int, kept: dict, dropped: int
) -> None:
    from mlflow import MlflowClient

    out = tmp_path / "prepared.parquet"
    args = ["prepare-data", str(DATA / name), "-o", str(out), "--tracking-uri", tracking_uri, "--experiment", "prep-test"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    table = pq.read_table(out).to_pylist()
    assert len(table) == rows and len({r["extra_info"]["index"] for r in table}) == problems
    assert all(re.fullmatch(r"-?\d+", r["reward_model"]["ground_truth"]) for r in table)

    manifest = json.loads((tmp_path / "prepared.parquet.manifest.json").read_text())
    assert manifest["counts"]["kept_by_conversion"] == kept and manifest["counts"]["dropped"] == dropped
    assert manifest["counts"]["rows_read"] == rows + dropped
    [source] = manifest["inputs"]
    assert source["sha256"] == sha256_file(DATA / name)
    assert manifest["outputs"] == [{"split": "train", "path": str(out), "rows": rows, "sha256": sha256_file(out)}]
    assert manifest["command"] == "prepare-data" and manifest["options"]["seed"] == 0

    run_id = re.search(r"MLflow run: (\w+)", result.stdout).group(1)
    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "prepare-data-prepared"
    assert run.data.params["inputs"] == str(DATA / name) and run.data.params["output"] == str(out)
    assert run.data.params["repeat"] == "1" and run.data.params["val_fraction"] == "0.0"
    assert run.data.metrics["data/kept"] == rows and run.data.metrics["data/dropped"] == dropped
    assert run.data.metrics["data/train_rows"] == rows
    assert all(run.data.metrics[f"data/kept_{c}"] == n for c, n in kept.items())
    assert [a.path for a in client.list_artifacts(run_id)] == ["prepared.parquet.manifest.json"]
    assert "prepare-data" in result.stdout and "total" in result.stdout
    duplicates = 930 if name == "aime-2024.parquet" else 0  # only the AIME file repeats its problems (32 times)
    assert manifest["counts"]["duplicates_removed"] == duplicates and run.data.metrics["data/duplicates_removed"] == duplicates
    assert f"duplicates removed: {duplicates} rows (first copy kept); {problems} distinct problems;" in result.stdout


@needs_data
@pytest.mark.slow
def test_gaokao_summary_lists_drop_reasons(tmp_path: Path) -> None:
    result = runner.invoke(app, ["prepare-data", str(DATA / "raw-gaokao2023en.jsonl"), "-o", str(tmp_path / "g.parquet"), "--no-track"])
    assert result.exit_code == 0, result.output
    # gaokao line 170: "answer": "A" — one of 46 multiple-choice letters
    assert re.search(r"choice\s*│\s*46", result.stdout)
    assert "MLflow run" not in result.stdout


@needs_data
def test_split_repeat_and_no_track(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = ["prepare-data", str(DATA / "raw-amc23.jsonl"), "-o", "amc.parquet", "--val-fraction", "0.1", "--seed", "2"]
    result = runner.invoke(app, [*args, "--repeat", "4", "--no-track"])
    assert result.exit_code == 0, result.output
    train, val = pq.read_table("amc.parquet").to_pylist(), pq.read_table("amc.val.parquet").to_pylist()
    assert (len(train), len(val)) == (36 * 4, 4 * 4)  # round(40 · 0.1) = 4 val problems, each 4 times
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.jsonl"], "input file not found: missing.jsonl"),
        (["notes.txt"], "cannot tell the format of notes.txt"),
        (["nofield.jsonl"], "no problem field"),
        (["empty.jsonl"], "holds no rows"),
        (["choices.jsonl"], r"every row was dropped \(choice 2\)"),
        (["good.jsonl", "--template", "no placeholder"], "--template must contain"),
        (["good.jsonl", "--val-fraction", "2"], "--val-fraction must be in"),
        (["good.jsonl", "--answer-field", "final"], r'good.jsonl has no field "final" \(--answer-field\); its fields: "problem", "answer"$'),
        (["good.jsonl", "--context-field", "ctx"], r'good.jsonl has no field "ctx" \(--context-field\)'),
        (["adir"], r"input adir is a directory but not a Hugging Face datasets folder"),
        ([], "give input files or --synthetic NAME"),
    ],
)
def test_bad_inputs_exit_2_with_one_line_and_no_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("notes.txt").write_text("hello\n")
    Path("nofield.jsonl").write_text('{"text": "a", "answer": 1}\n')
    Path("empty.jsonl").write_text("")
    Path("choices.jsonl").write_text('{"problem": "Pick.", "answer": "A"}\n{"problem": "Again.", "answer": "(B)"}\n')
    Path("good.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n')
    Path("adir").mkdir()
    result = runner.invoke(app, ["prepare-data", *args, "-o", "out.parquet", "--no-track"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(message, lines[0]), result.stderr
    assert not Path("out.parquet").exists() and not Path("out.parquet.manifest.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["good.jsonl", "-o", "existing"], r"output existing is a directory; give a file path such as existing/train.parquet"),
        (["good.jsonl", "-o", "good.jsonl/out.parquet"], r"-o/--output good.jsonl/out.parquet is inside good.jsonl, which is a file"),
        (["deep.jsonl", "-o", "out.parquet"], r"deep.jsonl: line 1 nests arrays/objects deeper than 64 levels"),
        (["deep.json", "-o", "out.parquet"], r"deep.json: line 1 nests arrays/objects deeper than 64 levels"),
        (["binary.jsonl", "-o", "out.parquet"], r"binary.jsonl: line 2 is not UTF-8 text"),  # byte 10 ends line 1
    ],
)
def test_hostile_files_and_outputs_exit_2_with_one_line_and_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("existing").mkdir()
    Path("good.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n')
    Path("deep.jsonl").write_text('{"problem": "a", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    Path("deep.json").write_text("[" * 100_000 + "]" * 100_000)
    Path("binary.jsonl").write_bytes(bytes(range(256)))
    before = sorted(p.name for p in tmp_path.iterdir())
    result = runner.invoke(app, ["prepare-data", *args, "--no-track"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(message, lines[0]), result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no <dir>.manifest.json, no temporary file
    assert list(Path("existing").iterdir()) == []


def test_missing_output_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["prepare-data", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: missing -o/--output: where to write the parquet file"


@pytest.mark.slow
def test_synthetic_through_the_cli(tmp_path: Path) -> None:
    pytest.importorskip("dapo_cli.data.synthetic")
    out = tmp_path / "syn.parquet"
    result = runner.invoke(app, ["prepare-data", "--synthetic", "add-2digit", "--n", "12", "--seed", "5", "-o", str(out), "--no-track"])
    assert result.exit_code == 0, result.output
    table = pq.read_table(out).to_pylist()
    assert len(table) == 12 and all(r["data_source"] == "synthetic/add-2digit" for r in table)
    manifest = json.loads((tmp_path / "syn.parquet.manifest.json").read_text())
    assert manifest["options"]["synthetic"] == "add-2digit" and manifest["counts"]["kept"] == 12
    bad = runner.invoke(app, ["prepare-data", "--synthetic", "nope", "-o", str(tmp_path / "x.parquet"), "--no-track"])
    assert bad.exit_code == 2 and "unknown synthetic task 'nope'" in bad.stderr


PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def _dapo_math_like(path: Path) -> Path:
    """DAPO-Math-17K's columns; 3 problems × 5 copies (UUID index), one text published with answers 5 and 6."""
    import pyarrow as pa

    def row(problem: str, truth: str, index: str) -> dict:
        return {
            "data_source": "math_dapo",
            "prompt": [{"content": PREFIX + problem + SUFFIX, "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": truth, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": index},
        }

    problems = [("Find $1+2$.", "3", "0b0e"), ("Find $2+2$.", "4", "5d41"), ("Find $3 \\cdot 3$.", "9", "7f3a")]
    rows = [row(p, t, i) for _ in range(5) for p, t, i in problems]
    rows += [row("Find $2+3$.", "5", "c4ca"), row("Find $2+3$.", "6", "c4ca")]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.slow
def test_dedup_summary_manifest_and_mlflow(tmp_path: Path, tracking_uri: str) -> None:
    from mlflow import MlflowClient

    source, out = _dapo_math_like(tmp_path / "dapo-math-17k.parquet"), tmp_path / "train.parquet"
    result = runner.invoke(app, ["prepare-data", str(source), "-o", str(out), "--tracking-uri", tracking_uri])
    assert result.exit_code == 0, result.output
    # 17 rows: 3 × 5 copies (12 duplicates) + one text with two answers (both dropped)
    line = "duplicates removed: 12 rows (first copy kept); 3 distinct problems; conflicting answers: 2 rows of 1 problem dropped"
    assert line in result.stdout.splitlines()
    assert re.search(r"conflicting_duplicate\s*│\s*2", result.stdout) and re.search(r"duplicate\s*│\s*12", result.stdout)
    assert [r["extra_info"]["raw_problem"] for r in pq.read_table(out).to_pylist()] == ["Find $1+2$.", "Find $2+2$.", "Find $3 \\cdot 3$."]

    counts = json.loads((tmp_path / "train.parquet.manifest.json").read_text())["counts"]
    assert (counts["rows_read"], counts["kept"], counts["duplicates_removed"]) == (17, 3, 12)
    assert (counts["conflicting_duplicates_removed"], counts["conflicting_problems"], counts["deduplicated"]) == (2, 1, True)

    run = MlflowClient(tracking_uri=tracking_uri).get_run(re.search(r"MLflow run: (\w+)", result.stdout).group(1))
    assert run.data.params["keep_duplicates"] == "False"
    assert run.data.metrics["data/duplicates_removed"] == 12 and run.data.metrics["data/conflicting_duplicates_removed"] == 2
    assert run.data.metrics["data/distinct_problems"] == 3 and run.data.metrics["data/train_rows"] == 3


@pytest.mark.slow
def test_keep_duplicates_flag(tmp_path: Path) -> None:
    source, out = _dapo_math_like(tmp_path / "dapo-math-17k.parquet"), tmp_path / "all.parquet"
    result = runner.invoke(app, ["prepare-data", str(source), "-o", str(out), "--keep-duplicates", "--no-track"])
    assert result.exit_code == 0, result.output
    line = "duplicates kept (--keep-duplicates): 12 rows repeat an earlier problem; 1 problem with conflicting answers kept"
    assert line in result.stdout.splitlines()
    assert len(pq.read_table(out)) == 17
    again = runner.invoke(app, ["prepare-data", str(source), "-o", str(out), "--keep-duplicates", "--repeat", "2", "--no-track"])
    assert again.exit_code == 0, again.output  # 1–5 copies per problem: not the K-copies layout, --repeat allowed
    assert len(pq.read_table(out)) == 34


# ---------------------------------------------------------------------------
# layouts: the detection report, field options, datasets folders, the summary table at 80 columns


def _table_lines(stdout: str) -> list[str]:
    """The summary table's lines: from its title to the total row."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "prepare-data")
    end = next(i for i, line in enumerate(lines) if line.startswith("total"))
    return lines[start : end + 1]


@needs_data
@pytest.mark.slow
def test_detection_report_and_summary_table_of_the_shared_files(tmp_path: Path) -> None:
    names = ["raw-amc23.jsonl", "raw-gaokao2023en.jsonl", "raw-minerva_math.jsonl", "aime-2024.parquet"]
    args = ["prepare-data", *(str(DATA / n) for n in names), "-o", str(tmp_path / "all.parquet"), "--no-track"]
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:4] == [
        (
            'raw-amc23.jsonl: jsonl, 40 rows; problem from "problem", else "question"; answer from "answer"; '
            "1 per problem; answers found: answer 40"
        ),
        (
            'raw-gaokao2023en.jsonl: jsonl, 385 rows; problem from "question"; answer from "answer"; 1 per problem; '
            "answers found: answer 383, none 2"  # two records have "answer": ""
        ),
        (
            'raw-minerva_math.jsonl: jsonl, 272 rows; problem from "problem"; answer from the worked solution in '
            '"solution"; 1 per problem; answers found: solution:boxed 272'
        ),
        "aime-2024.parquet: parquet, 960 rows; prepared DAPO rows (prompt, reward_model.ground_truth); 32 per problem",
    ]
    table = _table_lines(result.stdout)
    assert all(len(line) <= 80 for line in table), "\n".join(table)
    assert table[1].split() == ["input", "read", "int", "expr", "frac", "surd", "pi", "kept", "dropped"]
    # whole names, one row each; gaokao: 196 + 1 (12*18*11) + 37 + 27 + 3 = 264 kept, 385 - 264 = 121 dropped
    assert [line.split() for line in table[3:]] == [
        ["raw-amc23.jsonl", "40", "40", "0", "0", "0", "0", "40", "0"],
        ["raw-gaokao2023en.jsonl", "385", "196", "1", "37", "27", "3", "264", "121"],
        ["raw-minerva_math.jsonl", "272", "64", "0", "0", "0", "1", "65", "207"],
        ["aime-2024.parquet", "960", "30", "0", "0", "0", "0", "30", "930"],
        ["total", "1657", "330", "1", "37", "27", "4", "399", "1258"],
    ]
    manifest = json.loads((tmp_path / "all.parquet.manifest.json").read_text())
    # the manifest keeps each report as printed, without the name, rows per problem and answers found
    assert [entry["detected"] for entry in manifest["inputs"]] == [line.split(": ", 1)[1].split("; 1 per problem")[0].split("; 32 per")[0] for line in lines[:4]]
    assert manifest["inputs"][2]["fields"] == {
        "problem": ["problem"], "problem_kind": "text", "context": [], "answer": [], "solution": ["solution"], "named_by_option": [],
    }  # fmt: skip


def test_long_names_are_shortened_in_the_middle_never_wrapped(tmp_path: Path) -> None:
    name = "openai-gsm8k-main-train-split-rephrased-with-many-extra-words-v2.jsonl"
    for folder, text in (("a", '{"question": "1+1?", "answer": "so 1+1=2\\n#### 2"}\n'), ("sub", '{"question": "2+2?", "answer": "#### 4"}\n')):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text(text)  # the same name in two folders
    result = runner.invoke(app, ["prepare-data", str(tmp_path / "a" / name), str(tmp_path / "sub" / name), "-o",
                                 str(tmp_path / "o.parquet"), "--no-track"], env={"COLUMNS": "80"})  # fmt: skip
    assert result.exit_code == 0, result.output
    table = _table_lines(result.stdout)
    assert all(len(line) <= 80 for line in table), "\n".join(table)
    rows = [line.split()[0] for line in table[3:-1]]
    assert all("…" in name and name.endswith(".jsonl") for name in rows) and len(rows) == 2
    assert rows[0].startswith("a/openai-gsm8k") and rows[1].startswith("sub/openai-gsm")  # colliding names keep their folder
    assert len(table) == 6  # title, header, rule, two rows, total: nothing wrapped


@pytest.mark.slow
def test_field_options_and_a_datasets_folder_are_recorded(tmp_path: Path, tracking_uri: str) -> None:
    from mlflow import MlflowClient

    # an OlympiadBench-like layout (QwenLM/Qwen2.5-Math evaluation/data/olympiadbench: context, question, final_answer
    # as a list) saved as a DatasetDict folder with train and test splits
    rows = [
        {"context": "A frog jumps 3 units.", "question": "After 4 jumps, how far is it?", "final_answer": ["$12$"], "note": "x"},
        {"context": None, "question": "What is $2^{5}$?", "final_answer": ["$32$"], "note": "y"},
        {"context": None, "question": "Name two primes.", "final_answer": ["$2$", "$3$"], "note": "z"},
    ]
    folder = save_dict_to_disk({"train": rows, "test": rows[:1]}, tmp_path / "olympiad")
    out = tmp_path / "o.parquet"
    args = ["prepare-data", str(folder), "-o", str(out), "--tracking-uri", tracking_uri, "--context-field", "context",
            "--answer-field", "final_answer"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        'olympiad: datasets, split train of train, test, 3 rows; problem from "question"; context "context" prepended '
        '(--context-field); answer from "final_answer" (--answer-field); 1 per problem; answers found: final_answer:list 3'
    )
    written = pq.read_table(out).to_pylist()
    assert [r["extra_info"]["raw_problem"] for r in written] == ["A frog jumps 3 units.\n\nAfter 4 jumps, how far is it?", "What is $2^{5}$?"]
    assert [r["reward_model"]["ground_truth"] for r in written] == ["12", "32"]
    manifest = json.loads((tmp_path / "o.parquet.manifest.json").read_text())
    [entry] = manifest["inputs"]
    assert entry["fields"]["answer"] == ["final_answer"] and entry["fields"]["named_by_option"] == ["answer", "context"]
    assert entry["fields"]["split"] == "train" and entry["dropped"] == {"multiple_answers": 1}
    assert manifest["options"]["answer_field"] == "final_answer" and manifest["options"]["context_fields"] == "context"
    run = MlflowClient(tracking_uri=tracking_uri).get_run(re.search(r"MLflow run: (\w+)", result.stdout).group(1))
    assert run.data.params["input_0_fields"] == "problem=question context=context answer=final_answer solution=-"
    assert run.data.params["input_0_split"] == "train" and run.data.params["answer_field"] == "final_answer"
    assert run.data.params["solution_field"] == ""
