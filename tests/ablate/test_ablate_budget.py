"""Δ at equal budget read from interpolated curves (``ablate/budget.py``): a hand-built pair of children."""

from __future__ import annotations

import pytest

from dapo_cli.ablate.budget import budget_curve, budget_rows, equal_budget, read_at
from dapo_cli.ablate.results import ChildResult


def child(variant: str, seed: int, val: dict[int, float], per_step: float, steps: int = 8) -> ChildResult:
    curves = {"val/avg_at_k": val, "train/samples_generated": {s: per_step for s in range(1, steps + 1)},
              "compute/flops": {s: 10.0 * per_step for s in range(1, steps + 1)}}
    return ChildResult(f"{variant}{seed}", variant, seed, 2, steps, val[steps], 0.0, {}, curves)


def test_interpolated_delta_at_equal_samples_by_hand() -> None:
    # DAPO generates 128 samples a step (dynamic sampling's extra rounds), GRPO 64; validations at 0, 4, 8.
    dapo = child("dapo", 0, {0: 0.10, 4: 0.50, 8: 0.60}, 128.0)  # budgets 0, 512, 1024
    grpo = child("grpo", 0, {0: 0.10, 4: 0.30, 8: 0.40}, 64.0)  # budgets 0, 256, 512
    # common budget: min(1024, 512) = 512 = DAPO's step-4 validation (.50) and GRPO's step 8 (.40): Δ = +.10
    e = equal_budget("dapo", [dapo], "grpo", [grpo])
    (p,) = e.pairs
    assert p.budget == 512.0 and p.variant.steps == (4, 4) and p.ref.steps == (8, 8)
    assert p.delta == pytest.approx(0.10, abs=1e-12)
    # seed 1: DAPO 96 a step (0, 384, 768), GRPO 64 (0, 256, 512); budget 512 lies between DAPO's steps 4 and 8:
    # .40 + (.70 − .40)·(512 − 384)/(768 − 384) = .40 + .30/3 = .50; GRPO at its step 8: .45 → Δ = +.05
    dapo1 = child("dapo", 1, {0: 0.10, 4: 0.40, 8: 0.70}, 96.0)
    grpo1 = child("grpo", 1, {0: 0.10, 4: 0.35, 8: 0.45}, 64.0)
    e = equal_budget("dapo", [dapo, dapo1], "grpo", [grpo, grpo1])
    assert [p.delta for p in e.pairs] == [pytest.approx(0.10, abs=1e-12), pytest.approx(0.05, abs=1e-12)]
    assert e.pairs[1].variant.steps == (4, 8) and e.pairs[1].variant.value == pytest.approx(0.50, abs=1e-12)
    assert e.mean == pytest.approx(0.075, abs=1e-12)
    (row,) = budget_rows([e])
    assert row["Δ %"] == "+7.5" and row["budget per seed"] == "512, 512" and row["steps read (variant; vs)"] == "4; 8, 4–8; 8"


def test_other_axes_and_edges() -> None:
    dapo = child("dapo", 0, {0: 0.1, 4: 0.5, 8: 0.6}, 128.0)
    assert budget_curve(dapo, "FLOPs")[1] == [0.0, 5120.0, 10240.0] and budget_curve(dapo, "steps")[1] == [0.0, 4.0, 8.0]
    assert budget_curve(dapo, "trained tokens") == ([], [], [])  # not logged (a run before the compute axis)
    assert read_at([0, 4], [0.0, 10.0], [0.1, 0.3], 11.0) is None  # no extrapolation
    assert read_at([0, 4], [0.0, 10.0], [0.1, 0.3], 0.0).steps == (0, 0)
    assert equal_budget("dapo", [dapo], "grpo", []) is None
