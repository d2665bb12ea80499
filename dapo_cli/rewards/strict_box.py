"""The ``strict_box`` verifier: the last ``\\boxed{…}`` near the end, compared verbatim.

This is the released DAPO rule's ``strict_box_verify=True`` path:

.. math::

    R(y, y^*) = \\begin{cases} 1, & \\operatorname{box}(y_{-100:}) = y^* \\\\
                                -1, & \\text{otherwise} \\end{cases}

where :math:`y_{-100:}` is the final :data:`BOX_WINDOW_CHARS` code points and
``box`` is the content of the *last* ``\\boxed{`` whose braces balance. Nothing is
normalised and nothing is stripped (the released code compares ``pred == gt`` as
they are, so ``" 5"`` ≠ ``"5"``). When the last ``\\boxed{`` never closes, the
answer is ``[INVALID]`` even if an earlier box is complete (as released). A ground
truth over :data:`~dapo_cli.rewards.bounds.MAX_GROUND_TRUTH_CHARS` characters is
unscorable (every response scores -1; it could not equal a box of 100 characters anyway).
"""

from __future__ import annotations

from dapo_cli.rewards.bounds import scorable
from dapo_cli.rewards.math_dapo import INVALID, ScoreResult, make_result

BOX_WINDOW_CHARS = 100
"""Only the last 100 code points are searched for a box (as released)."""

BOX_OPEN = "\\boxed{"


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{`` in ``text`` up to its matching ``}``, or None.

    Only the last occurrence of ``\\boxed{`` is considered; braces are counted from
    its ``{`` (every ``{`` opens, every ``}`` closes, no escapes). Linear time.
    """
    start = text.rfind(BOX_OPEN)
    if start < 0:
        return None
    depth = 0
    for i in range(start + len(BOX_OPEN) - 1, len(text)):
        char = text[i]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(BOX_OPEN) : i]
    return None


def compute_score(response: str, ground_truth: str) -> ScoreResult:
    """Score one response: the last balanced box of the final 100 characters must equal ``ground_truth``."""
    boxed = last_boxed_content(response[-BOX_WINDOW_CHARS:])
    pred = INVALID if boxed is None else boxed
    return make_result(scorable(ground_truth) and pred == ground_truth, pred)
