"""Synthetic integer-answer arithmetic tasks for the tiny CPU policy.

Each task draws problems such as ``What is 47+385?`` together with a worked
solution whose last line is ``Answer: N`` -- the format the DAPO verifier reads
(the last ``Answer:`` line in the final 300 characters). Tasks are registered by
name in :data:`SYNTHETIC_TASKS`, ordered from easy to hard:

============  ===========================================================  ================
name          problems                                                     solution chars
============  ===========================================================  ================
add-2digit    a+b, 1-2 digit operands                                      17-29, mean 27
add-3digit    a+b, 1-3 digit operands (the warm-start default)             17-39, mean 33
arith-medium  a+b, a-b (a >= b), a*d (d one digit), 1-3 digit operands     17-39, mean 33
add-5digit    a+b, 1-5 digit operands (long answers)                       17-59, mean 44
============  ===========================================================  ================

``fewshot-add-2digit`` is for pretrained chat models (SmolLM2-135M-Instruct, see
``docs/real-model.md``): the problems of ``add-2digit``, each in the DAPO instruction
(:data:`~dapo_cli.data.schema.DAPO_INSTRUCTION`) after one worked example turn
(``What is 3+4?`` → ``3 + 4 = 7`` / ``Answer: 7``). Measured on SmolLM2-135M-Instruct at
T=1.0, avg@4 over 16 problems: the bare DAPO instruction 0/64 correct (it almost never writes
an ``Answer:`` line), with the example 16/64 on one-digit and 6/64 on two-digit operands.
``fewshot3-add-2digit`` (the testbed of the real-model ladder, ``docs/real-model-ladder.md``) asks the same
problems after three example turns: ``25+13`` worked (``25 + 13 = 38`` / ``Answer: 38``), ``3+4`` answered
directly (``Answer: 7``), ``47+29`` worked. The two styles make a response's length vary within a group, and the
worked turns raise the base accuracy: 28.9% right (85% with an ``Answer:`` line) against 9.1% (46%) with one
example, 48 train problems x 8 at T=1.0 (``benchmarks/ladder_regime.py``). Its prompt is 360 tokens in
SmolLM2's template (one example: 182).
``fewshot-chain-add`` is its longer sibling for the real-model ladder: 2-4 terms of 1-2 digits
(``What is 12+7+35?``, a third of the problems each), the example turn working left to right in
running sums (``8 + 15 = 23`` / ``23 + 6 = 29`` / ``Answer: 29``), so a response's length follows
how many terms it works through and how it writes them.

Worked solutions go column by column from the units digit, one line per column,
carry or borrow written explicitly (``5+7+0=12`` then ``8+4+1=13`` ...), and end
with ``Answer: N``. Operand lengths are drawn uniformly first, so short operands
are as common as long ones. The character-level policy spends one token per
character plus an EOS, so every solution of the first three tasks fits a 48-token
response limit, while about 39% of ``add-5digit`` solutions (the 5-column ones)
need 49-60 tokens: there a 48-token limit truncates a real share of responses and
caps the reachable accuracy below saturation, which is what the overlong-reward
ablations need; a 64-token limit fits them all.

Splits are disjoint by construction: every problem text is hashed (SHA-256) into
one of 100 buckets; buckets 0-4 are ``val``, 5-9 ``test``, the rest ``train``.
The partition depends only on the text, so it holds across seeds and tasks (a
val problem of ``add-2digit`` is never a train problem of ``add-3digit``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from dapo_cli.data.schema import DAPO_INSTRUCTION, make_row
from dapo_cli.errors import UserError, look_up, unknown_name

SPLITS: tuple[str, ...] = ("train", "val", "test")
"""Valid split names; see :func:`split_of` for the partition."""

PROMPT_TEMPLATE = "{problem}"
"""Synthetic rows carry the bare problem, not the long DAPO instruction: the tiny
policy is character-level (every character is a token), learns the ``Answer:``
format in its warm-start, and would spend ~5x the compute on a 230-character
instruction it cannot read."""


@dataclass(frozen=True)
class SyntheticExample:
    """One problem: ``problem`` text, worked ``solution`` (ends ``Answer: N``), integer ``answer``."""

    problem: str
    solution: str
    answer: int

    @property
    def direct_solution(self) -> str:
        """The solution without working: just the final ``Answer: N`` line."""
        return answer_line(self.answer)


Draw = tuple[str, int, Callable[[], list[str]]]
"""What a task's sampler returns: problem text, integer answer, and a thunk computing
the worked steps (built only for problems that land in the requested split)."""


@dataclass(frozen=True)
class SyntheticTask:
    """A named problem generator: ``sample(rng) -> (problem, answer, steps thunk)`` (see :data:`Draw`).

    ``template`` renders the problem into the user message (``{problem}`` replaced); ``shots``
    are worked ``(problem, response)`` examples shown first as earlier chat turns, each problem
    in the same template."""

    name: str
    description: str
    sample: Callable[[random.Random], Draw]
    template: str = PROMPT_TEMPLATE
    shots: tuple[tuple[str, str], ...] = ()

    def messages(self, problem: str) -> list[dict[str, str]]:
        """The prompt's chat messages: the shots' user/assistant turns, then the problem's user turn."""
        out: list[dict[str, str]] = []
        for shot_problem, response in self.shots:
            out.append({"role": "user", "content": self.template.replace("{problem}", shot_problem)})
            out.append({"role": "assistant", "content": response})
        out.append({"role": "user", "content": self.template.replace("{problem}", problem)})
        return out


