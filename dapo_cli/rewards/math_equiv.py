r"""Safe mathematical equivalence of final answers (LaTeX or plain text) with sympy.

Answers are model output or dataset text, i.e. untrusted: nothing here hands text to
``eval``, ``exec``, ``sympify`` or ``parse_expr`` (they execute code). A tokenizer with a
fixed alphabet and a fixed set of LaTeX commands feeds a recursive-descent parser that
builds only ``Integer``/``Rational``, ``pi``, ``E``, ``I``, single-letter (or Greek)
``Symbol`` objects and ``Add``/``Mul``/``Pow``::

    tuple   := expr (',' expr)*                         top level only
    expr    := term (('+' | '-') term)*
    term    := signed (('*' | '/' | <implicit>) signed)*  \cdot, \times → '*'; \div → '/'
    signed  := ('-' | '+') signed | power
    power   := primary ('^' exponent)?                  right-associative
    primary := NUMBER | LETTER | \pi | '(' expr (',' expr)* ')' | '{' expr '}'
             | \frac ARG ARG | \sqrt ('[' n ']')? ARG    (\dfrac, \tfrac too; ARG: {…} or one character)

Conventions: ``e`` is Euler's number, ``i`` the imaginary unit; ``2\frac{5}{8}`` is the
mixed number 21/8; ``$``, ``%``, ``^\circ``, ``\text{…}``/``\mathrm{…}`` and a trailing
unit word (``cm``, ``inches``) are stripped; ``1,000`` is a thousand, ``1, 2`` a tuple;
``4.5e33`` is scientific notation. Letter runs longer than :data:`MAX_LETTER_RUN` are
words and rejected, so ``__import__('os')``, ``lambda: 1`` or ``eval("1")`` are unparseable.

Bounded work instead of a timer: a thread cannot be killed, and a subprocess per
comparison would cost ~1 s of imports. So every sympy call is bounded by construction
(the ``MAX_*`` constants: input length, nesting, exponent sizes, the numbers sympy
factors or expands when it builds a power), equivalence is decided by evaluation at
:data:`EVAL_DIGITS` digits, and ``simplify`` only runs on :func:`is_small` expressions
when numbers cannot decide. ``timeout_s`` is a deadline checked between these steps.
Measured on 2 busy shared cores over 45,000 random nested inputs built from huge
numbers, towers, roots and complex powers (``parse_answer`` + two ``is_equivalent``
calls each): worst 1.1 s, of which 0.4 s was sympy importing ``simplify`` on first use;
next worst 0.45 s. Before these bounds, single inputs took 44 s to over 3 minutes. Each
pathological input in ``tests/rewards/test_rewards_math_equiv.py`` takes under 0.01 s.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import sympy

from dapo_cli.rewards.answer_text import (  # noqa: F401  (re-exported: part of this module's API)
    GREEK,
    MAX_CHARS,
    MAX_LETTER_RUN,
    UNIT_WORDS,
    ParseError,
    Token,
    last_boxed,
    normalize_text,
    tokenize,
)

# Bounds (see the module docstring): every one keeps a sympy call from running away.
MAX_DEPTH = 32  #: deepest nesting of groups, fractions, roots, powers and signs
MAX_EXPONENT = 10_000  #: largest |numerator| of a numeric exponent
MAX_POWER_BITS = 10_000  #: largest size of an exact power: |exponent| · bits of the base's numbers
MAX_ROOT_INDEX = 64  #: largest n of \sqrt[n]{…}, and largest denominator of an exponent
MAX_RADICAND_BITS = 256  #: total bits of the numbers under non-integer powers (sympy factors them)
MAX_INNER_POWER = 16  #: largest power inside the base of a non-integer power (sympy expands it)
MAX_SYMBOLIC_EXPONENT_POWER = 8  #: largest power inside an irrational/symbolic exponent; no towers
MAX_SYMBOLIC_EXPONENT_BITS = 64  #: largest number inside an exponent with variables
MAX_SCI_EXPONENT = 400  #: largest |k| of scientific notation ``4.5e{k}``

# Numeric comparison.
EVAL_DIGITS = 30  #: correct significant digits of every evaluation
MAX_EVAL_DIGITS = 4000  #: most working digits evalf may use to resolve a cancellation
NEGLIGIBLE = sympy.Float("1e-60", EVAL_DIGITS)  #: a difference below this is zero (evalf of 0 gives ~1e-163)
SAMPLE_POINTS = 3  #: points at which expressions with variables are compared

# What counts as small enough for simplify/expand/radsimp, which have no bound of their own.
SIMPLIFY_MAX_OPS = 30  #: operations
SIMPLIFY_MAX_EXPONENT = 16  #: numeric exponents (simplify may expand powers)
SMALL_NUMBER_BITS = 64  #: numbers (simplify runs gcds on them)

Answer = sympy.Expr | tuple[sympy.Expr, ...]


# ---------------------------------------------------------------------------
# Bounded constructors


def _bits(value: sympy.Rational) -> int:
    """Bits of the larger of numerator and denominator."""
    return max(abs(int(value.p)).bit_length(), int(value.q).bit_length())


def _check_finite(value: sympy.Expr) -> sympy.Expr:
    if value.has(sympy.zoo, sympy.oo, -sympy.oo, sympy.nan):
        raise ParseError("not finite")
    return value


def _log2_abs(value: sympy.Expr) -> float:
    """An upper bound on log2 |value|, tight to one bit (-inf for zero); ParseError if it has no value.

    Read from the binary exponents of a 15-digit evaluation, so neither ``3^{-999}`` nor
    ``10^{400}`` under- or overflows as a Python float would.
    """
    try:
        parts = value.evalf(15).as_real_imag()
    except (TypeError, ValueError, OverflowError):
        raise ParseError("cannot evaluate") from None
    largest = -math.inf
    for part in parts:
        if part == 0:
            continue
        if not isinstance(part, sympy.Float) or not part.is_finite:
            raise ParseError("cannot evaluate")
        _, mantissa, exponent, bit_count = part._mpf_
        if mantissa:
            largest = max(largest, exponent + bit_count)
    return largest


def _magnitude_bits(value: sympy.Expr) -> float:
    """|log2 |value||: bits needed for the magnitude of a numeric value (0 for zero)."""
    log2 = _log2_abs(value)
    return 0.0 if log2 == -math.inf else abs(log2)


def _nested(method: Callable[..., Any]) -> Callable[..., Any]:
    """Count one level of nesting around a parser method (:data:`MAX_DEPTH`)."""

    @functools.wraps(method)
    def wrapper(self: _Parser, *args: Any) -> Any:
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)
        if self.depth > MAX_DEPTH:
            raise ParseError("nested too deeply")
        try:
            return method(self, *args)
        finally:
            self.depth -= 1

    return wrapper


class _Parser:
    """Recursive descent over :func:`tokenize`'s tokens; every method may raise :class:`ParseError`."""

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0
        self.max_depth = 0
        """Deepest nesting reached (never above :data:`MAX_DEPTH` + 1: the level that raised)."""
        self.radicand_bits = 0

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def take(self) -> Token:
        self.pos += 1
        return self.tokens[self.pos - 1]

    def accept(self, value: str) -> bool:
        if self.peek().kind in ("OP", "CMD") and self.peek().value == value:
            self.pos += 1
            return True
        return False

    def expect(self, value: str) -> None:
        if not self.accept(value):
            raise ParseError(f"expected {value!r} at {self.peek().start}")

    @staticmethod
    def scalar(value: Answer) -> sympy.Expr:
        if isinstance(value, tuple):
            raise ParseError("a tuple inside an expression")
        return value

    # -- grammar (see the module docstring)
    def top(self) -> Answer:
        items = [self.expr()]
        while self.accept(","):
            items.append(self.expr())
        if self.peek().kind != "END":
            raise ParseError(f"unexpected {self.peek().value!r} at {self.peek().start}")
        return tuple(self.scalar(item) for item in items) if len(items) > 1 else items[0]

    @_nested
    def expr(self) -> Answer:
        left = self.term()
        while self.peek().kind == "OP" and self.peek().value in ("+", "-"):
            sign = 1 if self.take().value == "+" else -1
            left = self.scalar(left) + sign * self.scalar(self.term())
        return left

    def term(self) -> Answer:
        left = self.signed()
        while True:
            token = self.peek()
            if self.accept("*"):
                left = self.scalar(left) * self.scalar(self.signed())
            elif self.accept("/"):
                left = self.divide(self.scalar(left), self.scalar(self.signed()))
            elif token.kind in ("NUM", "SCI", "LETTER", "CMD") or (token.kind == "OP" and token.value in "({"):
                if token.kind in ("NUM", "SCI") and self.tokens[self.pos - 1].kind in ("NUM", "SCI"):
                    raise ParseError("two numbers side by side")  # "1 000" is not a product
                left = self.scalar(left) * self.scalar(self.power())
            else:
                return left

    @_nested
    def signed(self) -> Answer:
        if self.accept("-"):
            return -self.scalar(self.signed())
        if self.accept("+"):
            return self.signed()
        return self.power()

    def power(self) -> Answer:
        base = self.primary()
        if self.accept("^"):
            return self.safe_pow(self.scalar(base), self.exponent())
        return base

    @_nested
    def exponent(self) -> sympy.Expr:
        if self.accept("-"):
            return -self.exponent()
        if self.accept("+"):
            return self.exponent()
        value = self.scalar(self.primary())
        return self.safe_pow(value, self.exponent()) if self.accept("^") else value

    def primary(self) -> Answer:
        token = self.take()
        if token.kind in ("NUM", "SCI"):
            value = self.number(token)
            after = self.peek()
            if token.kind == "NUM" and after.kind == "CMD" and after.value == "frac" and after.start == token.end:
                return self.mixed_number(value)
            return value
        if token.kind == "LETTER":
            return {"e": sympy.E, "i": sympy.I}.get(token.value) or sympy.Symbol(token.value)
        if token.kind == "CMD":
            return self.command(token.value)
        if token.kind == "OP" and token.value in ("(", "{"):
            return self.group(token.value)
        raise ParseError(f"unexpected {token.value!r} at {token.start}")

    @_nested
    def group(self, opening: str) -> Answer:
        """``( … )`` (a tuple if it holds commas) or ``{ … }``, after the opening bracket."""
        items = [self.expr()]
        while opening == "(" and self.accept(","):
            items.append(self.scalar(self.expr()))
        self.expect(")" if opening == "(" else "}")
        return tuple(self.scalar(item) for item in items) if len(items) > 1 else items[0]

    @_nested
    def command(self, name: str) -> sympy.Expr:
        if name == "pi":
            return sympy.pi
        if name == "frac":
            return self.divide(self.argument(), self.argument())
        index = sympy.Integer(2)  # \sqrt
        if self.accept("["):
            index = self.scalar(self.expr())
            self.expect("]")
            if not (index.is_Integer and 2 <= int(index) <= MAX_ROOT_INDEX):
                raise ParseError("root index")
        return self.safe_pow(self.argument(), 1 / index)

    def argument(self) -> sympy.Expr:
        """A macro argument: ``{…}``, or one character (``\\frac12`` is 1/2)."""
        token = self.peek()
        if token.kind == "NUM" and token.value[0] != ".":
            if len(token.value) > 1:  # split off the first digit, leave the rest for later
                self.tokens[self.pos] = Token("NUM", token.value[1:], token.start + 1, token.end)
            else:
                self.pos += 1
            return sympy.Integer(int(token.value[0]))
        if (token.kind, token.value) in (("OP", "{"), ("CMD", "pi")) or token.kind == "LETTER":
            return self.scalar(self.primary())
        raise ParseError(f"missing argument at {token.start}")

    @_nested
    def mixed_number(self, whole: sympy.Expr) -> sympy.Expr:
        """``2\\frac{5}{8}`` = 2 + 5/8 when all three are integers; otherwise a product."""
        self.take()  # \frac
        numerator, denominator = self.argument(), self.argument()
        fraction = self.divide(numerator, denominator)
        integers = whole.is_Integer and numerator.is_Integer and denominator.is_Integer
        return whole + fraction if integers else whole * fraction

    @staticmethod
    def number(token: Token) -> sympy.Expr:
        mantissa, _, exponent = token.value.lower().partition("e")
        if exponent and abs(int(exponent)) > MAX_SCI_EXPONENT:
            raise ParseError("scientific exponent too large")
        return sympy.Rational(mantissa) * sympy.Integer(10) ** int(exponent or 0)

    @staticmethod
    def divide(numerator: sympy.Expr, denominator: sympy.Expr) -> sympy.Expr:
        if denominator == 0:
            raise ParseError("division by zero")
        return _check_finite(numerator / denominator)

    def safe_pow(self, base: sympy.Expr, exponent: sympy.Expr) -> sympy.Expr:
        """``base ** exponent`` if the work sympy does to build it stays within the bounds."""
        if not exponent.is_Integer:
            # sympy inspects re/im/arg of the base, expanding every power inside it
            # (\sqrt{(\sqrt[3]{7}-x)^{9999}} took minutes), and factors its numbers
            # (\sqrt{N}, or the norm of 2 + N i: 44 s for one 3000-bit N).
            for inner in base.atoms(sympy.Pow, sympy.exp):
                if not inner.exp.is_Rational or abs(int(inner.exp.p)) > MAX_INNER_POWER:
                    raise ParseError("non-integer power of a large power")
            self.radicand_bits += sum(_bits(r) for r in base.atoms(sympy.Rational))
            if self.radicand_bits > MAX_RADICAND_BITS:
                raise ParseError("radicands too large")
        # sympy distributes a numeric power over a product: (7^{1/3}x)^{999} holds 7^{333}
        numeric = sympy.Mul(*[f for f in sympy.Mul.make_args(base) if f.is_number])
        if exponent.is_Rational:
            if abs(int(exponent.p)) > MAX_EXPONENT or int(exponent.q) > MAX_ROOT_INDEX:
                raise ParseError("exponent too large")
            # exact expansion grows every number inside the base, not only its magnitude:
            # (\pi 7^{700}/(7^{700}-1))^{999} is near \pi^{999} but holds 2-million-bit integers
            bits = max([_magnitude_bits(numeric)] + [_bits(r) for r in numeric.atoms(sympy.Rational)])
            if bits * abs(float(exponent)) > MAX_POWER_BITS:
                raise ParseError("power too large")
        elif exponent.is_number:
            if _magnitude_bits(numeric) * 2 ** _log2_abs(exponent) > MAX_POWER_BITS:
                raise ParseError("power too large")  # 10^{\sqrt{2}·10^{9}}
        else:
            for inner in exponent.atoms(sympy.Pow, sympy.exp):
                if inner.exp.free_symbols or _log2_abs(inner.exp) > math.log2(MAX_SYMBOLIC_EXPONENT_POWER) + 1:
                    raise ParseError("power tower with variables")  # 2^{2^{x}}, e^{x^{10000}}
            if any(_bits(r) > MAX_SYMBOLIC_EXPONENT_BITS for r in exponent.atoms(sympy.Rational)):
                raise ParseError("huge number in an exponent with variables")  # x^{10^{1470}+y}
        result = _check_finite(base**exponent)
        for inner in result.atoms(sympy.Pow):
            if inner.exp.is_Rational and abs(int(inner.exp.p)) > MAX_EXPONENT:
                raise ParseError("exponent too large")  # (x^{999})^{9999} = x^{9989001}
        return result


