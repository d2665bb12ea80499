"""A Jinja sandbox whose renders are bounded in loop steps, value size, total work and wall-clock time.

jinja2's ``ImmutableSandboxedEnvironment`` (what transformers renders chat templates in) keeps a template
away from Python's internals, but not away from the machine: ``{% for i in range(10**5) %}{% for j in
range(10**5) %}{% endfor %}{% endfor %}`` runs for hours, ``{{ 'x' * 10**10 }}`` asks for 10 GB, and a loop
that doubles a string does the same in 40 steps. A chat template is code from a model folder, so
:class:`BoundedSandbox` charges what a render does to a :class:`Budget` and stops it with
:class:`TemplateLimit` (a ``TemplateError``) when the budget is spent. What it checks, and where:

* **loop steps and calls** (:data:`MAX_STEPS`): every ``{% for %}`` iterates through :meth:`bounded_loop`
  (the compiled tree is rewritten so; see :class:`_Bounder`), a step costing 1 plus the literal text and
  nodes of the loop body; every call, filter and intercepted operator is a step too. Loops that write
  nothing are bounded by this alone.
* **value size** (``Budget.value_limit``, at least :data:`MIN_VALUE_LIMIT`, more for long inputs): before
  an operation that can multiply sizes runs (``*``, ``**``, ``%``, ``+``, ``~``, a literal list, a slice,
  a filter, a method such as ``center``/``replace``/``join``/``format``), its result size is estimated
  from its inputs; after every operation the result is measured. Sizes are "units" (:func:`measure`):
  a character, or 8 per container slot, so a unit is a few bytes of memory at most.
* **total work** (:data:`WORK_SCALE` x the value limit): every value built and
  every character written (also into ``{% set %}`` blocks and macros, through ``finalize``) is charged,
  so a render cannot build a long chain of values each under the value limit.
* **wall-clock time** (:data:`DEADLINE_S`), checked at every charge: the backstop for work the units do
  not see (a filter on a large value repeated in a loop).

The estimates are classified by what an operation can do to sizes (:data:`LINEAR_FILTERS`,
:data:`STR_LINEAR_METHODS`, :data:`QUADRATIC_FILTERS`); an operation the tables do not know gets the
most conservative (quadratic) estimate, so the sandbox errs toward refusing, never toward allocating.
A template reaches only plain data (the inputs), jinja's filters and tests, and the globals given to
the environment, so the set of operations is closed. Nothing a template says is evaluated at compile
time (``optimized=False`` and a context-passing ``finalize`` turn jinja's constant folding off).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
import string
import time
from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, ValuesView
from dataclasses import dataclass, field
from types import GeneratorType
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.exceptions import TemplateError
from jinja2.nodes import EvalContext
from jinja2.runtime import Context, LoopContext, Macro, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Cycler, Joiner, Namespace
from jinja2.visitor import NodeTransformer

MAX_STEPS = 250_000
"""Loop iterations, calls, filters and intercepted operators per render. A chat template loops over the
messages (and tools): a few hundred steps. A quarter of a million empty loop steps take about 0.1 s,
as many macro calls about 1 s (measured on 2 busy cores)."""

MIN_VALUE_LIMIT = 1_000_000
"""The smallest value-size limit (units, :func:`measure`): no single value a render builds, and not its
output, may be larger. Scaled up for long inputs (:data:`INPUT_SCALE`)."""

INPUT_SCALE = 64
"""The value limit is at least this many times the size of the render's inputs (the messages), so a
long prompt never trips it: a real template's output is its input plus a few hundred characters."""

WORK_SCALE = 16
"""Total units a render may build or write, as a multiple of its value limit."""

DEADLINE_S = 10.0
"""Wall-clock seconds a render may take (a real chat template renders in well under a millisecond)."""

MAX_INT_BITS = 100_000
"""Largest integer (in bits) ``*`` and ``**`` may build: ``9 ** 9 ** 9`` would take minutes and gigabytes."""

