"""A model's context (``max_position_embeddings``) and the checks that keep generation inside it.

A RoPE model runs past its trained positions without an error -- transformers only warns -- and
what comes out is garbage. So the length budget is checked before anything is generated:

* ``dapo train``: ``data.max_prompt_length + rollout.max_response_length`` (and the validation
  limit) against the model's context, in the preflight, from ``config.json`` alone
  (:func:`context_of_spec`; no weights loaded);
* ``dapo eval``: every prompt of the dataset, tokenised once the model is loaded and before an
  MLflow run is opened or anything generated (:func:`check_prompts_fit`);
* every ``generate`` call of the local rollout engines: the longest tokenised prompt plus
  ``max_tokens`` (:func:`check_fits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dapo_cli.errors import UserError

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""Where configs keep their context length, in order (Llama/Qwen2/Mistral: the first)."""


def context_of_config(config: Any) -> int | None:
    """The context length of a transformers config object or ``config.json`` dict (None: not stated)."""
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
    text = get("text_config")
    if text is not None and all(get(k) is None for k in CONTEXT_KEYS):
        return context_of_config(text)
    for key in CONTEXT_KEYS:
        value = get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def context_of_dir(path: Path) -> int | None:
    """:func:`context_of_config` of ``path/config.json`` (None when missing, unreadable or out of bounds:
    read as the model-folder door reads it, :func:`dapo_cli.models.door.read_json_object`)."""
    from dapo_cli.models.door import read_json_object

    config, _ = read_json_object(path / "config.json")
    return None if config is None else context_of_config(config)


def context_of_spec(spec: str, tiny_positions: int) -> tuple[int | None, str]:
    """``(context, where it comes from)`` for a ``model.path`` without loading weights.

    ``builtin:*``: ``tiny_positions`` (``model.tiny.max_position_embeddings``); ``gguf:NAME`` and a local folder: its
    ``config.json``; a hub id: the cached ``config.json`` (None when not cached yet).
    """
    if spec.startswith("builtin:"):
        return tiny_positions, "model.tiny.max_position_embeddings"
    from dapo_cli.models.gguf import GGUF_PREFIX, named_model_dir

    if spec.startswith(GGUF_PREFIX):
        from dapo_cli.models.loading import default_cache_dir

        path = named_model_dir(spec[len(GGUF_PREFIX) :], default_cache_dir())
    else:
        path = Path(spec).expanduser()
    if path.is_dir():
        return context_of_dir(path), f"max_position_embeddings in {path / 'config.json'}"
    from dapo_cli.models.hub import cached_file, is_hub_id

    cached = cached_file(spec, "config.json") if is_hub_id(spec) else None
    return (context_of_dir(cached.parent) if cached else None), f"max_position_embeddings of {spec}"


def check_budget(budget: dict[str, int], context: int | None, where: str) -> None:
    """One-line :class:`UserError` when the settings in ``budget`` (name -> tokens) add up to more
    than ``context``; names the numbers and what to lower."""
    total = sum(budget.values())
    if context is None or total <= context:
        return
    terms = " + ".join(f"{name} ({value})" for name, value in budget.items())
    names = " or ".join(budget)
    raise UserError(f"{terms} = {total} exceeds the model's context of {context} positions ({where}); lower {names}")


def check_fits(prompt_tokens: int, max_tokens: int, model: Any) -> None:
    """Before generating: the longest prompt (``prompt_tokens``) plus ``max_tokens`` within the context of
    ``model`` (a ``PreTrainedModel``); else a one-line :class:`UserError` with the numbers."""
    config = getattr(model, "config", None)
    context = None if config is None else context_of_config(config)
    if context is None or prompt_tokens + max_tokens <= context:
        return
    room = context - prompt_tokens
    if room > 0:
        fix = (
            f"lower max_tokens to at most {room} (dapo eval --max-tokens; in training rollout.max_response_length "
            "or validation.max_tokens), or use shorter prompts or a model with a longer context"
        )
    else:
        fix = "the prompt alone does not fit: use shorter prompts (training drops those over data.max_prompt_length) or a model with a longer context"
    raise UserError(
        f"a prompt of {prompt_tokens} tokens + max_tokens {max_tokens} = {prompt_tokens + max_tokens} exceeds the "
        f"model's context of {context} positions (max_position_embeddings); {fix}"
    )


def check_prompts_fit(tokenizer: Any, model: Any, prompts: Sequence[str], max_tokens: int) -> None:
    """:func:`check_fits` for the longest of ``prompts`` as ``tokenizer`` tokenises them (without added
    special tokens, as the local rollout engines do) against ``model``'s context."""
    if not prompts:
        return
    longest = max(len(ids) for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"])
    check_fits(longest, max_tokens, model)