def parse_answer(text: str) -> Answer | None:
    """Parse an answer into a sympy expression (or a tuple of them); None when unparseable.

    Never evaluates the text as code. Bounded work: see the module docstring. Text over
    :data:`MAX_CHARS` is refused before the cache, which so holds at most 8192 short keys.

    >>> parse_answer("\\\\frac{-1+\\\\sqrt{5}}{4}")
    -1/4 + sqrt(5)/4
    """
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        return None
    return _parse_short(text)


@functools.lru_cache(maxsize=8192)
def _parse_short(text: str) -> Answer | None:
    """:func:`parse_answer` of a text of at most :data:`MAX_CHARS` characters (cached)."""
    normalized = normalize_text(text)
    if not normalized:
        return None
    try:
        return _Parser(tokenize(normalized)).top()
    except (ParseError, RecursionError, ZeroDivisionError, OverflowError):
        return None


def canonical_string(expr: Answer) -> str:
    """A deterministic LaTeX rendering (tuples as ``(a, b)``); equal parses give equal strings."""
    if isinstance(expr, tuple):
        return "(" + ", ".join(canonical_string(item) for item in expr) + ")"
    return sympy.latex(expr)


parse_answer.cache_clear = _parse_short.cache_clear  # type: ignore[attr-defined]
parse_answer.cache_info = _parse_short.cache_info  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------
# Equivalence


