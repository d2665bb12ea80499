"""Synthetic arithmetic tasks: worked steps by hand, determinism, disjoint splits, DAPO rows."""

from __future__ import annotations

import re

import pytest

from dapo_cli.data.schema import read_dapo_rows, write_dapo_parquet
from dapo_cli.data.synthetic import (
    SPLITS,
    SYNTHETIC_TASKS,
    addition_steps,
    generate_examples,
    generate_rows,
    get_task,
    multiplication_steps,
    running_sum_steps,
    split_of,
    subtraction_steps,
)
from dapo_cli.errors import UserError

_TOKEN = re.compile(r"\d+|[+\-*]")


def _arith(expr: str) -> int:
    """Value of an expression of non-negative integers with + - * (a test oracle; no eval)."""
    tokens = _TOKEN.findall(expr)
    assert "".join(tokens) == expr, expr
    terms: list[int] = [int(tokens[0])]  # products first, then signed sum
    signs: list[int] = [1]
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            terms[-1] *= int(num)
        else:
            terms.append(int(num))
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))


# --- worked steps, derived by hand ------------------------------------------------


def test_addition_steps_carry_through_every_column():
    # 385+47: 5+7=12 (write 2, carry 1); 8+4+1=13 (write 3, carry 1); 3+0+1=4 -> 432
    assert addition_steps([385, 47]) == ["5+7+0=12", "8+4+1=13", "3+0+1=4"]
    # 99+1: 9+1=10; 9+0+1=10; the final carry is the leading digit -> 100
    assert addition_steps([99, 1]) == ["9+1+0=10", "9+0+1=10"]
    assert addition_steps([0, 0]) == ["0+0+0=0"]
    # 47+385+9: 7+5+9=21 (carry 2); 4+8+0+2=14 (carry 1); 0+3+0+1=4 -> 441
    assert addition_steps([47, 385, 9]) == ["7+5+9+0=21", "4+8+0+2=14", "0+3+0+1=4"]
    # several terms, a carry above 9: 99+99+99+99 = 396: 9*4=36 (carry 3); 9*4+3=39 -> 396
    assert addition_steps([99, 99, 99, 99]) == ["9+9+9+9+0=36", "9+9+9+9+3=39"]


def test_subtraction_steps_borrow_and_no_borrow():
    # 385-47: 5<7 borrow -> 15-7-0=8; 8-4-1=3; 3-0-0=3 -> 338
    assert subtraction_steps(385, 47) == ["15-7-0=8", "8-4-1=3", "3-0-0=3"]
    # 100-1: 10-1-0=9; 0-0-1<0 borrow again -> 10-0-1=9; 1-0-1=0 -> 099 = 99
    assert subtraction_steps(100, 1) == ["10-1-0=9", "10-0-1=9", "1-0-1=0"]
    assert subtraction_steps(7, 7) == ["7-7-0=0"]
    with pytest.raises(ValueError):
        subtraction_steps(3, 4)


def test_multiplication_steps():
    # 47*8: 7*8=56 (write 6, carry 5); 4*8+5=37 -> 376
    assert multiplication_steps(47, 8) == ["7*8+0=56", "4*8+5=37"]
    # 905*3: 5*3=15 (carry 1); 0*3+1=1; 9*3=27 -> 2715
    assert multiplication_steps(905, 3) == ["5*3+0=15", "0*3+1=1", "9*3+0=27"]
    with pytest.raises(ValueError):
        multiplication_steps(47, 12)


@pytest.mark.parametrize("name", list(SYNTHETIC_TASKS))
def test_every_line_of_every_solution_is_correct_arithmetic(name):
    for ex in generate_examples(name, 300, seed=3):
        problem = re.fullmatch(r"What is ([0-9+\-*]+)\?", ex.problem)
        assert problem, ex.problem
        assert _arith(problem.group(1)) == ex.answer
        *steps, last = ex.solution.split("\n")
        assert last == f"Answer: {ex.answer}" == ex.direct_solution
        assert steps
        for line in steps:
            lhs, rhs = line.split("=")
            assert _arith(lhs) == int(rhs), (ex.problem, line)


