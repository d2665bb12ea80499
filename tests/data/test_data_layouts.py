"""Published layouts of math sets: detection from field names, the report, field options, answer rules.

Rows below mirror the published datasets (field names and the shape of each value, as on
the Hugging Face hub); the shared real files are used as they are (../shared/data).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_cli.data.layouts import (
    FieldOptions,
    Layout,
    answer_from_value,
    detect_layout,
    final_answer,
)
from dapo_cli.data.prepare import PrepareOptions, run_prepare
from dapo_cli.data.readers import open_input, read_input
from dapo_cli.data.schema import DAPO_INSTRUCTION
from dapo_cli.errors import UserError

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data not found at {DATA}")

# openai/gsm8k (main, train row 0): question / answer, the answer a worked solution ending "#### N"
GSM8K = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether "
    "in April and May.\n#### 72",
}
# the same layout with a thousands comma in the final number (GSM8K writes e.g. "#### 1,080")
GSM8K_COMMA = {"question": "A shop sells 36 boxes of 30 pens. How many pens?", "answer": "36*30 = <<36*30=1080>>1,080\n#### 1,080"}
# hendrycks/competition_math: problem / solution / level / type; the answer only in the solution's last \boxed{}
MATH = {
    "problem": "If $x^2+y^2=1$, what is the largest possible value of $|x|+|y|$?",
    "solution": "If $(x,y)$ lies on the circle, so does $(x,-y)$... Thus the largest value is $\\boxed{\\sqrt{2}}$.",
    "level": "Level 3",
    "type": "Algebra",
}
# meta-math/MetaMathQA: query / response / type / original_question; the response ends "The answer is: N"
METAMATH = {
    "query": "James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
    "response": "He writes each friend 3*2=<<3*2=6>>6 pages a week\nSo he writes 6*2=<<6*2=12>>12 pages every week\n"
    "That means he writes 12*52=<<12*52=624>>624 pages a year\n#### 624\nThe answer is: 624",
    "type": "GSM_Rephrased",
    "original_question": "James writes a 3-page letter to 2 different friends twice a week.  How many pages does he write a year?",
}
# AI-MO/NuminaMath-CoT: source / problem / solution / messages (user problem, assistant solution)
NUMINA = {
    "source": "synthetic_math",
    "problem": "What is the sum of the positive divisors of 18?",
    "solution": "The divisors are 1, 2, 3, 6, 9, 18, so the sum is $1+2+3+6+9+18=\\boxed{39}$.",
    "messages": [
        {"content": "What is the sum of the positive divisors of 18?", "role": "user"},
        {"content": "The divisors are 1, 2, 3, 6, 9, 18 ... $\\boxed{39}$.", "role": "assistant"},
    ],
}
# agentica-org/DeepScaleR-Preview-Dataset: problem / answer / solution; here the solution boxes the AMC letter
DEEPSCALER = {
    "problem": "The operation $\\otimes$ is defined for all nonzero numbers by $a \\otimes b = \\frac{a^{2}}{b}$. "
    "Determine $[(1 \\otimes 2) \\otimes 3] - [1 \\otimes (2 \\otimes 3)]$.",
    "answer": "-\\frac{2}{3}",
    "solution": "1. Apply the operation ... = -\\frac{2}{3}$\n\nThus, the answer is $\\boxed{A}$.",
}
# KbsdJames/Omni-MATH: domain (list) / difficulty / problem / solution / answer / source
OMNI = {
    "domain": ["Mathematics -> Number Theory -> Other"],
    "difficulty": 5.0,
    "problem": "Find the number of positive integers $n \\le 100$ such that $n^2+1$ is divisible by $5$.",
    "solution": "... so there are $\\boxed{40}$ of them.",
    "answer": "40",
    "source": "HMMT",
}
# QwenLM/Qwen2.5-Math evaluation/data/olympiadbench: question / solution (list) / final_answer (list) / context
OLYMPIAD = {
    "id": 1606,
    "context": None,
    "question": "Determine the smallest positive integer $n$ such that $n!$ ends in exactly 6 zeros.",
    "solution": ["Trailing zeros count the factors 5 ... so $n=25$."],
    "final_answer": ["$25$"],
    "is_multiple_answer": False,
}
OLYMPIAD_TWO = {**OLYMPIAD, "id": 1607, "question": "Find all primes $p$ with $p^2+2$ prime.", "final_answer": ["$3$", "$5$"]}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def found(path: Path, fields: FieldOptions | None = None) -> list[tuple[str, str | None, str]]:
    return [(p.problem, p.answer, p.answer_source) for p in read_input(path, fields).problems]


# ---------------------------------------------------------------------------
# each published layout, detected


def test_gsm8k_answer_after_hashes(tmp_path: Path) -> None:
    source = open_input(write_jsonl(tmp_path / "gsm8k.jsonl", [GSM8K, GSM8K_COMMA]))
    assert source.describe() == 'jsonl, 2 rows; problem from "question"; answer from "answer"'
    assert [(a, s) for _, a, s in found(source.path)] == [("72", "answer:####"), ("1,080", "answer:####")]
    result = run_prepare(PrepareOptions(output=tmp_path / "out.parquet", inputs=(source.path,)))
    truths = [r["reward_model"]["ground_truth"] for r in pq.read_table(tmp_path / "out.parquet").to_pylist()]
    assert truths == ["72", "1080"] and dict(result.kept) == {"integer": 2}


def test_math_boxed_in_the_solution(tmp_path: Path) -> None:
    source = open_input(write_jsonl(tmp_path / "math.jsonl", [MATH]))
    assert source.describe() == 'jsonl, 1 rows; problem from "problem"; answer from the worked solution in "solution"'
    assert found(source.path) == [(MATH["problem"], "\\sqrt{2}", "solution:boxed")]


def test_metamathqa_query_and_the_answer_is(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "metamath.jsonl", [METAMATH])
    source = open_input(path)
    assert source.layout.problem == ("query",) and source.layout.solution == ("response",)
    # "#### 624" is not the last line; the last line "The answer is: 624" is
    assert found(path) == [(METAMATH["query"], "624", "response:the_answer_is")]


def test_numinamath_problem_and_solution_messages_unused(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "numina.jsonl", [NUMINA])
    assert open_input(path).layout == Layout(("problem",), (), ("solution",))
    assert found(path) == [(NUMINA["problem"], "39", "solution:boxed")]


def test_deepscaler_answer_has_precedence_over_the_solution(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "deepscaler.jsonl", [DEEPSCALER, {**DEEPSCALER, "problem": "Again?", "answer": ""}])
    source = open_input(path)
    assert source.describe() == (
        'jsonl, 2 rows; problem from "problem"; answer from "answer", else from the worked solution in "solution"'
    )
    # the answer field wins (-2/3), not the solution's boxed choice letter; an empty answer falls back to the solution
    assert [(a, s) for _, a, s in found(path)] == [("-\\frac{2}{3}", "answer"), ("A", "solution:boxed")]


def test_omni_math_answer_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "omni.jsonl", [OMNI])
    assert found(path) == [(OMNI["problem"], "40", "answer")]


def test_list_answers_one_kept_several_dropped(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "olympiadbench.jsonl", [OLYMPIAD, OLYMPIAD_TWO])
    source = open_input(path)
    assert source.layout.answer == ("final_answer",) and source.layout.solution == ("solution",)
    problems = list(source.raw_problems())
    assert [(p.answer, p.answer_source, p.drop) for p in problems] == [
        ("$25$", "final_answer:list", None),
        (None, "final_answer:list", "multiple_answers"),
    ]
    # "context" exists but is never guessed: the report says how to prepend it
    assert source.describe().endswith('; "context" not prepended (--context-field context to prepend it)')
    result = run_prepare(PrepareOptions(output=tmp_path / "out.parquet", inputs=(path,)))
    assert dict(result.kept) == {"integer": 1} and dict(result.dropped) == {"multiple_answers": 1}


def test_chat_messages_prompt_takes_the_user_turn_without_the_dapo_instruction(tmp_path: Path) -> None:
    # the DAPO/verl prompt column (a list of {role, content}) next to a plain answer column (no reward_model)
    problem = "Find the remainder when $2^{10}$ is divided by $7$."
    rows = [
        {
            "data_source": "math",
            "prompt": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": DAPO_INSTRUCTION.replace("{problem}", problem)},
            ],
            "answer": "2",
        },
        {"data_source": "math", "prompt": [{"role": "user", "content": "  What is $3\\cdot 4$? "}], "answer": "12"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chat.parquet")
    source = open_input(tmp_path / "chat.parquet")
    assert source.kind == "raw" and source.layout.problem_kind == "chat messages"
    assert source.describe() == 'parquet, 2 rows; problem from "prompt" (chat messages: the user turn); answer from "answer"'
    assert found(tmp_path / "chat.parquet") == [(problem, "2", "answer"), ("What is $3\\cdot 4$?", "12", "answer")]


@needs_data
@pytest.mark.parametrize(
    ("name", "report"),
    [
        # raw-amc23.jsonl has both "problem" and "question" (the same text) and a float "answer"
        ("raw-amc23.jsonl", 'jsonl, 40 rows; problem from "problem", else "question"; answer from "answer"'),
        ("raw-gaokao2023en.jsonl", 'jsonl, 385 rows; problem from "question"; answer from "answer"'),
        ("raw-minerva_math.jsonl", 'jsonl, 272 rows; problem from "problem"; answer from the worked solution in "solution"'),
        ("aime-2024.parquet", "parquet, 960 rows; prepared DAPO rows (prompt, reward_model.ground_truth)"),
    ],
)
def test_detection_report_of_the_shared_files(name: str, report: str) -> None:
    assert open_input(DATA / name).describe() == report


# ---------------------------------------------------------------------------
# field options


def test_field_options_win_and_context_is_prepended(tmp_path: Path) -> None:
    records = [
        {"preamble": "Let $f(x)=x^2$.", "ask": "Compute $f(3)$.", "answer": "wrong", "result": 9, "question": "unused"},
        {"preamble": None, "ask": "Compute $2+2$.", "answer": "wrong", "result": [4], "question": "unused"},
    ]
    path = write_jsonl(tmp_path / "custom.jsonl", records)
    fields = FieldOptions(problem="ask", answer="result", context=("preamble",))
    source = open_input(path, fields)
    assert source.describe() == (
        'jsonl, 2 rows; problem from "ask" (--problem-field); context "preamble" prepended (--context-field); '
        'answer from "result" (--answer-field)'
    )
    assert found(path, fields) == [
        ("Let $f(x)=x^2$.\n\nCompute $f(3)$.", "9", "result"),
        ("Compute $2+2$.", "4", "result:list"),  # a null context adds nothing
    ]


def test_solution_field_alone_replaces_answer_detection(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "deepscaler.jsonl", [DEEPSCALER])
    source = open_input(path, FieldOptions(solution="solution"))
    assert (source.layout.answer, source.layout.solution) == ((), ("solution",))
    assert found(path, FieldOptions(solution="solution"))[0][1:] == ("A", "solution:boxed")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (FieldOptions(answer="final"), r'has no field "final" \(--answer-field\); its fields: "problem", "answer", "solution"$'),
        (FieldOptions(problem="Problem"), r'has no field "Problem" \(--problem-field\)'),
        (FieldOptions(context=("ctx\nx",)), r'has no field "ctx\\nx" \(--context-field\)'),  # a newline stays on one line
    ],
)
def test_a_named_field_that_does_not_exist_is_one_line(tmp_path: Path, fields: FieldOptions, message: str) -> None:
    path = write_jsonl(tmp_path / "deepscaler.jsonl", [DEEPSCALER])
    with pytest.raises(UserError, match=message) as info:
        open_input(path, fields)
    assert "\n" not in str(info.value)


def test_a_file_without_answer_fields_is_one_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bare.jsonl", [{"problem": "1+1?", "notes": "x"}])
    with pytest.raises(UserError, match=r'has no answer field: expected one of answer, .* \(found: "problem", "notes"\)'):
        open_input(path)


# ---------------------------------------------------------------------------
# value rules


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("step\n#### 72", ("####", "72")),
        ("#### 1,234", ("####", "1,234")),
        ("Work.\nThe answer is: 18", ("the_answer_is", "18")),
        ("So the answer is 5.", ("the_answer_is", "5")),
        ("So the answer is $\\boxed{6630}$ Angstroms.", ("boxed", "6630")),  # raw-minerva_math.jsonl, "6630" row
        ("The answer is 3, not 4.\nWe check: $\\boxed{4}$.", ("boxed", "4")),  # "The answer is" not on the last line
        ("no final answer here", None),
    ],
)
def test_final_answer_of_a_worked_solution(text: str, expected: tuple[str, str] | None) -> None:
    assert final_answer(text) == expected


@pytest.mark.parametrize(
    ("value", "text", "source", "drop"),
    [
        (["$25$"], "$25$", "a:list", None),
        (["$3$", "$5$"], None, "a:list", "multiple_answers"),
        ([None, "", "7"], "7", "a:list", None),  # blanks do not count
        ([], None, "none", None),
        (27, "27", "a", None),
        (27.0, "27.0", "a", None),
        (True, None, "none", None),
    ],
)
def test_answer_values(value: object, text: str | None, source: str, drop: str | None) -> None:
    got = answer_from_value(value, "a")
    assert (got.text, got.source, got.drop) == (text, source, drop)


def test_detection_precedence_per_role() -> None:
    columns = ["query", "input", "prompt", "question", "problem", "completion", "output", "response", "solution",
               "expected_answer", "ground_truth", "final_answer", "answer"]  # fmt: skip
    layout = detect_layout(columns, [], FieldOptions(), "x")
    assert layout.problem == ("problem", "question", "prompt", "input", "query")
    assert layout.answer == ("answer", "final_answer", "ground_truth", "expected_answer")
    assert layout.solution == ("solution", "response", "output", "completion")


def test_answer_rules_are_linear_on_hostile_text() -> None:
    hostile = [
        "The answer is " * 50_000,  # 700,000 characters, one match per 14
        "\\boxed{" * 50_000,  # boxes that never close
        "####" * 100_000 + "\n" * 100_000,
    ]
    start = time.perf_counter()
    for text in hostile:
        answer_from_value(text, "answer")
    assert time.perf_counter() - start < 1.0
