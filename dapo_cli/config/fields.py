"""``setting()``: how every config field is declared (default + one-line help + choices)."""

from __future__ import annotations

import copy
from dataclasses import field
from typing import Any


def setting(default: Any, help: str, *, choices: tuple[str, ...] | None = None) -> Any:
    """Declare one config field with its default, one-line help and optional choices.

    A mutable default (list, dict, nested section) is deep-copied for every instance,
    so it keeps the values it was declared with and no two configs share it.
    """
    meta = {"help": help, "choices": choices}
    if isinstance(default, (list, dict)) or hasattr(default, "__dataclass_fields__"):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return field(default=default, metadata=meta)