@pytest.mark.parametrize("name", ["add-3digit", "add-5digit"])
def test_column_solutions_spell_the_answer_digits(name):
    # the units digits of the column sums, read upwards, behind the last column's carry
    # (385+47: sums 12, 13, 4 -> carry 0, digits "4","3","2" -> 432)
    for ex in generate_examples(name, 200, seed=0):
        sums = [int(line.split("=")[1]) for line in ex.solution.split("\n")[:-1]]
        digits = "".join(str(s % 10) for s in reversed(sums))
        assert int(str(sums[-1] // 10) + digits) == ex.answer


# --- determinism, duplicates, splits ----------------------------------------------


def test_generate_examples_is_deterministic_and_duplicate_free():
    a = generate_examples("arith-medium", 500, seed=7)
    assert a == generate_examples("arith-medium", 500, seed=7)
    assert a != generate_examples("arith-medium", 500, seed=8)
    assert len({ex.problem for ex in a}) == 500
    # a prefix of a longer request is the shorter request (one seeded stream)
    assert generate_examples("arith-medium", 100, seed=7) == a[:100]


@pytest.mark.slow
def test_train_and_val_are_disjoint_across_seeds_and_tasks():
    train = {ex.problem for s in (0, 1) for ex in generate_examples("add-2digit", 2000, seed=s)}
    val = {ex.problem for s in (0, 1) for ex in generate_examples("add-2digit", 300, seed=s, split="val")}
    val3 = {ex.problem for ex in generate_examples("add-3digit", 300, seed=0, split="val")}
    assert train.isdisjoint(val) and train.isdisjoint(val3)
    assert all(split_of(p) == "train" for p in train)
    assert all(split_of(p) == "val" for p in val | val3)


def test_split_shares_are_about_90_5_5():
    counts = {s: 0 for s in SPLITS}
    for a in range(100):
        for b in range(100):
            counts[split_of(f"What is {a}+{b}?")] += 1
    # 10,000 problems: binomial sd of the 5% buckets is ~22, so +-150 is > 6 sd
    assert abs(counts["val"] - 500) < 150 and abs(counts["test"] - 500) < 150


@pytest.mark.slow
def test_exhausted_split_and_bad_arguments_raise_user_error():
    with pytest.raises(UserError, match="fewer than 600 distinct val problems"):
        generate_examples("add-2digit", 600, seed=0, split="val")  # 10,000 problems, ~500 in val
    with pytest.raises(UserError, match=r"unknown synthetic task 'nope' \(valid: add-2digit, add-3digit"):
        get_task("nope")
    with pytest.raises(UserError, match="valid: train, val, test"):
        generate_examples("add-3digit", 3, seed=0, split="dev")
    with pytest.raises(UserError, match=">= 0"):
        generate_examples("add-3digit", -1, seed=0)


# --- difficulty levels ------------------------------------------------------------


@pytest.mark.slow
def test_long_task_responses_can_exceed_48_tokens_while_easy_ones_fit():
    # one token per character plus <eos>; a 48-token limit cuts responses of > 47 characters
    def too_long(name: str, limit: int) -> float:
        exs = generate_examples(name, 1000, seed=0)
        return sum(len(ex.solution) + 1 > limit for ex in exs) / len(exs)

    assert too_long("add-2digit", 48) == too_long("add-3digit", 48) == too_long("arith-medium", 48) == 0.0
    # 5 columns (operand lengths uniform in 1..5: P(max = 5) = 1 - (4/5)^2 = 36%) take
    # 5 lines of 7-8 chars + 5 newlines + "Answer: " + 5-6 digits + EOS = 54-60 tokens > 48
    # (plus the 4-column sums with carries in every column: 4*8 + 4 + 13 + 1 = 50)
    assert 0.3 < too_long("add-5digit", 48) < 0.5
    assert too_long("add-5digit", 64) == 0.0


# --- DAPO rows --------------------------------------------------------------------


def test_generate_rows_match_the_dapo_schema_and_round_trip(tmp_path):
    rows = generate_rows("add-3digit", 5, seed=0, split="val")
    examples = generate_examples("add-3digit", 5, seed=0, split="val")
    for i, (row, ex) in enumerate(zip(rows, examples)):
        assert row["prompt"] == [{"content": ex.problem, "role": "user"}]  # bare problem, no instruction
        assert row["data_source"] == "synthetic/add-3digit"
        assert row["reward_model"]["ground_truth"] == str(ex.answer)
        assert row["extra_info"] == {
            "index": i,
            "raw_problem": ex.problem,
            "split": "val",
            "original_answer": str(ex.answer),
            "conversion": "integer",
        }
    write_dapo_parquet(rows, tmp_path / "val.parquet")
    assert read_dapo_rows(tmp_path / "val.parquet") == rows


def test_looped_solution_repeats_one_working_line_a_geometric_number_of_times():
    import random

    from dapo_cli.data.synthetic import looped_solution

    solution = "5+7+0=12\n8+4+1=13\nAnswer: 132"
    rng = random.Random(0)
    extra = []
    for _ in range(4000):
        out = looped_solution(solution, rng, 0.75).split("\n")
        assert out[-1] == "Answer: 132" and out.count("Answer: 132") == 1  # the answer line is never repeated
        assert [line for i, line in enumerate(out) if i == 0 or line != out[i - 1]] == solution.split("\n")
        extra.append(len(out) - 3)
    # R ~ Geometric: P(R >= r) = 0.75^r, E[R] = 0.75 / 0.25 = 3 (sd of R = sqrt(0.75)/0.25 ≈ 3.5; of the mean ≈ 0.055)
    assert abs(sum(extra) / len(extra) - 3.0) < 0.25
    assert abs(sum(e >= 1 for e in extra) / len(extra) - 0.75) < 0.03
    assert looped_solution("Answer: 7", rng, 0.75) == "Answer: 7"  # a direct answer has no working line
    assert looped_solution(solution, rng, 0.0) == solution
    capped = [looped_solution(solution, rng, 0.95, max_chars=40) for _ in range(200)]
    assert max(len(c) for c in capped) <= 40 and max(len(c) for c in capped) > 40 - 9  # copies of 8+1 characters
    with pytest.raises(ValueError):
        looped_solution(solution, rng, 1.0)


def test_the_fewshot_task_puts_one_worked_example_before_the_problem_in_the_dapo_instruction():
    from dapo_cli.data.schema import DAPO_INSTRUCTION

    [row] = generate_rows("fewshot-add-2digit", 1, seed=0, split="val")
    [ex] = generate_examples("fewshot-add-2digit", 1, seed=0, split="val")
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "user"]
    assert row["prompt"][0]["content"] == DAPO_INSTRUCTION.replace("{problem}", "What is 3+4?")
    assert row["prompt"][1]["content"] == "3 + 4 = 7\nAnswer: 7"  # the format the verifier reads
    assert row["prompt"][2]["content"] == DAPO_INSTRUCTION.replace("{problem}", ex.problem)
    assert row["extra_info"]["raw_problem"] == ex.problem and row["reward_model"]["ground_truth"] == str(ex.answer)
    # add-2digit's problems (a+b, 1-2 digit operands), in the same hash split
    for e in generate_examples("fewshot-add-2digit", 50, seed=0, split="val"):
        a, b = map(int, re.fullmatch(r"What is (\d{1,2})\+(\d{1,2})\?", e.problem).groups())
        assert e.answer == a + b and split_of(e.problem) == "val"


def test_tasks_without_shots_keep_the_bare_single_user_message():
    for name, task in SYNTHETIC_TASKS.items():
        if not task.shots:
            assert task.messages("What is 1+2?") == [{"role": "user", "content": "What is 1+2?"}], name


def test_the_chain_task_works_left_to_right_in_running_sums_after_its_example():
    from dapo_cli.data.schema import DAPO_INSTRUCTION

    # 8+15+6: 8+15=23, then 23+6=29 (the example turn's own sums)
    assert running_sum_steps([8, 15, 6]) == ["8+15=23", "23+6=29"]
    assert running_sum_steps([99, 99, 99, 99]) == ["99+99=198", "198+99=297", "297+99=396"]
    examples = generate_examples("fewshot-chain-add", 600, seed=0)
    counts = {2: 0, 3: 0, 4: 0}
    for ex in examples:
        terms = [int(t) for t in re.fullmatch(r"What is (\d{1,2}(?:\+\d{1,2}){1,3})\?", ex.problem).group(1).split("+")]
        counts[len(terms)] += 1
        *steps, last = ex.solution.split("\n")
        assert len(steps) == len(terms) - 1 and last == f"Answer: {sum(terms)}" and ex.answer == sum(terms)
        assert int(steps[-1].split("=")[1]) == ex.answer
    assert all(150 < c < 250 for c in counts.values()), counts  # a third each (600 draws: sd ~12)
    [row] = generate_rows("fewshot-chain-add", 1, seed=0, split="val")
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "user"]
    assert row["prompt"][0]["content"] == DAPO_INSTRUCTION.replace("{problem}", "What is 8+15+6?")
    assert row["prompt"][1]["content"] == "8 + 15 = 23\n23 + 6 = 29\nAnswer: 29"


