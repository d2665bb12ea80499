"""Policies: the tiny built-in model, its character tokenizer, and loading.

``resolve_model(spec, tiny)`` -> path (``builtin:tiny``: its cache folder, keyed by the
config fingerprint; :func:`dapo_cli.warmstart.ensure_model` warm-starts it there when
missing, a layer above this package); ``load_policy(path)`` -> ``(model, tokenizer)`` for any
``save_pretrained`` folder or hub id; ``format_prompt(tokenizer, messages)``
renders a DAPO prompt for generation (``chat_template``: the folder's template, bounded in
time and memory). ``door`` checks a model folder before anything loads it, ``hub`` resolves
hub ids through the standard Hugging Face cache, ``context`` checks lengths against
``max_position_embeddings``, ``compat`` makes saved folders readable by transformers 4.57.
"""

from dapo_cli.models.loading import BUILTIN_MODELS, MODEL_CARD, default_cache_dir, load_policy, resolve_model
from dapo_cli.models.tiny import ARCHITECTURES, build_tiny_model, count_parameters, save_policy
from dapo_cli.models.tokenizer import build_char_tokenizer, format_prompt

__all__ = [
    "ARCHITECTURES",
    "BUILTIN_MODELS",
    "MODEL_CARD",
    "build_char_tokenizer",
    "build_tiny_model",
    "count_parameters",
    "default_cache_dir",
    "format_prompt",
    "load_policy",
    "resolve_model",
    "save_policy",
]