SLOT = 8
"""Units per container slot (a pointer, and the object behind it, is several bytes)."""

LINEAR_FILTERS = frozenset({
    "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "filesizeformat",
    "first", "float", "forceescape", "groupby", "int", "items", "last", "length", "list", "lower", "map",
    "max", "min", "random", "reject", "rejectattr", "reverse", "round", "safe", "select", "selectattr",
    "sort", "string", "sum", "title", "trim", "truncate", "unique", "upper", "urlencode", "wordcount", "xmlattr",
})
"""jinja filters whose result is at most a constant times the size of their inputs."""

QUADRATIC_FILTERS = frozenset({"striptags", "urlize", "wordwrap"})
"""Filters whose time can grow with the square of their input (regular expressions that rescan): their
input is bounded by the square root of the value limit. So is ``sum`` with a ``start`` that is not a
number (``|sum(start=[])`` copies the growing list at every item); a sum of numbers is linear."""

STR_LINEAR_METHODS = frozenset({
    "capitalize", "casefold", "count", "decode", "encode", "endswith", "find", "hex", "index", "isalnum",
    "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isprintable",
    "isspace", "istitle", "isupper", "lower", "lstrip", "partition", "removeprefix", "removesuffix", "rfind",
    "rindex", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase",
    "title", "upper",
})
"""``str``/``bytes`` methods whose result is at most a constant times their inputs. The others that a
sandbox permits either multiply sizes by an argument (``center``, ``ljust``, ``rjust``, ``zfill``,
``expandtabs``, ``replace``, ``join``, ``translate``; estimated as such) or format (``format``,
``format_map``; estimated from the format string)."""

_OPAQUE_RECEIVERS = (LoopContext, Namespace, Cycler, Joiner, Undefined)
"""Objects whose methods build nothing from their arguments (``loop.cycle``, ``joiner()``...)."""


class TemplateLimit(TemplateError):
    """A render ran past one of its bounds; the message says which."""


@dataclass
class Budget:
    """What one render may still spend. ``known`` caches the sizes of the inputs' containers (fixed
    for the render), so a template that asks for ``messages|length`` in a loop does not re-measure them."""

    value_limit: int = MIN_VALUE_LIMIT
    steps_left: int = MAX_STEPS
    work_left: int = MIN_VALUE_LIMIT * WORK_SCALE
    deadline: float = field(default_factory=lambda: time.monotonic() + DEADLINE_S)
    known: dict[int, tuple[int, int]] = field(default_factory=dict)
    keep: list[Any] = field(default_factory=list)
    """The objects ``known`` holds the sizes of (kept alive so that no id is reused during the render)."""

    @classmethod
    def for_inputs(cls, inputs: Any) -> Budget:
        """A fresh budget scaled to ``inputs`` (everything the template is given: plain data a few levels
        deep, built by :func:`dapo_cli.models.chat_template.chat_variables`), with the sizes of the inputs'
        lists, tuples and dicts cached (they stay alive, and unchanged, for the render)."""
        known: dict[int, tuple[int, int]] = {}
        keep: list[Any] = []

        def size(item: Any) -> tuple[int, int]:  # post-order: each container measured once
            if not isinstance(item, (list, tuple, dict)):
                return measure(item, None)
            if id(item) not in known:
                parts = [size(v) for kv in item.items() for v in kv] if isinstance(item, dict) else [size(v) for v in item]
                known[id(item)] = (SLOT * (1 + len(item)) + sum(u for u, _ in parts), 1 + max((d for _, d in parts), default=0))
                keep.append(item)
            return known[id(item)]

        limit = max(MIN_VALUE_LIMIT, INPUT_SCALE * size(inputs)[0])
        return cls(value_limit=limit, work_left=WORK_SCALE * limit, known=known, keep=keep)

    def step(self, units: int = 1) -> None:
        """One loop step, call or operation, costing ``units`` of work."""
        self.steps_left -= 1
        if self.steps_left < 0:
            raise TemplateLimit(f"it ran more than {MAX_STEPS:,} loop steps, calls and filters")
        self.spend(units)

    def spend(self, units: int) -> None:
        """Charge ``units`` built or written; also where the deadline is checked."""
        self.work_left -= units
        if self.work_left < 0:
            raise TemplateLimit(f"it built or wrote more than {self.value_limit * WORK_SCALE:,} characters in all")
        if time.monotonic() > self.deadline:
            raise TemplateLimit(f"it ran longer than {DEADLINE_S:g} seconds")

    def allow(self, estimate: int, what: str) -> None:
        """Refuse an operation whose result would be larger than the value limit (before it runs)."""
        if estimate > self.value_limit:
            raise TemplateLimit(f"{what} would build a value of more than {self.value_limit:,} characters")

    def weigh(self, value: Any) -> int:
        """:func:`measure` of ``value``, cut off just past the value limit."""
        return measure(value, self.value_limit + 1, self.known)[0]

    def built(self, value: Any, what: str) -> Any:
        """Measure and charge a value an operation built; refuse it when it is over the value limit."""
        size = self.weigh(value)
        if size > self.value_limit:
            raise TemplateLimit(f"{what} built a value of more than {self.value_limit:,} characters")
        self.spend(size)
        return value