def test_the_three_example_task_mixes_a_direct_answer_between_two_worked_ones():
    from dapo_cli.data.schema import DAPO_INSTRUCTION

    [row] = generate_rows("fewshot3-add-2digit", 1, seed=0, split="val")
    [ex] = generate_examples("fewshot3-add-2digit", 1, seed=0, split="val")
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant"] * 3 + ["user"]
    problems = [m["content"] for m in row["prompt"][0::2]]
    assert problems == [DAPO_INSTRUCTION.replace("{problem}", p) for p in ("What is 25+13?", "What is 3+4?", "What is 47+29?", ex.problem)]
    # each example's answer is the verifier's format and the right sum (25+13=38, 3+4=7, 47+29=76)
    assert [m["content"] for m in row["prompt"][1::2]] == ["25 + 13 = 38\nAnswer: 38", "Answer: 7", "47 + 29 = 76\nAnswer: 76"]
    # add-2digit's problems (a+b, 1-2 digit operands): the val split holds the 400 distinct problems the ladder validates on
    held_out = generate_examples("fewshot3-add-2digit", 400, seed=0, split="val")
    assert len({e.problem for e in held_out}) == 400
    for e in held_out:
        a, b = map(int, re.fullmatch(r"What is (\d{1,2})\+(\d{1,2})\?", e.problem).groups())
        assert e.answer == a + b and split_of(e.problem) == "val"
