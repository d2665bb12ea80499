r"""Answer text → tokens: the whitelisted front end of :mod:`dapo_cli.rewards.math_equiv`.

``normalize_text`` strips formatting (boxes, ``$``, ``\\text{…}``, units, degree and percent
marks, thousands separators); ``tokenize`` splits the result into numbers, single letters,
a fixed set of LaTeX commands and operators, and rejects everything else (words longer than
:data:`MAX_LETTER_RUN` letters, unknown commands, other characters) with :class:`ParseError`.
Nothing here evaluates text.
"""

from __future__ import annotations

import re
from typing import NamedTuple

MAX_CHARS = 500  #: longer answers are unparseable (no final answer is this long)
MAX_LETTER_RUN = 3  #: longest letter run read as a product (``abc``); longer runs are words

GREEK = (
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "kappa",
    "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "phi", "chi", "psi", "omega",
)  # fmt: skip
"""Greek letters read as variables (``\\pi`` is the constant)."""

UNIT_WORDS = (
    "cm", "mm", "km", "kg", "mg", "ml", "mL", "sq", "ft", "in", "inch", "inches", "feet", "foot",
    "meter", "meters", "metres", "sec", "secs", "second", "seconds", "min", "mins", "minute",
    "minutes", "hr", "hrs", "hour", "hours", "day", "days", "year", "years", "degree", "degrees",
    "unit", "units", "dollar", "dollars", "cent", "cents", "mph", "square", "cubic",
)  # fmt: skip
"""Unit words stripped from the end of an answer (``20 cm^{2}`` → ``20``); single letters never are."""


class ParseError(ValueError):
    """The text is not an answer this parser accepts (internal; callers see None)."""


# ---------------------------------------------------------------------------
# Text normalisation


_TEXT_BLOCK = re.compile(r"\\(?:text|textrm|textnormal|textup|textit|textbf|mathrm|mbox|operatorname)\s*\{")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°")
_SPACING = re.compile(r"\\[,;:! ]|~|\\q?quad(?![a-zA-Z])")
_SIZING = re.compile(r"\\(?:left|right)\s*\.|\\(?:left|right|[bB]igg?[lr]?)(?![a-zA-Z])")
_UNITS_AT_END = re.compile(
    r"(?<=[\d}\s)])\s*(?:(?:" + "|".join(sorted(UNIT_WORDS, key=len, reverse=True)) + r")(?![a-zA-Z])"
    r"(?:\s*\^\s*\{?\s*\d\s*\}?)?\s*)+$"
)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_UNICODE = {"−": "-", "×": "*", "·": "*", "÷": "/", "π": "\\pi ", "√": "\\sqrt "}
BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` or ``\\fbox{…}`` in ``text`` (balanced braces), or None.

    Braces are counted from the ``{`` after the command; a box that never closes gives None.
    Linear in ``len(text)``.
    """
    start, command = max((text.rfind(command + "{"), command) for command in BOX_COMMANDS)
    return None if start < 0 else _balanced_group(text, start + len(command))


def _balanced_group(text: str, open_at: int) -> str | None:
    """Content of the brace group whose ``{`` is at ``open_at`` (None if it never closes)."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
    return None


def _strip_text_blocks(text: str) -> str | None:
    """Remove ``\\text{…}``-like blocks (units, words); keep ``\\mathrm{e}``/``\\mathrm{i}`` as constants."""
    while (match := _TEXT_BLOCK.search(text)) is not None:
        content = _balanced_group(text, match.end() - 1)
        if content is None:
            return None
        keep = content.strip() if content.strip() in ("e", "i") else " "
        text = text[: match.start()] + keep + text[match.end() + len(content) + 1 :]
    return text


def normalize_text(text: str) -> str | None:
    """The answer text with formatting removed, or None when it is too long or malformed.

    Takes the last box if there is one; drops ``$``, ``\\(``/``\\)``/``\\[``/``\\]``,
    ``\\left``/``\\right``, spacing commands, degree marks, percent signs, text/unit blocks
    and a trailing unit word; maps ``\\dfrac``/``\\tfrac`` to ``\\frac`` and Unicode
    operators to ASCII; removes thousands separators when the whole answer is one number.
    """
    if len(text) > MAX_CHARS:
        return None
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed
    for old, new in _UNICODE.items():
        text = text.replace(old, new)
    text = text.replace("\\$", "").replace("$", "")
    for delim in ("\\(", "\\)", "\\[", "\\]"):
        text = text.replace(delim, " ")
    stripped = _strip_text_blocks(text)
    if stripped is None:
        return None
    text = _SPACING.sub(" ", _DEGREES.sub("", _SIZING.sub("", stripped)))
    text = text.replace("\\%", "").replace("%", "").replace("{,}", ",")
    text = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", text)
    text = _UNITS_AT_END.sub("", text).strip()
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    return text


# ---------------------------------------------------------------------------
# Tokenizer


class Token(NamedTuple):
    """One lexical unit: ``kind`` in NUM, SCI, LETTER, CMD, OP, END; ``start``/``end`` offsets."""

    kind: str
    value: str
    start: int
    end: int


_COMMANDS = {"frac": "CMD", "sqrt": "CMD", "pi": "CMD", "cdot": "*", "times": "*", "ast": "*", "div": "/"}
_NUMBER = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+)(?![\d.]))?")
_LETTERS = re.compile(r"[A-Za-z]+")
_COMMAND = re.compile(r"\\([a-zA-Z]+)")
_OPERATORS = set("+-*/^(){}[],")


def tokenize(text: str) -> list[Token]:
    """Split normalised text into tokens; :class:`ParseError` on any character or command outside the whitelist."""
    tokens: list[Token] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            i += 1
            continue
        if (number := _NUMBER.match(text, i)) is not None:
            tokens.append(Token("SCI" if number.group(2) else "NUM", number.group(0), i, number.end()))
        elif (word := _LETTERS.match(text, i)) is not None:
            if len(word.group(0)) > MAX_LETTER_RUN:
                raise ParseError(f"word {word.group(0)!r}")
            tokens.extend(Token("LETTER", text[k], k, k + 1) for k in range(i, word.end()))
        elif (command := _COMMAND.match(text, i)) is not None:
            name = command.group(1)
            if name in GREEK:
                tokens.append(Token("LETTER", name, i, command.end()))
            elif name in _COMMANDS:
                kind = _COMMANDS[name]
                tokens.append(Token("CMD", name, i, command.end()) if kind == "CMD" else Token("OP", kind, i, command.end()))
            else:
                raise ParseError(f"command \\{name}")
        elif char in _OPERATORS:
            tokens.append(Token("OP", char, i, i + 1))
        else:
            raise ParseError(f"character {char!r}")
        i = tokens[-1].end
    tokens.append(Token("END", "", len(text), len(text)))
    return tokens
