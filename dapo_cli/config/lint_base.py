"""What every ``dapo lint`` rule is built from: :class:`Finding`, the :data:`RULES` registry and the :func:`rule`
decorator (the rules themselves: :mod:`dapo_cli.config.lint`, :mod:`dapo_cli.config.lint_objectives`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from dapo_cli.config.schema import Config
from dapo_cli.hardware import CpuBf16

ERROR = "error"
WARN = "warn"


@dataclass(frozen=True)
class Finding:
    """One thing a config does that the paper does not, or that is likely a mistake."""

    severity: str
    """:data:`ERROR` (breaks the paper's method) or :data:`WARN` (questionable)."""
    key: str
    """The dotted config key to change, e.g. ``algorithm.use_kl_loss``."""
    message: str
    """What is wrong, with the config's values."""
    fix: str
    """How to fix it (a ``--set`` or a toggle)."""
    id: str = ""
    """Stable id of the rule that found it (stamped by :func:`rule`)."""

    def line(self) -> str:
        """``WARN key: what is wrong — fix [id]`` (one line, plain text)."""
        return f"{self.severity.upper()} {self.key}: {self.message} — {self.fix} [{self.id}]"

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "severity": self.severity, "key": self.key, "message": self.message, "fix": self.fix}


Rule = Callable[..., list[Finding]]
"""``fn(cfg)``, or ``fn(cfg, cpu)`` for a rule that reads the machine (``cpu``: None = read it when needed)."""

RULES: dict[str, Callable[..., list[Finding]]] = {}
"""Every lint rule's check ``(cfg, *, cpu=None) -> list[Finding]`` by id, in the order they are checked."""


def rule(rule_id: str, *, reads_machine: bool = False) -> Callable[[Rule], Callable[..., list[Finding]]]:
    """Register ``fn`` as rule ``rule_id``; its findings carry that id. ``reads_machine``: ``fn`` also gets
    the check's ``cpu`` (a :class:`~dapo_cli.hardware.CpuBf16`; None: this machine's, read by the rule)."""

    def register(fn: Rule) -> Callable[..., list[Finding]]:
        if rule_id in RULES:
            raise ValueError(f"lint rule {rule_id!r} is registered twice")

        @functools.wraps(fn)
        def checked(cfg: Config, *, cpu: CpuBf16 | None = None) -> list[Finding]:
            found = fn(cfg, cpu) if reads_machine else fn(cfg)
            return [dataclasses.replace(f, id=rule_id) for f in found]

        RULES[rule_id] = checked
        return checked

    return register
