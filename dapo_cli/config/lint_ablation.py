"""``dapo lint`` rules about ablations (registered into :data:`dapo_cli.config.lint_base.RULES` after the other
rules: :mod:`dapo_cli.config.lint` imports this module last).

``dapo report`` fits each child's validation curve to a saturating form of three parameters
(:mod:`dapo_cli.ablate.curves`, ``docs/ablation-statistics.md``); the fit needs :data:`CURVE_FIT_POINTS`
validations, step 0 included.
"""

from __future__ import annotations

from dapo_cli.config.lint_base import WARN, Finding, rule
from dapo_cli.config.schema import Config

CURVE_FIT_POINTS = 5
"""Validations a curve fit needs (the same number as :data:`dapo_cli.ablate.curves.MIN_POINTS`; config must not
import the ablation manager)."""


def validation_steps(total_steps: int, test_freq: int) -> list[int]:
    """The steps a run validates at: step 0, every ``test_freq`` steps (``<= 0``: none between), and the last."""
    between = range(test_freq, total_steps, test_freq) if test_freq > 0 else range(0)
    return sorted({0, *between, total_steps})


@rule("curve-fit-points")
def curve_fit_points(cfg: Config) -> list[Finding]:
    """An ablation (``ablate.seeds > 1``) whose validation schedule gives each child fewer than
    :data:`CURVE_FIT_POINTS` validations: ``dapo report`` cannot fit its curves (A, B, C_mid are ``not identified:
    too few points``). Warning."""
    steps = validation_steps(cfg.trainer.total_steps, cfg.trainer.test_freq)
    if cfg.ablate.seeds <= 1 or len(steps) >= CURVE_FIT_POINTS:
        return []
    freq = max(1, cfg.trainer.total_steps // (CURVE_FIT_POINTS - 1))
    return [Finding(
        WARN, "trainer.test_freq",
        f"each child validates {len(steps)} times (steps {', '.join(map(str, steps))}): a curve fit needs "
        f"{CURVE_FIT_POINTS}, so dapo report cannot fit the ablation's curves",
        f"set trainer.test_freq={freq} (validations at {', '.join(map(str, validation_steps(cfg.trainer.total_steps, freq)))})",
    )]
