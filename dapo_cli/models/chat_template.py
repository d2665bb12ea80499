"""Chat templates rendered as transformers renders them, but bounded: the template is a model folder's code.

A tokenizer's chat template is Jinja from wherever the model folder came from. transformers renders it
in an ``ImmutableSandboxedEnvironment`` with nothing bounding time or memory: a template looping 10^5 x
10^5 times or building a 10 GB string runs until the machine gives out, and one that raises, does not
parse or reaches for ``__class__`` ends in a traceback. So dapo renders every prompt itself
(:func:`render_prompt`, what :func:`dapo_cli.models.tokenizer.format_prompt` calls), in
:class:`~dapo_cli.models.template_sandbox.BoundedSandbox` set up as transformers sets up its own
(``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, the ``{% generation %}`` tag, ``tojson`` without
HTML escaping, ``raise_exception``, ``strftime_now``, ``dict``, ``namespace`` without underscore
names) and given the same variables (the messages, ``tools``/``documents`` None,
``add_generation_prompt`` and the special tokens), so the text is the same, character for character
(tests/models/test_models_door.py compares it with ``apply_chat_template``). Every render is bounded
(loop steps, value sizes, total work, 10 s; see :mod:`~dapo_cli.models.template_sandbox`): a template
may branch on a prompt's content, so checking it once would not be enough.

Whatever goes wrong in a template -- it does not parse, it raises, the sandbox refuses it, it runs
past a bound -- is :class:`TemplateProblem`, which callers turn into a one-line ``UserError`` naming the
model folder (:func:`template_error`). The door check (:func:`template_problem`, from
:func:`dapo_cli.models.door.tokenizer_problem`) compiles every template of a folder and renders its
default one on a one-message probe conversation, so a template that cannot work fails before a
command creates anything.

Not reproduced: ``lipsum`` (no chat template uses it; it writes n paragraphs) is not a global here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import Extension

from dapo_cli.models.template_sandbox import Budget, BoundedSandbox, TemplateLimit, current_budget, linear, measure, rendering
from dapo_cli.redact import escape_controls

MAX_TEMPLATE_CHARS = 1_000_000
"""Longest chat template compiled (real ones are 1-20 thousand characters; parsing is linear)."""

PROBE_CONVERSATION = ({"role": "user", "content": "What is 1 + 2?"},)
"""What the door check renders: one user message, the shape of every DAPO prompt (a system message is
not probed: some templates, Gemma's, refuse one by design)."""

FIX = "fix or remove the chat template (chat_template.jinja, or \"chat_template\" in tokenizer_config.json) or give another model directory"
"""The end of every chat-template error line."""


class TemplateProblem(Exception):
    """A chat template that cannot render; the message says why, in a few words."""


class TemplateRaised(jinja2.TemplateError):
    """What the template's own ``raise_exception(message)`` raises."""


# ---------------------------------------------------------------- the environment (as transformers sets it up)


class GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}``: transformers marks assistant text with it (for its
    assistant-token masks); rendering it writes the body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


@linear
def raise_exception(message: Any) -> None:
    """The template's way to refuse a conversation."""
    raise TemplateRaised(str(message))


@linear
def strftime_now(fmt: str) -> str:
    """Today's date as the template formats it (a directive writes at most a few dozen characters)."""
    current_budget().allow(32 * len(str(fmt)), "strftime_now")
    return datetime.now().strftime(fmt)


@linear
def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    """JSON without jinja's HTML escaping (what transformers gives templates). Indentation repeats per
    nesting level, so the estimate is the value's size times the indent times its depth."""
    budget = current_budget()
    units, depth = measure(value, budget.value_limit + 1, budget.known)
    width = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    budget.allow(6 * units * (1 + max(width, 0) * depth), "tojson")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class TemplateDict:
    """``dict(...)`` for templates: builds a dict, and nothing else of ``dict``'s class is reachable."""

    template_linear = True

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict[Any, Any]:
        return dict.fromkeys(keys, value)


class TemplateNamespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses attribute names starting with ``_`` (they would reach Python's
    internals through the namespace)."""

    template_linear = True

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's Namespace signature
        self, rest = args[0], args[1:]
        for name in dict(*rest, **kwargs):
            _public(name)
        jinja2.utils.Namespace.__init__(self, *rest, **kwargs)

    def __setitem__(self, name: str, value: Any) -> None:
        _public(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _public(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_' (got {name!r})")


@functools.lru_cache(maxsize=1)
def environment() -> BoundedSandbox:
    """The one bounded environment chat templates compile in."""
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(), namespace=TemplateNamespace)
    env.guard_filters()
    return env


@functools.lru_cache(maxsize=32)
def _compiled(source: str) -> jinja2.Template:
    return environment().compile_bounded(source)


def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled (cached by its text); :class:`TemplateProblem` when it is too long or does not parse."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateProblem(f"it is {len(source):,} characters long; at most {MAX_TEMPLATE_CHARS:,}")
    try:
        return _compiled(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateProblem(f"syntax error at line {exc.lineno}: {_short(exc.message or exc)}") from None
    except RecursionError:
        raise TemplateProblem("it nests too deeply to parse") from None


# ---------------------------------------------------------------- rendering


def render_template(source: str, variables: Mapping[str, Any]) -> str:
    """``source`` rendered with ``variables`` inside a fresh :class:`Budget` scaled to them; its output
    is also cut off at the value limit as it streams. Every failure is :class:`TemplateProblem`."""
    template = compile_template(source)
    budget = Budget.for_inputs(dict(variables))
    out: list[str] = []
    written = 0
    try:
        with rendering(budget):
            for chunk in template.generate(**variables):
                written += len(chunk)
                if written > budget.value_limit:
                    raise TemplateLimit(f"its output passed {budget.value_limit:,} characters")
                budget.spend(0)  # the deadline, between chunks
                out.append(chunk)
    except TemplateRaised as exc:
        raise TemplateProblem(f"it raised an error: {_short(exc.message or exc)}") from None
    except TemplateLimit as exc:
        raise TemplateProblem(str(exc)) from None
    except jinja2.exceptions.SecurityError as exc:
        raise TemplateProblem(f"the sandbox refused it ({_short(exc)})") from None
    except RecursionError:
        raise TemplateProblem("it recursed too deeply (a macro or recursive loop calling itself)") from None
    except MemoryError:
        raise TemplateProblem("it ran out of memory") from None
    except Exception as exc:  # noqa: BLE001 - the template is foreign code: whatever it raises is its fault
        raise TemplateProblem(f"it failed ({type(exc).__name__}: {_short(exc)})") from None
    return "".join(out)


def chat_variables(messages: Sequence[Mapping[str, Any]], special_tokens: Mapping[str, Any]) -> dict[str, Any]:
    """What transformers' ``apply_chat_template(messages, add_generation_prompt=True)`` gives a template."""
    return {
        **{str(k): _plain(v) for k, v in special_tokens.items()},
        "messages": [{str(k): _plain(v) for k, v in m.items() if v is not None} for m in messages],
        "tools": None,
        "documents": None,
        "add_generation_prompt": True,
    }


def _plain(value: Any) -> Any:
    """Plain JSON-like data (a tokenizer's ``AddedToken`` becomes its text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def render_prompt(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> str:
    """The tokenizer's chat template applied to ``messages`` with the generation prompt, as
    ``tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`` renders it,
    within the bounds; a failure is a one-line ``UserError`` naming the tokenizer's folder."""
    source = tokenizer.get_chat_template()
    try:
        return render_template(source, chat_variables(messages, tokenizer.special_tokens_map))
    except TemplateProblem as exc:
        raise template_error(getattr(tokenizer, "name_or_path", "") or "the tokenizer", exc) from None


def template_error(where: object, problem: TemplateProblem | str) -> Exception:
    """The one-line ``UserError`` for a chat template of ``where`` (a model folder) that failed."""
    from dapo_cli.errors import UserError

    return UserError(f"chat template of {escape_controls(str(where))}: {problem}; {FIX}")


def template_problem(templates: Mapping[str, str], special_tokens: Mapping[str, Any]) -> str | None:
    """Why a folder's chat templates (name -> source; ``"default"`` is the one prompts use) cannot work,
    or None: each must compile, and the default one must render :data:`PROBE_CONVERSATION`."""
    for name, source in templates.items():
        try:
            compile_template(source)
            if name == "default":
                render_template(source, chat_variables(PROBE_CONVERSATION, special_tokens))
        except TemplateProblem as exc:
            return str(exc) if name == "default" else f"the template '{_short(name)}': {exc}"
    return None


def _short(text: object, limit: int = 200) -> str:
    """Untrusted text for an error line: control characters escaped, one line, at most ``limit`` characters."""
    flat = escape_controls(" ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
