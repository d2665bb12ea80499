"""Checkpoints that transformers 4.5x reads as transformers 5.x wrote them.

transformers 5 changed two things in what ``save_pretrained`` writes that 4.x misreads:

* ``tokenizer_config.json`` names the generic fast tokenizer ``TokenizersBackend``, a class 4.x
  does not have (``AutoTokenizer`` fails: "Tokenizer class TokenizersBackend does not exist");
  ``PreTrainedTokenizerFast`` is the same thing in both (a ``tokenizer.json``, as it is).
* ``config.json`` carries RoPE settings only as ``rope_parameters``; 4.x reads ``rope_theta``
  and ``rope_scaling`` at the top level and otherwise silently uses its default theta (10,000
  for Qwen2 and Llama), giving other logits.

:func:`make_portable` rewrites both after every save (atomically), leaving 5.x's fields in place:
5.x reads a top-level ``rope_theta`` equal to ``rope_parameters``'s the same way.
``tests/models/test_models_compat_tf4.py`` loads such checkpoints in transformers 4.57.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dapo_cli.fileio import write_json_atomic

PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
"""The generic fast tokenizer's name in transformers 4.x and 5.x alike."""

RENAMED_TOKENIZER_CLASSES = frozenset({"TokenizersBackend"})
"""5.x-only names of the generic fast tokenizer."""

def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def portable_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` with ``rope_theta`` (and, for a scaled RoPE, ``rope_scaling``) also at the top
    level, from ``rope_parameters``; nested ``text_config`` / ``vision_config`` likewise."""
    out = dict(config)
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        if "rope_theta" in rope and config.get("rope_theta") is None:
            out["rope_theta"] = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default" and config.get("rope_scaling") is None:
            out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    for key in ("text_config", "vision_config"):
        if isinstance(config.get(key), dict):
            out[key] = portable_config(config[key])
    return out


def make_portable(directory: str | Path) -> None:
    """Rewrite the ``save_pretrained`` folder ``directory`` so transformers 4.5x loads it correctly."""
    directory = Path(directory)
    tok_file = directory / "tokenizer_config.json"
    tok = _read(tok_file)
    if tok is not None and tok.get("tokenizer_class") in RENAMED_TOKENIZER_CLASSES:
        write_json_atomic(tok_file, {**tok, "tokenizer_class": PORTABLE_TOKENIZER_CLASS})
    cfg_file = directory / "config.json"
    cfg = _read(cfg_file)
    if cfg is not None:
        portable = portable_config(cfg)
        if portable != cfg:
            write_json_atomic(cfg_file, portable)
