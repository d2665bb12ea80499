"""Hostile text through every verifier, on both sides, and through prepare-data.

Model output and dataset cells are untrusted. For a corpus of code payloads, exponent
towers, factorial bombs, 100,000-level nesting, megabyte strings, NUL bytes and Unicode
confusables this shows that

* nothing executes: payloads that would create a file or set an environment variable
  leave no trace, and ``eval``/``exec``/``compile`` of text, ``sympify`` and
  ``parse_expr`` are never reached (each is replaced by a function that fails the test);
* the work is bounded, asserted on the bounds themselves, never on wall time: the text
  each stage receives (response windows, the ground-truth cap, the parser's 500
  characters, prepare-data's problem and answer caps) and the parser's nesting depth.

Timings of the same kinds of input are in ``benchmarks/verifier_bounds.py``.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sympy
import sympy.parsing.sympy_parser

from dapo_cli.data import convert as C
from dapo_cli.data.prepare import PrepareOptions, run_prepare
from dapo_cli.data.readers import MAX_JSON_DEPTH
from dapo_cli.errors import UserError
from dapo_cli.rewards import math_dapo, math_equiv, strict_box
from dapo_cli.rewards.bounds import MAX_GROUND_TRUTH_CHARS
from dapo_cli.rewards.registry import VERIFIERS

ENV_FLAG = "DAPO_HOSTILE_CORPUS_EXECUTED"


def corpus(marker: Path) -> dict[str, str]:
    """Every hostile input by name; each code payload would create ``marker`` or set ``ENV_FLAG``."""
    m = str(marker)
    return {
        "import-system": f"__import__('os').system('touch {m}')",
        "environ": f"__import__('os').environ.__setitem__('{ENV_FLAG}', '1')",
        "open": f"open('{m}', 'w').write('x')",
        "exec": f"exec(\"open('{m}', 'w')\")",
        "eval": f"eval(\"__import__('os').system('touch {m}')\")",
        "lambda": f"(lambda: __import__('os').system('touch {m}'))()",
        "f-string": f"f\"{{__import__('os').system('touch {m}')}}\"",
        "subclasses": f"().__class__.__base__.__subclasses__() or open('{m}', 'w')",
        "sympy-globals": f"Symbol('x').__init__.__globals__['__builtins__']['exec']('open(\"{m}\", \"w\")')",
        "latex-command": f"\\input{{{m}}}\\write18{{touch {m}}}",
        "tower-caret": "9^9^9^9",
        "tower-stars": "10**10**10",
        "tower-braces": "10^{10^{10^{10}}}",
        "tower-root": "\\sqrt[64]{2}^{10^{100}}",
        "factorial": "1000000!",
        "factorial-power": "(10^10)!",
        "nested-parens": "(" * 100_000 + "1" + ")" * 100_000,
        "nested-frac": "\\frac{" * 100_000 + "1" + "}{2}" * 100_000,
        "nested-sqrt": "\\sqrt{" * 50_000 + "2" + "}" * 50_000,
        "nested-boxed": "\\boxed{" * 100_000 + "5" + "}" * 100_000,
        "short-nest": "(" * 240 + "1" + ")" * 240,  # under the parser's 500 characters: its depth limit decides
        "megabyte-digits": "7" * 1_000_000,
        "megabyte-open-text": "\\text{" * 170_000,
        "megabyte-dollar": "$" + "1" * 1_000_000,
        "megabyte-math-openers": "\\(" * 500_000,
        "megabyte-answer-lines": "Answer: " * 130_000,
        "nul": "5\x00",
        "nul-run": "\x00" * 10_000,
        "fullwidth-digits": "\uff11\uff12",
        "superscript": "2\u00b2",
        "arabic-indic": "\u0661\u0662",
        "rtl-override": "\u202e21\u202c",
        "zero-width": "1\u200b2",
    }


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "executed"


@contextlib.contextmanager
def no_evaluators(marker: Path) -> Iterator[None]:
    """Inside the block, ``sympify``/``parse_expr`` fail the test, and so do ``eval``/``exec``/``compile``
    of any text holding a payload (each names ``marker`` or ``ENV_FLAG``; module imports still compile)."""
    signatures = (str(marker), ENV_FLAG)

    def guard(real: Any) -> Any:
        def guarded(source: Any, *args: Any, **kwargs: Any) -> Any:
            text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
            if isinstance(text, str) and any(sig in text for sig in signatures):
                raise AssertionError(f"a payload reached an evaluator: {text[:80]!r}")
            return real(source, *args, **kwargs)

        return guarded

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("text reached sympify/parse_expr")

    with pytest.MonkeyPatch.context() as patch:
        for name in ("eval", "exec", "compile"):
            patch.setattr(builtins, name, guard(getattr(builtins, name)))
        patch.setattr(sympy, "sympify", boom)
        patch.setattr(sympy.parsing.sympy_parser, "parse_expr", boom)
        yield


class Recorder:
    """Wraps stage functions and records the length of the text each receives."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lengths: dict[str, list[int]] = defaultdict(list)
        self.parsers: list[Any] = []
        self.monkeypatch = monkeypatch

    def wrap(self, module: Any, name: str, key: str | None = None, arg: int = 0) -> None:
        real = getattr(module, name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.lengths[key or name].append(len(args[arg]))
            return real(*args, **kwargs)

        self.monkeypatch.setattr(module, name, recorded)

    def track_parsers(self) -> None:
        parsers = self.parsers

        class Tracked(math_equiv._Parser):
            def __init__(self, tokens: list[Any]) -> None:
                super().__init__(tokens)
                parsers.append(self)

        self.monkeypatch.setattr(math_equiv, "_Parser", Tracked)

    def most(self, key: str) -> int:
        return max(self.lengths[key], default=0)

    def clear(self) -> None:
        self.lengths.clear()
        self.parsers.clear()


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder(monkeypatch)
    rec.wrap(math_dapo, "normalize_final_answer", "normalize")
    rec.wrap(math_dapo, "extract_answer", "extract")
    rec.wrap(strict_box, "last_boxed_content", "box")
    rec.wrap(math_equiv, "is_equivalent", "equiv_pred", arg=0)
    rec.wrap(math_equiv, "normalize_text", "parse_text")
    rec.wrap(math_equiv, "tokenize", "tokenize")
    rec.track_parsers()
    math_equiv.parse_answer.cache_clear()  # parse every text afresh
    return rec


def responses(payload: str) -> list[str]:
    return [payload, f"Reasoning.\nAnswer: {payload}", f"The answer is \\boxed{{{payload}}}", f"Answer: {payload}\n" * 3]


def assert_result(result: dict[str, Any]) -> None:
    assert set(result) == {"score", "acc", "pred"}
    assert type(result["acc"]) is bool and result["score"] == (1.0 if result["acc"] else -1.0)
    assert isinstance(result["pred"], str)


def assert_parser_bounded(rec: Recorder) -> None:
    assert rec.most("tokenize") <= math_equiv.MAX_CHARS
    assert max((p.max_depth for p in rec.parsers), default=0) <= math_equiv.MAX_DEPTH + 1  # the level that raises
    assert all(len(p.tokens) <= math_equiv.MAX_CHARS + 1 for p in rec.parsers)


def test_hostile_responses_execute_nothing_and_read_only_the_window(marker: Path, recorder: Recorder) -> None:
    for name, payload in corpus(marker).items():
        for response in responses(payload):
            recorder.clear()
            with no_evaluators(marker):
                results = [verifier(response, "5") for verifier in VERIFIERS.values()]
            for result in results:
                assert_result(result)
                assert result["acc"] is False, (name, result)
            # math_dapo and math_equiv read the last 300 characters, strict_box the last 100
            assert recorder.most("extract") <= math_dapo.WINDOW_CHARS, name
            assert recorder.most("box") <= math_dapo.WINDOW_CHARS, name
            assert recorder.most("normalize") <= math_dapo.WINDOW_CHARS, name
            assert recorder.most("equiv_pred") <= math_dapo.WINDOW_CHARS, name
            assert_parser_bounded(recorder)
    assert strict_box.BOX_WINDOW_CHARS < math_dapo.WINDOW_CHARS
    assert not marker.exists() and ENV_FLAG not in os.environ


def test_hostile_ground_truths_execute_nothing_and_are_read_only_under_the_cap(marker: Path, recorder: Recorder) -> None:
    deepest = 0
    for name, payload in corpus(marker).items():
        for truth in (payload, f"\\boxed{{{payload}}}", f"${payload}$"):
            recorder.clear()
            with no_evaluators(marker):
                results = [verifier("Reasoning.\nAnswer: 5", truth) for verifier in VERIFIERS.values()]
            for result in results:
                assert_result(result)
                assert result["acc"] is False, (name, result)
            if len(truth) > MAX_GROUND_TRUTH_CHARS:
                # unscorable: only the prediction ("5") was normalised; math_equiv was never asked
                assert recorder.lengths["normalize"] == [1], name
                assert recorder.lengths["equiv_pred"] == [], name
                assert recorder.lengths["parse_text"] == [], name
            else:
                assert recorder.most("normalize") <= MAX_GROUND_TRUTH_CHARS
            assert_parser_bounded(recorder)
            deepest = max([deepest] + [p.max_depth for p in recorder.parsers])
    assert deepest == math_equiv.MAX_DEPTH + 1  # "short-nest" reached the depth limit, which stopped it
    assert not marker.exists() and ENV_FLAG not in os.environ


def test_strict_box_never_reads_past_its_window(marker: Path, recorder: Recorder) -> None:
    for payload in corpus(marker).values():
        recorder.clear()
        with no_evaluators(marker):
            strict_box.compute_score(f"\\boxed{{{payload}}}", payload)
        assert recorder.most("box") <= strict_box.BOX_WINDOW_CHARS


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.slow
def test_hostile_rows_through_prepare_data_execute_nothing_and_are_capped(
    tmp_path: Path, marker: Path, recorder: Recorder
) -> None:
    recorder.wrap(C, "math_segments", "segments")
    recorder.wrap(C, "parse_answer", "convert_parse")
    items = corpus(marker)
    raw = []
    for name, payload in items.items():
        raw.append({"problem": f"Problem {name}: compute {payload} as a fraction.", "answer": "1/2"})  # problem side
        raw.append({"problem": f"Problem {name}, the answer side.", "answer": payload})
        raw.append({"problem": f"Problem {name}, in a solution.", "solution": f"so \\boxed{{{payload}}}"})
    prepared = [
        {"prompt": [{"role": "user", "content": f"Prepared {name}: {payload}"}], "reward_model": {"ground_truth": payload}}
        for name, payload in items.items()
    ] + [{"prompt": [{"role": "user", "content": "Prepared: the answer is long"}], "reward_model": {"ground_truth": "7" * 200_000}}]
    inputs = (write_jsonl(tmp_path / "raw.jsonl", raw), write_jsonl(tmp_path / "prepared.jsonl", prepared))
    with no_evaluators(marker):
        result = run_prepare(PrepareOptions(output=tmp_path / "out.parquet", inputs=inputs))

    assert not marker.exists() and ENV_FLAG not in os.environ
    # bounded: the letter scan sees at most MAX_PROBLEM_CHARS, the parser at most MAX_CHARS
    assert recorder.most("segments") <= C.MAX_PROBLEM_CHARS
    assert recorder.most("convert_parse") <= math_equiv.MAX_CHARS
    assert_parser_bounded(recorder)
    raw_report, prepared_report = result.files
    long_problems = sum(len(f"Problem {n}: compute {p} as a fraction.") > C.MAX_PROBLEM_CHARS for n, p in items.items())
    assert raw_report.dropped["problem_too_long"] == long_problems > 0
    assert raw_report.dropped["answer_too_long"] >= sum(len(p) > math_equiv.MAX_CHARS for p in items.values())
    assert prepared_report.dropped["answer_too_long"] == 1 + sum(len(p) > MAX_GROUND_TRUTH_CHARS for p in items.values())
    for row in pq.read_table(tmp_path / "out.parquet").to_pylist():
        assert len(row["extra_info"]["raw_problem"] or "") <= C.MAX_PROBLEM_CHARS
        assert len(row["reward_model"]["ground_truth"]) <= MAX_GROUND_TRUTH_CHARS
    # only ASCII integers survive: "3" (m + n of the "1/2" problems), "5" (the innermost, i.e. last,
    # box of the nested-boxed solution) and "12" (fullwidth and Arabic-Indic digits read as twelve);
    # no prepared row survives: "１２" is not an ASCII integer, and nothing else is an integer at all
    kept = {row["reward_model"]["ground_truth"] for row in pq.read_table(tmp_path / "out.parquet").to_pylist()}
    assert kept == {"3", "5", "12"}
    assert sum(prepared_report.kept.values()) == 0


def test_deeply_nested_json_through_prepare_data_is_one_line(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    path = tmp_path / "deep.jsonl"
    path.write_text('{"problem": "p", "answer": "1"}\n' + json.dumps({"problem": "q"})[:-1] + f', "answer": {deep}}}\n')
    with pytest.raises(UserError) as info:
        run_prepare(PrepareOptions(output=tmp_path / "out.parquet", inputs=(path,)))
    message = str(info.value)
    assert f"{path}: line 2 nests arrays/objects deeper than {MAX_JSON_DEPTH} levels" in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.jsonl"]
