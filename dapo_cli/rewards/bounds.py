"""How much of its inputs each verifier reads: every score costs time linear in a fixed bound.

Responses and ground truths are untrusted text (model output, dataset cells). Each
verifier reads a fixed number of characters of each, whatever their length:

============  ==========================================  ==========================================
verifier      response                                    ground truth
============  ==========================================  ==========================================
math_dapo     last 300 characters (``WINDOW_CHARS``)      whole, if at most ``MAX_GROUND_TRUTH_CHARS``
strict_box    last 100 characters (``BOX_WINDOW_CHARS``)  whole, if at most ``MAX_GROUND_TRUTH_CHARS``
math_equiv    last 300 characters; the answer parsed      whole, if at most ``MAX_GROUND_TRUTH_CHARS``;
              only when at most 500 (``MAX_CHARS``)       parsed only when at most 500
============  ==========================================  ==========================================

A longer ground truth is **unscorable**: every response scores -1 (``acc`` False)
without the ground truth being read. Why 1,000 characters: no verifier can match a
longer one on any real answer. ``strict_box`` compares the verbatim content of a box
inside its last 100 characters, ``math_equiv`` rejects answers over 500 characters,
and ``math_dapo`` compares normalised text taken from the last 300 characters of the
response (its normalisation lengthens text by at most 4 characters per ``\\fracab``,
so a prediction stays under 500 characters). Only a ground truth padded with text the
normalisation deletes (spaces, ``\\text{}``, unit words) could still match past 1,000
characters. The longest answer in the public sets (AIME 2024, AMC 2023, Minerva math,
Gaokao 2023) is 210 characters (a Minerva expression), so the cap is ~5 times any real
answer; ``dapo prepare-data`` drops longer ones (reason ``answer_too_long``) before
they reach a verifier.
"""

from __future__ import annotations

MAX_GROUND_TRUTH_CHARS = 1_000
"""Longest ground truth a verifier reads; a longer one scores every response -1."""


def scorable(ground_truth: str) -> bool:
    """Whether a verifier reads ``ground_truth`` (at most :data:`MAX_GROUND_TRUTH_CHARS` characters). O(1)."""
    return len(ground_truth) <= MAX_GROUND_TRUTH_CHARS