def _sample_point(symbols: list[sympy.Symbol], k: int) -> dict[sympy.Symbol, sympy.Rational]:
    """Fixed, generic positive values (about 1.3 to 2.3) for point ``k``; deterministic."""
    return {s: sympy.Rational(1000 + 37 * j + 211 * k, 613 + 17 * j + 5 * k) for j, s in enumerate(symbols)}


def _is_zero_at(difference: sympy.Expr, point: dict[sympy.Symbol, sympy.Rational]) -> bool | None:
    """Whether ``difference`` vanishes at ``point``; None when it is undefined there or undecidable.

    ``evalf`` substitutes the exact point and raises its working precision until each
    part has :data:`EVAL_DIGITS` correct digits, so ``x^{10000} + 1 - x^{10000}`` is not
    zero. A part it cannot resolve comes back as a bound with one bit of precision
    (``0.e-145``): below :data:`NEGLIGIBLE` it is zero; above, the point is retried once
    with up to :data:`MAX_EVAL_DIGITS` digits (huge magnitudes such as ``(x^2-1)^{9999}``).
    """
    for options in ({}, {"maxn": MAX_EVAL_DIGITS}):
        try:
            parts = difference.evalf(EVAL_DIGITS, subs=point, **options).as_real_imag()
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            return None
        if any(p != 0 and not isinstance(p, sympy.Float) for p in parts):
            return None  # undefined or unevaluated
        resolved = [p for p in parts if p != 0 and abs(p) >= NEGLIGIBLE]
        if any(p._prec > 1 for p in resolved):
            return False  # a part with correct digits that is not negligible
        if not resolved:
            return True
    return None