def answer_line(answer: int) -> str:
    """The final line every solution ends with, in the DAPO verifier's format."""
    return f"Answer: {answer}"


def _digits(n: int, width: int) -> list[int]:
    """Decimal digits of ``n`` from the units up, zero-padded to ``width``."""
    return [(n // 10**i) % 10 for i in range(width)]


def _random_number(rng: random.Random, min_digits: int, max_digits: int) -> int:
    """Uniform digit count in [min_digits, max_digits], then uniform value of that length.

    Drawing the length first keeps short operands as common as long ones.
    """
    k = rng.randint(min_digits, max_digits)
    low = 0 if k == 1 else 10 ** (k - 1)
    return rng.randint(low, 10**k - 1)


def addition_steps(terms: Sequence[int]) -> list[str]:
    """Column addition from the units digit, one ``x+y+...+carry=sum`` line per column.

    ``[385, 47]`` -> ``["5+7+0=12", "8+4+1=13", "3+0+1=4"]``; a final carry becomes the
    leading digit(s) of the answer (432 here: the lines' last digits read upwards).
    Shorter terms are padded with zeros.
    """
    width = max(len(str(t)) for t in terms)
    lines, carry = [], 0
    for column in zip(*(_digits(t, width) for t in terms)):
        total = sum(column) + carry
        lines.append("+".join(map(str, column)) + f"+{carry}={total}")
        carry = total // 10
    return lines


def subtraction_steps(a: int, b: int) -> list[str]:
    """Column subtraction (``a >= b``), one ``x-y-borrow=r`` line per column.

    When ``x-y-borrow < 0`` the column borrows ten, written as a leading ``1``:
    ``385-47`` -> ``["15-7-0=8", "8-4-1=3", "3-0-0=3"]`` (answer 338).
    """
    if a < b:
        raise ValueError(f"subtraction_steps needs a >= b, got {a} < {b}")
    width = len(str(a))
    lines, borrow = [], 0
    for x, y in zip(_digits(a, width), _digits(b, width)):
        top = x if x - y - borrow >= 0 else 10 + x
        lines.append(f"{top}-{y}-{borrow}={top - y - borrow}")
        borrow = int(top > x)
    return lines


def multiplication_steps(a: int, d: int) -> list[str]:
    """Multiply by one digit ``d`` column by column, one ``x*d+carry=p`` line per column.

    ``47*8`` -> ``["7*8+0=56", "4*8+5=37"]``: the answer 376 is the last line's value
    followed by the units digits of the lines above it.
    """
    if not 0 <= d <= 9:
        raise ValueError(f"multiplication_steps needs a one-digit multiplier, got {d}")
    lines, carry = [], 0
    for x in _digits(a, len(str(a))):
        p = x * d + carry
        lines.append(f"{x}*{d}+{carry}={p}")
        carry = p // 10
    return lines


def _addition_problem(rng: random.Random, max_digits: int) -> Draw:
    a, b = _random_number(rng, 1, max_digits), _random_number(rng, 1, max_digits)
    return f"What is {a}+{b}?", a + b, partial(addition_steps, [a, b])


def _subtraction_problem(rng: random.Random, max_digits: int) -> Draw:
    a, b = _random_number(rng, 1, max_digits), _random_number(rng, 1, max_digits)
    a, b = max(a, b), min(a, b)
    return f"What is {a}-{b}?", a - b, partial(subtraction_steps, a, b)


def _multiplication_problem(rng: random.Random, max_digits: int) -> Draw:
    a, d = _random_number(rng, 1, max_digits), rng.randint(2, 9)
    return f"What is {a}*{d}?", a * d, partial(multiplication_steps, a, d)


def running_sum_steps(terms: Sequence[int]) -> list[str]:
    """The sum of ``terms`` left to right, one ``partial+next=total`` line per term after the first:
    ``[8, 15, 6]`` -> ``["8+15=23", "23+6=29"]``."""
    lines, total = [], terms[0]
    for t in terms[1:]:
        lines.append(f"{total}+{t}={total + t}")
        total += t
    return lines


def _sample_chain(rng: random.Random) -> Draw:
    """2-4 terms of 1-2 digits (the count drawn first, so each is a third of the problems)."""
    terms = [_random_number(rng, 1, 2) for _ in range(rng.randint(2, 4))]
    return f"What is {'+'.join(map(str, terms))}?", sum(terms), partial(running_sum_steps, terms)


def _sample_add2(rng: random.Random) -> Draw:
    return _addition_problem(rng, 2)


def _sample_add3(rng: random.Random) -> Draw:
    return _addition_problem(rng, 3)


def _sample_add5(rng: random.Random) -> Draw:
    return _addition_problem(rng, 5)


def _sample_medium(rng: random.Random) -> Draw:
    make = rng.choice((_addition_problem, _subtraction_problem, _multiplication_problem))
    return make(rng, 3)


def looped_solution(solution: str, rng: random.Random, continue_prob: float, *, max_chars: int | None = None) -> str:
    """``solution`` with one working line repeated: the degenerate repetition of a stuck generation.

    A working line (any line but the final ``Answer:`` one) is chosen uniformly and written
    ``1 + R`` times in a row, ``R ~ Geometric`` with ``P(R >= r) = continue_prob ** r``, so
    ``E[R] = q / (1 - q)`` extra copies (q = ``continue_prob``; 0.75 → 3 copies on average, 16%
    of loops with 6 or more). The work then goes on unchanged, so a loop is right when it ends
    -- but a long one runs past a response limit that every plain solution fits:
    ``"5+7+0=12\n8+4+1=13\nAnswer: 132"`` → ``"5+7+0=12\n5+7+0=12\n5+7+0=12\n8+4+1=13\nAnswer: 132"``.
    A solution without a working line (a direct answer) is returned unchanged. ``max_chars``
    stops the copies before the text would grow past it (the draw of ``R`` is unchanged), which
    bounds the length of a warm-start batch.
    """
    if not 0.0 <= continue_prob < 1.0:
        raise ValueError(f"continue_prob must be in [0, 1), got {continue_prob}")
    lines = solution.split("\n")
    if len(lines) < 2:
        return solution
    i = rng.randrange(len(lines) - 1)
    extra = 0
    while rng.random() < continue_prob:
        extra += 1
    if max_chars is not None:
        extra = max(0, min(extra, (max_chars - len(solution)) // (len(lines[i]) + 1)))
    return "\n".join(lines[: i + 1] + [lines[i]] * extra + lines[i + 1 :])


SYNTHETIC_TASKS: dict[str, SyntheticTask] = {
    t.name: t
    for t in (
        SyntheticTask("add-2digit", "a+b, 1-2 digit operands, column-by-column", _sample_add2),
        SyntheticTask("add-3digit", "a+b, 1-3 digit operands, column-by-column", _sample_add3),
        SyntheticTask(
            "arith-medium", "a+b, a-b, a*d (d one digit), 1-3 digits, column-by-column", _sample_medium
        ),
        SyntheticTask("add-5digit", "a+b, 1-5 digit operands, column-by-column (long answers)", _sample_add5),
        SyntheticTask(
            "fewshot-add-2digit", "a+b, 1-2 digit operands, DAPO instruction after one worked chat example",
            _sample_add2, template=DAPO_INSTRUCTION, shots=(("What is 3+4?", "3 + 4 = 7\nAnswer: 7"),),
        ),
        SyntheticTask(
            "fewshot3-add-2digit",
            "a+b, 1-2 digit operands, DAPO instruction after three example turns: worked, answered directly, worked",
            _sample_add2, template=DAPO_INSTRUCTION,
            shots=(("What is 25+13?", "25 + 13 = 38\nAnswer: 38"), ("What is 3+4?", "Answer: 7"),
                   ("What is 47+29?", "47 + 29 = 76\nAnswer: 76")),
        ),
        SyntheticTask(
            "fewshot-chain-add", "2-4 terms of 1-2 digits, DAPO instruction after one worked example of running sums",
            _sample_chain, template=DAPO_INSTRUCTION, shots=(("What is 8+15+6?", "8 + 15 = 23\n23 + 6 = 29\nAnswer: 29"),),
        ),
    )
}
"""Task registry, easy to hard; see the module docstring for the formats."""


def get_task(name: str) -> SyntheticTask:
    """Look up a task by name; an unknown name raises :class:`UserError` listing the valid ones."""
    return look_up(SYNTHETIC_TASKS, name, "synthetic task")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise unknown_name("split", split, SPLITS)


def split_of(problem: str) -> str:
    """The split a problem text belongs to: SHA-256 bucket 0-4 ``val``, 5-9 ``test``, else ``train``."""
    bucket = int.from_bytes(hashlib.sha256(problem.encode("utf-8")).digest()[:8], "big") % 100
    return "val" if bucket < 5 else "test" if bucket < 10 else "train"


def iter_examples(name: str, seed: int, split: str = "train") -> Iterator[SyntheticExample]:
    """Endless deterministic stream of ``split`` examples of task ``name`` (repeats possible).

    The stream depends only on ``(name, seed, split)``; the supervised warm-start draws
    its batches from it.
    """
    task = get_task(name)
    _check_split(split)
    rng = random.Random(f"{name}/{split}/{seed}")
    while True:
        problem, answer, steps = task.sample(rng)
        if split_of(problem) == split:
            yield SyntheticExample(problem, "\n".join([*steps(), answer_line(answer)]), answer)


def generate_examples(name: str, n: int, seed: int, *, split: str = "train") -> list[SyntheticExample]:
    """``n`` distinct examples of task ``name`` from ``split``, deterministic per ``(name, n, seed, split)``.

    Raises :class:`UserError` when the split holds too few distinct problems for ``n``.
    """
    if n < 0:
        raise UserError(f"number of synthetic examples must be >= 0, got {n}")
    seen: set[str] = set()
    out: list[SyntheticExample] = []
    patience = 2000 + 2 * n  # draws without a new problem before the split counts as exhausted
    stale = 0
    for ex in iter_examples(name, seed, split):
        if len(out) == n:
            break
        if ex.problem in seen:
            stale += 1
            if stale >= patience:
                raise UserError(
                    f"synthetic task '{name}' has fewer than {n} distinct {split} problems "
                    f"(found {len(out)}); ask for fewer or pick a harder task"
                )
            continue
        stale = 0
        seen.add(ex.problem)
        out.append(ex)
    return out


def generate_rows(name: str, n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` DAPO-schema rows (see :mod:`dapo_cli.data.schema`) for task ``name``.

    The prompt is the task's :meth:`SyntheticTask.messages` (for most tasks the bare problem,
    :data:`PROMPT_TEMPLATE`), ``data_source`` is ``synthetic/<name>``, the ground truth is the
    integer answer as a string and ``extra_info.conversion`` is ``"integer"``.
    """
    task = get_task(name)
    rows = []
    for i, ex in enumerate(generate_examples(name, n, seed, split=split)):
        row = make_row(
            ex.problem, str(ex.answer), index=i, data_source=f"synthetic/{name}", split=split,
            original_answer=str(ex.answer), conversion="integer",
        )
        row["prompt"] = task.messages(ex.problem)
        rows.append(row)
    return rows
