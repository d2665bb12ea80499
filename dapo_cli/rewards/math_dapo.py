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

Model output and dataset text are untrusted: only :data:`WINDOW_CHARS` characters of a
response are ever scanned, a ground truth over
:data:`~dapo_cli.rewards.bounds.MAX_GROUND_TRUTH_CHARS` is not read at all (every
response scores -1), and nothing is evaluated. Normalisation is linear in its input:
the released rule's regular expressions that backtrack (``.*?\\$(.*?)\\$.*`` and the
``\\text{…}``/``\\boxed{…}`` unwrapping re-scan the rest of the line from every
position, quadratic on a line without a closing ``$`` or ``}``) are replaced by
scanners with the same result on every input (``tests/rewards/test_rewards_math_dapo.py``
compares them with the regular expressions on random text).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypedDict

from dapo_cli.rewards.bounds import scorable

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


def keep_first_dollar_pair(text: str) -> str:
    """The released ``re.sub(r".*?\\$(.*?)\\$.*", r"$\\1$", text)``, in one pass.

    Per line (``.`` never crosses ``\\n``): a line holding two or more ``$`` becomes
    ``$`` + the text between its first two ``$`` + ``$``; other lines are unchanged.
    """
    if text.count("$") < 2:
        return text
    lines = text.split("\n")
    for i, line in enumerate(lines):
        first = line.find("$")
        second = line.find("$", first + 1) if first >= 0 else -1
        if second >= 0:
            lines[i] = "$" + line[first + 1 : second] + "$"
    return "\n".join(lines)


def unwrap_shortest(text: str, opener: str) -> str:
    """The released ``re.sub(re.escape(opener) + r"(.*?)\\}", r"\\1", text)``, in one pass.

    Each ``opener`` (e.g. ``\\text{``) with a ``}`` later on its line is replaced by the
    text up to that first ``}``; scanning resumes after it. The next ``}`` and the next
    newline are looked up once per position they move to, never again from every
    opener, so the work is linear in ``len(text)``.
    """
    start = text.find(opener)
    if start < 0:
        return text
    parts: list[str] = []
    pos = 0
    close = newline = -2  # next "}" / "\n" at or after the current body (-2: not looked up, -1: none)
    while start >= 0:
        body = start + len(opener)
        if close != -1 and close < body:
            close = text.find("}", body)
        if close == -1:
            break  # no "}" after this opener, so none after any later one either
        if newline != -1 and newline < body:
            newline = text.find("\n", body)
        if newline == -1 or close < newline:
            parts += (text[pos:start], text[body:close])
            pos = close + 1
            start = text.find(opener, pos)
        else:
            start = text.find(opener, start + 1)
    parts.append(text[pos:])
    return "".join(parts)


def unwrap_longest(text: str, opener: str) -> str:
    """The released ``re.sub(re.escape(opener) + r"(.*)\\}", r"\\1", text)`` (greedy), in one pass.

    Per line, the first ``opener`` followed on its line by a ``}`` is replaced by the
    text up to the *last* ``}`` of the line; later openers on that line cannot match
    (no ``}`` follows them), so each line is read at most twice.
    """
    start = text.find(opener)
    if start < 0:
        return text
    parts: list[str] = []
    pos = 0
    while start >= 0:
        body = start + len(opener)
        line_end = text.find("\n", body)
        if line_end < 0:
            line_end = len(text)
        close = text.rfind("}", body, line_end)
        if close >= 0:
            parts += (text[pos:start], text[body:close])
            pos = close + 1
        start = text.find(opener, line_end)
    parts.append(text[pos:])
    return "".join(parts)


def _regex_rewrite(pattern: str, repl: str) -> Callable[[str], str]:
    compiled = re.compile(pattern)
    return lambda text: compiled.sub(repl, text)


# The released rewrites, applied in order; "." never crosses a newline (no DOTALL), as released.
# The first five backtrack in re (quadratic per line), so they are the one-pass scanners above.
TEX_REWRITES: tuple[tuple[str, Callable[[str], str]], ...] = (
    (r".*?\$(.*?)\$.* -> $\1$", keep_first_dollar_pair),  # keep the first $...$ pair of each line
    (r"\\text\{(.*?)\} -> \1", lambda t: unwrap_shortest(t, "\\text{")),
    (r"\\textbf\{(.*?)\} -> \1", lambda t: unwrap_shortest(t, "\\textbf{")),
    (r"\\overline\{(.*?)\} -> \1", lambda t: unwrap_shortest(t, "\\overline{")),
    (r"\\boxed\{(.*)\} -> \1", lambda t: unwrap_longest(t, "\\boxed{")),  # greedy: \boxed{\frac{1}{2}} -> \frac{1}{2}
    (r"frac([^{])(.) -> frac{\1}{\2}", _regex_rewrite(r"frac([^{])(.)", r"frac{\1}{\2}")),  # \frac12 -> \frac{1}{2}
    (r"sqrt([^{]) -> sqrt{\1}", _regex_rewrite(r"sqrt([^{])", r"sqrt{\1}")),  # \sqrt3 -> \sqrt{3}
)
"""(the released regular expression and replacement, the function applying it), in order.

The last two match a fixed number of characters, so ``re`` runs them in linear time.
"""


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
    from digit strings; strip surrounding whitespace. A fixed number of passes, each
    linear in ``len(answer)``.
    """
    text = answer.rpartition("=")[2]  # = answer.split("=")[-1], without a list of every piece
    for before, after in SUBSTITUTIONS:
        text = text.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        text = text.replace(expr, "")
    for _released, rewrite in TEX_REWRITES:
        text = rewrite(text)
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
    ``pred == normalize_final_answer(ground_truth)``. A ground truth over
    :data:`~dapo_cli.rewards.bounds.MAX_GROUND_TRUTH_CHARS` characters is unscorable:
    ``acc`` is False and it is not normalised.
    """
    extracted = extract_answer(answer_window(response))
    pred = normalize_final_answer(INVALID if extracted is None else extracted)
    return make_result(scorable(ground_truth) and pred == normalize_final_answer(ground_truth), pred)