def _numeric_verdict(x: sympy.Expr, y: sympy.Expr, deadline: float) -> bool | None:
    """x - y is zero at every sample point where it is decidable (None when none is, or time ran out)."""
    difference = x - y
    if difference == 0:
        return True
    symbols = sorted(difference.free_symbols, key=lambda s: s.name)
    decided = 0
    for k in range(SAMPLE_POINTS if symbols else 1):
        if time.monotonic() > deadline:
            return None
        verdict = _is_zero_at(difference, _sample_point(symbols, k))
        if verdict is False:
            return False
        decided += verdict is True
    return True if decided else None


def is_small(expr: sympy.Expr) -> bool:
    """Small enough for ``simplify``, ``expand`` or ``radsimp`` (which have no time bound of their own).

    At most :data:`SIMPLIFY_MAX_OPS` operations, numbers of at most :data:`SMALL_NUMBER_BITS`
    bits, and every power either symbolic or rational with numerator at most
    :data:`SIMPLIFY_MAX_EXPONENT`.
    """
    if sympy.count_ops(expr) > SIMPLIFY_MAX_OPS or any(_bits(r) > SMALL_NUMBER_BITS for r in expr.atoms(sympy.Rational)):
        return False
    exponents = [power.exp for power in expr.atoms(sympy.Pow, sympy.exp)]
    return all(abs(int(e.p)) <= SIMPLIFY_MAX_EXPONENT if e.is_Rational else not e.is_number for e in exponents)


