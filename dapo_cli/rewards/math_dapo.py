"""The ``math_dapo`` verifier: the rule DAPO released with its AIME evaluation.

Users compare accuracies across systems, so this module reproduces the released
rule (verl's ``reward_score/math_dapo.py``, itself a Minerva-style normaliser)
case by case, quirks included. The rule-based reward of DAPO (paper §2.4), with
``isEquivalent`` made concrete as equality after normalisation:

.. math::

    R(\\hat y, y) = \\begin{cases} 1, & \\operatorname{norm}(\\hat y) = \\operatorname{norm}(y) \\\\
                                   -1, & \\text{otherwise} \\end{cases}

where :math:`y` is the ground truth, :math:`\\hat y` the text after the last
``Answer:`` in the final :data:`WINDOW_CHARS` characters of the response, and
``norm`` is :func:`normalize_final_answer`. Equality is exact string equality, so
``007`` and ``7`` differ and ``\\frac{1}{2}`` and ``0.5`` differ.

Quirks kept on purpose (each has a test in ``tests/rewards/test_rewards_math_dapo.py``):

1. ``"an "`` and ``"a "`` are deleted anywhere, also inside words (``"banana "`` → ``"banan"``).
2. The ``$…$`` step keeps the first pair *per line* (no DOTALL), so ``$$5$$`` normalises to ``""``.
3. Commas are dropped only when everything else is a ``str.isdigit`` character, which
   includes ``'²'`` and Arabic-Indic digits; ``"1,2"`` therefore becomes ``"12"``.
4. The digit test runs *before* the final strip, so ``"1,000\\r"`` keeps its comma.
5. ``Answer\\s*:\\s*`` lets ``\\s*`` cross a newline: ``"Answer:\\n5"`` extracts ``"5"``.

Model output is untrusted: only :data:`WINDOW_CHARS` characters are ever scanned and
nothing is evaluated.
"""

from __future__ import annotations

import re
from typing import TypedDict

WINDOW_CHARS = 300
"""Only the last 300 code points of a response are read (as released)."""

INVALID = "[INVALID]"
"""The prediction recorded when no answer could be extracted."""


class ScoreResult(TypedDict):
    """What every verifier returns: ``score`` is ±1.0, ``acc`` the same as a bool."""

    score: float
    acc: bool
    pred: str


SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
"""Literal replacements, applied in this order before :data:`REMOVED_EXPRESSIONS`."""

REMOVED_EXPRESSIONS: tuple[str, ...] = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
"""Literal substrings deleted, in this order (``\\n`` is a real newline)."""

_ANSWER_RE = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)
# Regex rewrites, applied in order; "." never crosses a newline (no DOTALL), as released.
_TEX_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r".*?\$(.*?)\$.*"), r"$\1$"),  # keep the first $...$ pair of each line
    (re.compile(r"\\text\{(.*?)\}"), r"\1"),
    (re.compile(r"\\textbf\{(.*?)\}"), r"\1"),
    (re.compile(r"\\overline\{(.*?)\}"), r"\1"),
    (re.compile(r"\\boxed\{(.*)\}"), r"\1"),  # greedy: \boxed{\frac{1}{2}} -> \frac{1}{2}
    (re.compile(r"frac([^{])(.)"), r"frac{\1}{\2}"),  # \frac12 -> \frac{1}{2}
    (re.compile(r"sqrt([^{])"), r"sqrt{\1}"),  # \sqrt3 -> \sqrt{3}
)


def extract_answer(text: str) -> str | None:
    """The capture of the last ``Answer\\s*:\\s*([^\\n]+)`` match (case-insensitive), or None.

    ``text`` should already be windowed (see :func:`answer_window`); matches do not overlap.
    """
    matches = _ANSWER_RE.findall(text)
    return matches[-1] if matches else None


def answer_window(response: str) -> str:
    """The last :data:`WINDOW_CHARS` code points of ``response`` (all of it when shorter)."""
    return response[-WINDOW_CHARS:]


def normalize_final_answer(answer: str) -> str:
    """Minerva/DAPO normalisation of an answer string (applied to prediction and ground truth).

    Steps, in order: keep the text after the last ``=``; :data:`SUBSTITUTIONS`;
    delete :data:`REMOVED_EXPRESSIONS`; keep the first ``$…$`` pair; unwrap
    ``\\text{}``, ``\\textbf{}``, ``\\overline{}`` (shortest) and ``\\boxed{}``
    (longest); expand ``\\fracab`` and ``\\sqrta``; delete ``$``; drop commas
    from digit strings; strip surrounding whitespace.
    """
    text = answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        text = text.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        text = text.replace(expr, "")
    for pattern, repl in _TEX_REWRITES:
        text = pattern.sub(repl, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def make_result(acc: bool, pred: str) -> ScoreResult:
    """Pack a verdict as ``{"score": ±1.0, "acc": acc, "pred": pred}``."""
    return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}


def compute_score(response: str, ground_truth: str) -> ScoreResult:
    """Score one response against its ground truth with the released DAPO rule.

    ``pred`` is the normalised extraction (``normalize_final_answer("[INVALID]")``,
    i.e. ``"[INVALID]"``, when the window holds no ``Answer:``); ``acc`` is
    ``pred == normalize_final_answer(ground_truth)``.
    """
    extracted = extract_answer(answer_window(response))
    pred = normalize_final_answer(INVALID if extracted is None else extracted)
    return make_result(pred == normalize_final_answer(ground_truth), pred)
