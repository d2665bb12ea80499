"""Rule-based verifiers: strings in, ``{"score", "acc", "pred"}`` dicts out.

``get_verifier(name)`` returns one of :data:`VERIFIERS` (``math_dapo`` is the
released DAPO rule and the default); ``score_batch`` scores a batch with one.
"""

from dapo_cli.rewards.registry import DEFAULT_VERIFIER, VERIFIERS, get_verifier, score_batch

__all__ = ["DEFAULT_VERIFIER", "VERIFIERS", "get_verifier", "score_batch"]