def _scalar_equivalent(x: sympy.Expr, y: sympy.Expr, deadline: float) -> bool:
    if x == y:
        return True
    if x.is_Rational and y.is_Rational:
        return False  # exact numbers: structural equality decides
    verdict = _numeric_verdict(x, y, deadline)
    if verdict is not None:
        return verdict
    difference = x - y
    if time.monotonic() > deadline or not is_small(difference):
        return False
    return sympy.simplify(difference) == 0


def is_equivalent(a: str, b: str, *, timeout_s: float = 2.0) -> bool:
    """True when answers ``a`` and ``b`` denote the same value (tuples elementwise, in order).

    Identical normalised text is equal (this covers answers the parser rejects, such
    as intervals). Otherwise both are parsed; exact rationals compare exactly; other
    values are evaluated to :data:`EVAL_DIGITS` digits (expressions with variables at
    :data:`SAMPLE_POINTS` fixed points): ``a - b`` must vanish (below :data:`NEGLIGIBLE`,
    with :data:`EVAL_DIGITS` correct digits) wherever it is decidable; when no point is,
    ``simplify(a - b) == 0`` decides for small expressions.
    ``timeout_s`` is a deadline checked between bounded steps; past it the answer is False.
    """
    deadline = time.monotonic() + timeout_s
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    texts = ["".join((normalize_text(t) or "").split()) for t in (a, b)]
    if texts[0] and texts[0] == texts[1]:
        return True
    x, y = parse_answer(a), parse_answer(b)
    if x is None or y is None:
        return False
    if isinstance(x, tuple) or isinstance(y, tuple):
        if not (isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y)):
            return False
        return all(_scalar_equivalent(p, q, deadline) for p, q in zip(x, y, strict=True))
    return _scalar_equivalent(x, y, deadline)
