"""The sequential rule (``ablate/sequential.py``): its error rate under repeated looks and its savings, by simulation
of the paired by-seed differences themselves (pure math, no training)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from dapo_cli.ablate.sequential import (
    decide,
    look_levels,
    needed_variants,
    plan_text,
    spent,
    wave_sizes,
)

LOOKS = [3, 4, 5, 6, 8]  # up to 5 looks, at most 8 seeds


def simulate(delta: float, sd: float, looks: list[int], draws: int, seed: int, equivalence: float = 0.0):
    """Vectorised: ``draws`` ablations of one comparison; each looks at its first n_k differences with the rule's
    levels. Returns (share declared different, mean seeds used)."""
    d = np.random.default_rng(seed).normal(delta, sd, size=(draws, looks[-1]))
    open_ = np.ones(draws, bool)
    different = np.zeros(draws, bool)
    used = np.full(draws, looks[-1])
    for n, level in zip(looks, look_levels(looks)):
        x = d[:, :n]
        mean, se = x.mean(1), x.std(1, ddof=1) / math.sqrt(n)
        half = sps.t.ppf(1 - level / 2, n - 1) * se
        diff = open_ & (np.abs(mean) > half)
        equiv = open_ & ~diff & (equivalence > 0) & (mean - half > -equivalence) & (mean + half < equivalence)
        different |= diff
        used[diff | equiv] = n
        open_ &= ~(diff | equiv)
    return different.mean(), used.mean()


def test_spending_by_hand() -> None:
    # α(1) = α; α(1/4) = 2 − 2Φ(1.96 · 2) = 2 − 2Φ(3.92) ≈ 8.9e-5: O'Brien–Fleming spends almost nothing early
    assert spent(1.0) == pytest.approx(0.05, abs=1e-12)
    assert spent(0.25) == pytest.approx(2 * sps.norm.sf(2 * sps.norm.ppf(0.975)), rel=1e-12)
    assert spent(0.25) < 1e-4 and spent(0.0) == 0.0
    levels = look_levels(LOOKS)
    assert sum(levels) == pytest.approx(0.05, abs=1e-12) and all(a > 0 for a in levels)
    # 3 + round(i · 5/4), i = 0..4: 3, 4 (1.25), 5 (2.5 rounds to even), 7 (3.75), 8
    assert wave_sizes(3, 8) == [3, 4, 5, 7, 8] and wave_sizes(3, 3) == [3] and wave_sizes(2, 4) == [2, 3, 4]
    with pytest.raises(ValueError):
        wave_sizes(1, 6)


@pytest.mark.slow
def test_no_true_difference_keeps_false_differents_at_5_percent_over_5_looks() -> None:
    draws = 4000
    share, _ = simulate(0.0, 15.9, LOOKS, draws, seed=0)
    # 5% plus two simulation standard errors sqrt(.05 · .95 / 4000) = .0034
    assert share <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / draws)
    # the naive rule (5% at every look) is what the spending prevents: it exceeds 5% clearly
    d = np.random.default_rng(0).normal(0.0, 15.9, size=(draws, LOOKS[-1]))
    naive = np.zeros(draws, bool)
    for n in LOOKS:
        x = d[:, :n]
        naive |= np.abs(x.mean(1)) > sps.t.ppf(0.975, n - 1) * x.std(1, ddof=1) / math.sqrt(n)
    assert naive.mean() > 0.08


@pytest.mark.slow
def test_a_true_difference_stops_earlier_than_the_fixed_design() -> None:
    # Δ = 2 sd: the fixed design runs 8 seeds every time; the rule stops at the first look it can decide
    share, mean_used = simulate(31.8, 15.9, LOOKS, 2000, seed=1)
    assert mean_used < 8 - 1 and share > 0.8
    # equivalence: no difference, δ = 1.5 sd: some ablations end early as `equivalent`, none declared different more
    # often than α
    share0, used0 = simulate(0.0, 10.0, LOOKS, 2000, seed=2, equivalence=15.0)
    assert used0 < 8 and share0 <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 2000)


def test_decide_and_the_variants_an_open_comparison_needs() -> None:
    # +9.5, +2.0, +32.5 (DAPO − GRPO on the real model) at a 5% look: mean 14.67, sd 15.88, t(.975, 2) = 4.3027
    # half = 4.3027 · 15.89/√3 = 39.5 > 14.67 → open
    sd = math.sqrt(((9.5 - 44 / 3) ** 2 + (2 - 44 / 3) ** 2 + (32.5 - 44 / 3) ** 2) / 2)
    d = decide([9.5, 2.0, 32.5], 1, 0.05, 3.0)
    assert d.verdict == "open" and d.half == pytest.approx(sps.t.ppf(0.975, 2) * sd / math.sqrt(3), rel=1e-12)
    # −27.5, −10.0, −17.5 (soft punishment): mean −18.33, sd 8.78, half 21.8 at 5% → still open at 3 seeds
    assert decide([-27.5, -10.0, -17.5], 1, 0.05, 3.0).verdict == "open"
    assert decide([-20.0, -21.0, -19.0, -20.5], 2, 0.05, 3.0).verdict == "different"
    assert decide([0.1, -0.1, 0.2, -0.2, 0.0], 3, 0.05, 3.0).verdict == "equivalent"
    comparisons = [("b", "a"), ("c", "b"), ("c", "a")]
    verdicts = {("b", "a"): decide([-20.0, -21.0, -19.0, -20.5], 2, 0.05, 3.0),
                ("c", "b"): decide([0.1, -0.1, 0.2, -0.2, 0.0], 3, 0.05, 3.0),
                ("c", "a"): decide([9.5, 2.0, 32.5], 1, 0.05, 3.0)}
    assert needed_variants(comparisons, verdicts) == ["c", "a"]


def test_the_dry_run_plan_names_the_rule_levels_and_worst_case() -> None:
    text = plan_text(["grpo", "dapo"], [("dapo", "grpo")], wave_sizes(3, 6), 3.0, child_minutes=10)
    assert "Lan–DeMets" in text and "O'Brien–Fleming" in text
    assert "worst case (nothing decided before the last look): 12 children (2 variants x 6 seeds), ~2.0 h" in text
    assert "best case: 6 children" in text and "dapo − grpo" in text
    # the spent column ends at α
    assert text.splitlines()[-3].endswith("0.05000")


def test_run_waves_adds_seeds_only_where_a_comparison_is_open() -> None:
    from dapo_cli.ablate.sequential import run_waves, waves_text

    # b − a: a large, steady gain (decided early); c − b: ±20 alternating around 0 (open at every look)
    rng = np.random.default_rng(0)
    truth = {("b", "a"): rng.normal(40.0, 1.0, 8), ("c", "b"): np.array([20.0, -20.0] * 4)}  # c − b: mean 0, sd ~21
    trained: list[tuple[int, list[str], int]] = []
    seen = {"n": 0}

    def train_wave(n: int, names: list[str], before: int) -> None:
        trained.append((n, list(names), before))
        seen["n"] = n

    waves = run_waves(["a", "b", "c"], [("b", "a"), ("c", "b")], LOOKS, 3.0, train_wave,
                      lambda v, vs: list(truth[v, vs][:seen["n"]]))
    assert trained[0] == (3, ["a", "b", "c"], 0)
    first_decided = next(w for w in waves if w.decisions["b", "a"].verdict == "different")
    later = [t for t in trained if t[2] >= first_decided.seeds]
    assert later and all(names == ["c", "b"] for _, names, _ in later)  # a gets no more seeds
    text = waves_text(waves, fixed_children=3 * 8, equivalence=3.0)
    assert f"b − a: different at wave {first_decided.look}" in text and "against 24 for the fixed design" in text
    assert waves[-1].decisions["c", "b"].verdict == "open"  # sd ~21 over 8 seeds: an interval far wider than ±3
    assert "stopped at the last look (8 seeds, --max-seeds) with 1 of 2 comparisons open" in text


def test_the_stop_line_says_why_the_waves_ended() -> None:
    from dapo_cli.ablate.sequential import Decision, Wave, stop_line

    decided = Decision("different", 2, 4, 7.3, 6.3)
    still = Decision("open", 4, 6, -0.2, 6.5)
    assert stop_line([Wave(2, 4, ["a", "b"], {("b", "a"): decided})], 3.0) == "stopped at wave 2: every comparison decided"
    assert stop_line([Wave(4, 6, ["a", "b", "c"], {("b", "a"): decided, ("c", "b"): still})], 3.0) == (
        "stopped at the last look (6 seeds, --max-seeds) with 1 of 2 comparisons open: each interval at that look's "
        "level holds 0 and reaches past ±3 points; the report's Power section gives the seeds each would need")


def test_a_report_replays_the_runs_waves_from_the_children_and_the_recorded_setup() -> None:
    from dapo_cli.ablate.sequential import Setup, comparison_pairs, decision_rows, replay, run_waves, wave_rows

    # a 3-rung ladder: b − a a steady +40, c − b and c − a noise: the run trains only what stays open
    rng = np.random.default_rng(1)
    level = {"a": rng.normal(20.0, 1.0, 8), "b": rng.normal(60.0, 1.0, 8), "c": rng.normal(60.0, 20.0, 8)}
    seeds = tuple(range(10, 18))  # seeds need not start at 0: look k reads the first looks[k] of them
    avg: dict[tuple[str, int], float] = {}
    now = {"n": 0}

    def train_wave(n: int, names: list[str], before: int) -> None:
        now["n"] = n
        for v in names:
            for j in range(before, n):
                avg[v, seeds[j]] = float(level[v][j])

    def diffs_of(v: str, vs: str) -> list[float]:
        return [avg[v, s] - avg[vs, s] for s in seeds[:now["n"]] if (v, s) in avg and (vs, s) in avg]

    names = ["a", "b", "c"]
    run = run_waves(names, comparison_pairs(names, True), LOOKS, 3.0, train_wave, diffs_of)
    setup = Setup.from_tag(Setup(seeds, tuple(LOOKS), 3.0, True).to_tag())
    assert setup is not None and setup.seeds == seeds
    again = replay(setup, names, avg)  # only the children the run trained
    assert [(w.look, w.seeds, w.trained) for w in again] == [(w.look, w.seeds, w.trained) for w in run]
    assert decision_rows(again) == decision_rows(run)
    assert len(run) > 1 and run[-1].trained != names  # some variant stopped getting seeds
    rows = wave_rows(again, setup, 3)
    # children so far: 3 variants at the first look, then (n_k − n_{k−1}) per variant trained
    expect, total = [], 0
    for i, w in enumerate(run):
        total += (w.seeds - (run[i - 1].seeds if i else 0)) * len(w.trained)
        expect.append(f"{total} of 24")
    assert [r["children so far"] for r in rows] == expect and total == len(avg)


@pytest.mark.parametrize("tag", ["", "not json", '{"seeds": [0, 1], "looks": [3], "equivalence": 3, "ladder": true}',
                                 '{"looks": [3]}', '{"seeds": "x", "looks": [2], "equivalence": 1, "ladder": 0}'])
def test_a_setup_tag_that_is_missing_or_malformed_gives_no_sequential_section(tag: str) -> None:
    from dapo_cli.ablate.sequential import Setup

    assert Setup.from_tag(tag) is None


def test_with_an_axis_rungs_are_compared_within_their_setting_and_each_variant_with_its_twin() -> None:
    from dapo_cli.ablate.sequential import comparison_pairs

    # issue 49's run: the ladder at adv_estimator=grpo, and the soft-punishment rung and DAPO also at dr_grpo
    g, d = "@adv_estimator=grpo", "@adv_estimator=dr_grpo"
    names = [f"grpo{g}", f"ovf{g}", f"soft{g}", f"soft{d}", f"dapo{g}", f"dapo{d}"]
    assert comparison_pairs(names, True) == [
        (f"ovf{g}", f"grpo{g}"), (f"soft{g}", f"ovf{g}"), (f"dapo{g}", f"soft{g}"),  # rung to the previous rung
        (f"soft{g}", f"grpo{g}"), (f"dapo{g}", f"grpo{g}"),                          # rung to the first
        (f"dapo{d}", f"soft{d}"),                                                    # the dr_grpo rungs among themselves
        (f"soft{d}", f"soft{g}"), (f"dapo{d}", f"dapo{g}"),                          # each with its twin
    ]
    # a grid with an axis: each against the first of its setting, then the twins; a twin that does not run is no pair
    assert comparison_pairs([f"a{g}", f"a{d}", f"b{g}"], False) == [(f"b{g}", f"a{g}"), (f"a{d}", f"a{g}")]
    assert comparison_pairs([f"a{g}", f"b{g}", f"b{d}"], False) == [(f"b{g}", f"a{g}"), (f"b{d}", f"b{g}")]
    # no axis: as before
    assert comparison_pairs(["a", "b", "c"], True) == [("b", "a"), ("c", "b"), ("c", "a")]


def test_a_report_of_a_run_in_progress_shows_its_wave_pending_not_decided() -> None:
    from dapo_cli.ablate.sequential import Setup, decision_rows, replay, stop_line, wave_rows

    setup = Setup(seeds=(0, 1, 2, 3, 4), looks=(3, 5), equivalence=3.0, ladder=True)
    # seed 0 of both variants and seed 1 of one finished: 3 of the first wave's 6 children
    avg = {("a", 0): 20.0, ("b", 0): 60.0, ("a", 1): 21.0}
    [wave] = replay(setup, ["a", "b"], avg)
    assert (wave.look, wave.seeds, wave.pending) == (1, 3, 3)
    assert [r["decision"] for r in decision_rows([wave])] == ["open"]  # nothing decided before the wave is whole
    assert stop_line([wave], 3.0).startswith("in progress: wave 1 (3 seeds) has 3 of 6 children finished")
    assert wave_rows([wave], setup, 2)[0]["wave"] == "1 (in progress)" and wave_rows([wave], setup, 2)[0]["children so far"] == "3 of 10"
    # the first wave whole and far apart: decided at wave 1 (b − a = +40 on every seed: sd 0), no wave pending
    whole = {**avg, ("b", 1): 61.0, ("a", 2): 19.0, ("b", 2): 59.0}
    waves = replay(setup, ["a", "b"], whole)
    assert [w.pending for w in waves] == [0] and decision_rows(waves)[0]["decision"] == "different"