_CURRENT: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("dapo_template_budget", default=None)


def current_budget() -> Budget:
    """The budget of the render in progress; outside one (jinja evaluating something while it compiles)
    a fresh default budget, so the size checks hold there too."""
    return _CURRENT.get() or Budget()


def measure(value: Any, cutoff: int | None, known: dict[int, tuple[int, int]] | None = None) -> tuple[int, int]:
    """``(units, depth)`` of ``value``: characters of a string, 1 per number (more for a long integer),
    :data:`SLOT` plus the contents for each container slot, :data:`SLOT` for anything opaque (a range,
    a generator, a macro). Shared references count every time (rendering ``[s, s]`` writes ``s`` twice).

    Stops once the units pass ``cutoff`` (the cost is bounded by it). ``known`` caches containers whose
    contents cannot change during the render (filled with the render's inputs)."""
    total, depth = 0, 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        depth = max(depth, level)
        children: Any = ()
        if isinstance(item, (str, bytes, bytearray)):
            total += len(item)
        elif isinstance(item, bool) or item is None or isinstance(item, float):
            total += 1
        elif isinstance(item, int):
            total += 1 + item.bit_length() // 32
        elif known is not None and id(item) in known:
            units, below = known[id(item)]
            total += units
            depth = max(depth, level + below - 1)
        elif isinstance(item, Namespace):
            attrs = item._Namespace__attrs  # type: ignore[attr-defined]
            total += SLOT * (1 + len(attrs))
            children = (v for kv in attrs.items() for v in kv)
        elif isinstance(item, Mapping):
            total += SLOT * (1 + len(item))
            children = (v for kv in item.items() for v in kv)
        elif isinstance(item, (list, tuple, set, frozenset, KeysView, ValuesView, ItemsView)):
            total += SLOT * (1 + len(item))
            children = item
        else:
            total += SLOT
        if cutoff is not None and total > cutoff:  # before the children are pushed: the cost stays bounded
            return total, depth
        stack.extend((child, level + 1) for child in children)
    return total, depth


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def _format_estimate(budget: Budget, fmt: str, inputs: list[Any], *, braces: bool) -> int:
    """Units a ``%``- or ``{}``-format of ``fmt`` with ``inputs`` can produce: each field at most every
    argument's repr (10 units per unit covers escapes) or its width/precision, whichever is larger."""
    widths = [0]
    if braces:
        fields = 0
        for _, name, spec, _ in string.Formatter().parse(fmt):
            if name is not None:
                fields += 1
                widths += [int(n) for n in re.findall(r"\d+", spec or "")]
    else:
        specs = _PERCENT_SPEC.findall(fmt)
        fields = len(specs)
        widths += [int(n) for spec in specs for n in spec if n.isdigit()]
    numbers = [abs(x) for x in inputs if isinstance(x, int)]
    per_field = 10 * sum(budget.weigh(x) for x in inputs) + max(widths + numbers)
    return len(fmt) + fields * per_field


