"""``setting()``: how every config field is declared (default + one-line help + choices)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def setting(default: Any, help: str, *, choices: tuple[str, ...] | None = None) -> Any:
    """Declare one config field with its default, one-line help and optional choices."""
    meta = {"help": help, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    if hasattr(default, "__dataclass_fields__"):
        return field(default_factory=type(default), metadata=meta)
    return field(default=default, metadata=meta)