def _estimate(budget: Budget, receiver: Any, args: list[Any], kind: str) -> int:
    """The result size of an operation of ``kind`` on ``receiver`` (a method's object, a filter's value;
    None for a function) and ``args``:

    * ``linear``: the sum of the inputs' sizes;
    * ``multiply``: that sum times (1 + the largest integer argument, or the largest size of an input
      other than the largest one), which bounds ``s.center(n)``, ``s.replace(a, b)``, ``sep.join(xs)``,
      ``x|indent(n)`` (the receiver's own value is no factor: ``(10**9).bit_length()`` builds nothing);
    * ``quadratic``: the square of the sum (time, for the rescanning filters; and anything unknown).
    """
    inputs = ([] if receiver is None else [receiver]) + args
    sizes = [budget.weigh(x) for x in inputs]
    total = sum(sizes)
    if kind == "linear":
        return total
    if kind == "quadratic":
        return total * total
    heaviest = max(range(len(sizes)), key=sizes.__getitem__, default=-1)
    factors = [abs(x) for x in args if isinstance(x, int)]
    factors += [size for i, size in enumerate(sizes) if i != heaviest and not isinstance(inputs[i], int)]
    return total * (1 + max(factors, default=0))


def _plain_args(budget: Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Arguments with every generator (``map``, ``select``...) turned into a list, measured and charged as
    it is drawn, so an operation's inputs can be sized before it runs."""

    def plain(value: Any) -> Any:
        if not isinstance(value, (GeneratorType, Iterator)) or isinstance(value, LoopContext):
            return value
        items, size = [], SLOT
        for item in value:
            items.append(item)
            size += SLOT + budget.weigh(item)
            budget.step(SLOT)
            if size > budget.value_limit:
                raise TemplateLimit(f"it built a sequence of more than {budget.value_limit:,} characters")
        return items

    return tuple(plain(a) for a in args), {k: plain(v) for k, v in kwargs.items()}


JINJA_CALL_KWARGS = ("_loop_vars", "_block_vars", "caller")
"""Keyword arguments jinja adds to calls itself (not the template's data)."""


def _call_kind(obj: Any) -> tuple[str, Any, str]:
    """``(kind, receiver, name)`` of a callable a template calls (see :func:`_estimate`)."""
    wrapped = getattr(obj, "__wrapped__", None)
    name = getattr(obj, "__name__", type(obj).__name__)
    receiver = getattr(wrapped if wrapped is not None else obj, "__self__", None)
    if isinstance(receiver, (str, bytes, bytearray)):
        if name in ("format", "format_map"):
            return "format", receiver, name
        if name in STR_LINEAR_METHODS:
            return "linear", receiver, name
        if name in ("center", "ljust", "rjust", "zfill", "expandtabs", "replace", "join", "translate", "maketrans"):
            return "multiply", receiver, name
        return "quadratic", receiver, name
    if isinstance(receiver, (list, tuple, dict, set, frozenset)):
        return "linear", receiver, name
    if isinstance(receiver, (int, float)):
        return "multiply", receiver, name
    if isinstance(receiver, _OPAQUE_RECEIVERS) or getattr(obj, "template_linear", False):
        return "linear", None, name
    return "quadratic", receiver, name


def linear(func: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a global given to :class:`BoundedSandbox` as building at most its inputs' size."""
    func.template_linear = True  # type: ignore[attr-defined]
    return func


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (jinja filter ``name``) with its inputs sized before it runs and its result after."""
    kind = "linear" if name in LINEAR_FILTERS else "quadratic" if name in QUADRATIC_FILTERS else "multiply"
    if getattr(func, "template_linear", False):
        kind = "linear"

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = current_budget()
        args, kwargs = _plain_args(budget, args, kwargs)
        budget.step()
        data = [a for a in (*args, *kwargs.values()) if not isinstance(a, (Context, EvalContext, BoundedSandbox))]
        value, rest = (data[0], data[1:]) if data else (None, [])
        if name == "format" and isinstance(value, str):
            estimate = _format_estimate(budget, value, rest, braces=False)
        else:
            start = kwargs.get("start", args[3] if len(args) > 3 else 0)  # do_sum(environment, iterable, attribute, start)
            numeric = isinstance(start, (int, float))
            estimate = _estimate(budget, value, rest, "quadratic" if name == "sum" and not numeric else kind)
        budget.allow(estimate, f"the filter '{name}'")
        return budget.built(func(*args, **kwargs), f"the filter '{name}'")

    return guarded


@pass_context
def _finalize(context: Context, value: Any) -> Any:
    """Every ``{{ expression }}`` a render writes (to its output or into a ``{% set %}``/macro buffer):
    sized before it is turned into text (a list's text is its repr) and charged after."""
    budget = current_budget()
    if not isinstance(value, str):
        budget.allow(10 * budget.weigh(value), "writing a value")
        value = str(value)
    budget.spend(len(value))
    return value


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """An ``ImmutableSandboxedEnvironment`` whose renders are charged to the :class:`Budget` of
    :func:`rendering`. Compile templates with :meth:`compile_bounded` (it rewrites the loops);
    register filters and globals before :meth:`guard_filters`."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=_finalize, optimized=False, **options)
        self.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs: no chat template needs it

    def guard_filters(self) -> None:
        """Wrap every registered filter in its size checks (call once, after registering filters)."""
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}

    def compile_bounded(self, source: str) -> Any:
        """``source`` compiled with every loop, ``~`` and literal container routed through the budget."""
        tree = _Bounder().visit(self.parse(source))
        tree.set_environment(self)
        return self.from_string(tree)

    # ---------------------------------------------------------------- hooks the rewritten tree calls

    def bounded_loop(self, iterable: Any, units: int) -> Iterator[Any]:
        """What a ``{% for %}`` iterates: ``iterable``, one step of ``units`` per item."""
        budget = current_budget()
        for item in iterable:
            budget.step(units)
            yield item

    def bounded_concat(self, parts: list[Any]) -> str:
        """``a ~ b ~ ...``: sized before it is joined (as jinja joins it: ``str`` of each part)."""
        budget = current_budget()
        budget.step()
        budget.allow(sum(len(p) if isinstance(p, str) else 10 * budget.weigh(p) for p in parts), "'~'")
        return budget.built("".join(map(str, parts)), "'~'")

    def bounded_literal(self, value: Any) -> Any:
        """A list, tuple or dict literal, charged by its size (a loop can build one per step)."""
        return current_budget().built(value, "a literal")

    def bounded_slice(self, value: Any, start: Any, stop: Any, step: Any) -> Any:
        """``value[start:stop:step]`` (jinja subscripts slices directly, past ``getitem``): a copy,
        charged, so a loop cannot keep copying a large string for free."""
        budget = current_budget()
        budget.step()
        return budget.built(value[start:stop:step], "a slice")

    # ---------------------------------------------------------------- the sandbox's own hooks

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = current_budget()
        hook = getattr(__obj, "__func__", None)
        if hook in _HOOKS and getattr(__obj, "__self__", None) is __self:
            for key in JINJA_CALL_KWARGS:
                kwargs.pop(key, None)
            return __obj(*args, **kwargs)
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's loop(children)
            budget.step()
            return super().call(__context, __obj, __self.bounded_loop(args[0], 1), *args[1:], **kwargs)
        if isinstance(__obj, Macro):
            budget.step()
            return budget.built(super().call(__context, __obj, *args, **kwargs), f"the macro '{__obj.name}'")
        args, kwargs = _plain_args(budget, args, kwargs)
        budget.step()
        kind, receiver, name = _call_kind(__obj)
        data = [*args, *(v for k, v in kwargs.items() if k not in JINJA_CALL_KWARGS)]
        if kind == "format":
            estimate = _format_estimate(budget, receiver, data, braces=True)
        else:
            estimate = _estimate(budget, receiver, data, kind)
        budget.allow(estimate, f"'{name}'")
        return budget.built(super().call(__context, __obj, *args, **kwargs), f"'{name}'")

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget = current_budget()
        budget.step()
        what = f"'{operator}'"
        if operator == "%" and isinstance(left, str):
            budget.allow(_format_estimate(budget, left, list(right) if isinstance(right, tuple) else [right], braces=False), what)
        elif operator == "*" and isinstance(left, int) and isinstance(right, int):
            if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
                raise TemplateLimit(f"'*' would build a number of more than {MAX_INT_BITS:,} bits")
        elif operator == "*":
            count = right if isinstance(right, int) else left if isinstance(left, int) else 1
            budget.allow(budget.weigh(left if isinstance(right, int) else right) * max(count, 0), what)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if right > MAX_INT_BITS or right * abs(left).bit_length() > MAX_INT_BITS:
                raise TemplateLimit(f"'**' would build a number of more than {MAX_INT_BITS:,} bits")
        elif operator == "+":
            budget.allow(budget.weigh(left) + budget.weigh(right), what)
        return budget.built(super().call_binop(context, operator, left, right), what)


_HOOKS = frozenset({BoundedSandbox.bounded_loop, BoundedSandbox.bounded_concat, BoundedSandbox.bounded_literal, BoundedSandbox.bounded_slice})


class _Bounder(NodeTransformer):
    """Rewrites a parsed template so that its loops, ``~`` and literal containers call the budget hooks:
    ``{% for x in xs %}`` iterates ``bounded_loop(xs, units)`` (``units``: 1 + the body's nodes and
    literal text, what one step can build or write without calling anything), ``a ~ b`` becomes
    ``bounded_concat([a, b])``, ``[a, b]`` becomes ``bounded_literal([a, b])`` and ``s[i:j]``
    ``bounded_slice(s, i, j, None)``."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        body = [n for part in (*node.body, *node.else_) for n in (part, *part.find_all(nodes.Node))]
        units = 1 + len(body) + sum(len(n.data) for n in body if isinstance(n, nodes.TemplateData))
        self.generic_visit(node)
        node.iter = _hook("bounded_loop", [node.iter, nodes.Const(units)], node.iter)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _hook("bounded_concat", [nodes.List(node.nodes, lineno=node.lineno)], node)

    def _literal(self, node: nodes.Node) -> nodes.Node:
        self.generic_visit(node)
        if getattr(node, "ctx", "load") != "load":  # an assignment target: {% for k, v in ... %}
            return node
        return _hook("bounded_literal", [node], node)

    visit_List = visit_Tuple = visit_Dict = _literal

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Node:
        self.generic_visit(node)
        if not isinstance(node.arg, nodes.Slice):
            return node
        parts = [part or nodes.Const(None) for part in (node.arg.start, node.arg.stop, node.arg.step)]
        return _hook("bounded_slice", [node.node, *parts], node)


def _hook(name: str, args: list[nodes.Expr], where: nodes.Node) -> nodes.Call:
    return nodes.Call(nodes.EnvironmentAttribute(name), args, [], None, None, lineno=where.lineno)


@contextlib.contextmanager
def rendering(budget: Budget) -> Iterator[Budget]:
    """Make ``budget`` the one the hooks charge while the block runs (a context variable: each thread
    and each nested render has its own)."""
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)
