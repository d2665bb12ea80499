"""The mechanisms table and Δ at equal generated samples, on hand-made child results (values derived by hand)."""

from __future__ import annotations

import math

import pytest

from dapo_cli.ablate.mechanisms import (
    SAMPLES_SLACK,
    cumulative_samples,
    equal_samples_delta,
    equal_samples_step,
    mechanism_row,
    mechanism_table_rows,
    mechanisms_markdown,
    steps_text,
    total_samples,
    window_mean,
)
from dapo_cli.ablate.results import VAL_CURVE, AblationReport, ChildResult, EqualSamples, VariantRow
from dapo_cli.eval.compare import compare_accuracies


def child(seed: int = 0, *, steps: int = 0, samples_per_step: float | None = None, val_steps: tuple[int, ...] = (),
          variant: str = "v", tables: dict[int, dict[str, float]] | None = None, **curves: dict[int, float]) -> ChildResult:
    """A finished child: ``samples_per_step`` generated at each of ``steps`` steps, validations at ``val_steps``;
    ``curves`` by metric name with ``/`` spelled ``__`` (``actor__entropy``)."""
    tables = tables or {}
    final = max(val_steps) if val_steps else steps
    named = {k.replace("__", "/"): v for k, v in curves.items()}
    if samples_per_step is not None:
        named["train/samples_generated"] = {s: samples_per_step for s in range(1, steps + 1)}
    named[VAL_CURVE] = {s: 0.5 for s in val_steps}
    return ChildResult(run_id=f"run{seed}", variant=variant, seed=seed, k=4, final_step=final, avg=0.5, stderr=0.1,
                       per_problem=tables.get(final, {}), curves=named,
                       tables={s: t for s, t in tables.items() if s != final})


def vrow(results: list[ChildResult], *, truncated: float = math.nan, position: int = 1, name: str = "v") -> VariantRow:
    samples = sum(total_samples(r) for r in results) / len(results)
    return VariantRow(position=position, name=name, label="+ Something", paper=None, seeds=[r.seed for r in results],
                      avgs=[r.avg for r in results], mean=0.5, seed_half=math.nan, problem_half=0.1,
                      shares={"truncated": truncated, "kept_groups": math.nan}, samples=samples,
                      final_steps=[r.final_step for r in results])


# ---------------------------------------------------------------- mechanisms


def test_mechanism_numbers_per_child_then_mean_over_seeds() -> None:
    # seed 0, 12 steps: entropy .50, .48, ..., .28 (−.02 a step); a step-0 value is not a training step
    ent0 = {0: 9.9, **{s: 0.5 - 0.02 * (s - 1) for s in range(1, 13)}}
    # seed 0 kept groups over 25 steps: .8 for steps 1..10, .5 for 11..15, .2 for 16..25
    kept0 = {s: 0.8 if s <= 10 else 0.5 if s <= 15 else 0.2 for s in range(1, 26)}
    a = child(0, steps=25, samples_per_step=16.0, actor__entropy=ent0,
              actor__clipfrac_high={1: 0.001, 2: 0.003},
              overlong__truncated_on_correct_path_frac={2: 0.5, 5: 1.0},  # only steps with a truncated response
              overlong__truncated_looping_frac={2: 0.25, 5: math.nan},  # a non-finite value is dropped
              response_length__group_std_mean={1: 10.0, 2: 20.0}, response_length__mean={1: 100.0, 2: 300.0},
              overlong__truncated_frac={s: 0.3 if s <= 10 else 0.0 for s in range(1, 26)},
              train__kept_group_frac=kept0)
    # seed 1: constant entropy .2 over 3 steps (fewer than 10: each window is one step); never truncated
    b = child(1, steps=25, samples_per_step=16.0, actor__entropy={1: 0.2, 2: 0.2, 3: 0.2},
              actor__clipfrac_high={1: 0.004}, response_length__group_std_mean={1: 40.0},
              response_length__mean={1: 100.0}, train__kept_group_frac={1: 0.6})
    m = mechanism_row(vrow([a, b], truncated=0.125), [a, b])
    # entropy seed 0: start (.50 + .48 + .46 + .44 + .42) / 5 = .46; end (.36 + .34 + .32 + .30 + .28) / 5 = .32
    # mean over seeds: start (.46 + .2) / 2 = .33, end (.32 + .2) / 2 = .26
    assert window_mean(ent0, 5) == pytest.approx(0.46) and window_mean(ent0, 5, last=True) == pytest.approx(0.32)
    assert (m.entropy_start, m.entropy_end) == (pytest.approx(0.33), pytest.approx(0.26))
    assert m.clip_high == pytest.approx((0.002 + 0.004) / 2)  # seed 0 mean .002, seed 1 .004
    assert math.isnan(m.clip_low)  # never logged
    # truncated with the answer: seed 0 mean of its logged steps (.5 + 1) / 2 = .75; seed 1 has no value
    assert m.truncated_on_path == pytest.approx(0.75) and m.truncated_looping == pytest.approx(0.25)
    # truncated: seed 0 .3 for steps 1..10, then 0 → early .3, late 0; seed 1 never logged it
    assert (m.truncated_early, m.truncated_late) == (pytest.approx(0.3), pytest.approx(0.0))
    # length spread: seed 0 logged steps 1, 2 only (each window at most half of them: one step) → early 10,
    # late 20; seed 1 one step, 40 in both → early (10 + 40) / 2 = 25, late (20 + 40) / 2 = 30
    assert (m.spread_early, m.spread_late) == (pytest.approx(25.0), pytest.approx(30.0))
    assert m.length_mean == pytest.approx((200.0 + 100.0) / 2)
    # informative: seed 0 early .8, late .2; seed 1 (one step) .6 both → early .7, late .4
    assert (m.informative_early, m.informative_late) == (pytest.approx(0.7), pytest.approx(0.4))
    assert m.samples == 400.0 and m.seeds == 2  # 16 × 25 each
    report = AblationReport(parent_run_id="p", name="n", mode="ladder", tags={}, k=4, rows=[], children=[a, b], mechanisms=[m])
    cells = mechanism_table_rows(report)[0]
    assert cells == {
        "rung": "1", "variant": "v", "paper row": "+ Something",
        "entropy start→end (nats/token)": "0.330→0.260",
        "clip high %": "0.30", "clip low %": "—", "masked %": "—",
        "truncated % early→late": "30.0→0.0", "truncated on a correct path %": "75.0", "truncated looping %": "25.0",
        "length spread early→late (tokens)": "25.0→30.0", "length (tokens)": "150.0",
        "informative groups % early→late": "70.0→40.0", "samples": "400",
    }


def test_the_clip_columns_read_each_childs_own_loss_and_the_masked_share_its_correction() -> None:
    # a GSPO child logs its clip per response, a CISPO child its capped weights: each shows under "clip high %";
    # seed 0 (gspo) .10 and .30 -> .2; seed 1 (cispo) .4 -> mean over seeds .3; masked: seed 0 .5, seed 1 none -> .5
    a = child(0, steps=2, actor__seq_clipfrac_high={1: 0.1, 2: 0.3}, rollout__masked_seq_frac={1: 0.5, 2: 0.5})
    b = child(1, steps=2, actor__is_clipfrac_high={1: 0.4}, actor__is_clipfrac_low={1: 0.0})
    m = mechanism_row(vrow([a, b]), [a, b])
    assert m.clip_high == pytest.approx(0.3) and m.clip_low == pytest.approx(0.0) and m.masked == pytest.approx(0.5)


def test_a_variant_that_never_logged_a_diagnostic_shows_dashes() -> None:
    bare = child(0, steps=3)  # no training metric at all (and no samples)
    m = mechanism_row(vrow([bare]), [bare])
    report = AblationReport(parent_run_id="p", name="n", mode="grid", tags={}, k=4, rows=[], children=[bare], mechanisms=[m])
    cells = mechanism_table_rows(report)[0]
    assert {h: v for h, v in cells.items() if h not in ("rung", "variant", "paper row")} == dict.fromkeys(
        [h for h in cells if h not in ("rung", "variant", "paper row")], "—")
    md = "\n".join(mechanisms_markdown(report))
    assert "## Mechanisms (what each technique acts on)" in md and "| 1 | v (+ Something) | — |" in md
    assert "- **entropy start→end (nats/token)**: clip-higher" in md and "- **informative groups % early→late**: dynamic sampling" in md
    assert mechanisms_markdown(AblationReport(parent_run_id="p", name="n", mode="grid", tags={}, k=4, rows=[], children=[])) == []


# ---------------------------------------------------------------- Δ at equal generated samples


def test_the_budget_takes_a_dynamic_sampling_child_at_half_its_steps() -> None:
    # plain: 16 samples × 100 steps = 1600; dynamic sampling: 32 × 100 = 3200; validations at 0, 50, 100
    plain = child(0, steps=100, samples_per_step=16.0, val_steps=(0, 50, 100), variant="plain")
    ds = child(0, steps=100, samples_per_step=32.0, val_steps=(0, 50, 100), variant="ds")
    assert total_samples(plain) == 1600 and total_samples(ds) == 3200
    assert (cumulative_samples(ds, 0), cumulative_samples(ds, 50)) == (0, 1600)
    # budget min(1600, 3200) = 1600, limit 1680: ds at 50 (1600 ≤ 1680; 3200 is over), plain at its end
    assert equal_samples_step(ds, 1600) == 50 and equal_samples_step(plain, 1600) == 100
    assert equal_samples_step(ds, 700) == 0  # only step 0 (0 samples) fits
    # two seeds of the ds variant, one with a validation only at 100: its step 0 is the one within the budget
    ds_late = child(1, steps=100, samples_per_step=32.0, val_steps=(0, 100), variant="ds")
    # budget = min(mean(3200, 3200), 1600) = 1600
    tables = {("ds", 0, 50): {"a": 1.0, "b": 0.5}, ("ds", 1, 0): {"a": 0.0, "b": 0.5}, ("plain", 0, 100): {"a": 0.25, "b": 0.25}}
    loaded = []

    def load(c: ChildResult, step: int) -> dict[str, float]:
        loaded.append((c.variant, c.seed, step))
        return tables[(c.variant, c.seed, step)]

    eq = equal_samples_delta([ds, ds_late], [plain], "plain", load)
    assert (eq.vs, eq.budget, eq.steps, eq.ref_steps) == ("plain", 1600, [50, 0], [100])
    assert loaded == [("ds", 0, 50), ("ds", 1, 0), ("plain", 0, 100)]  # only the tables used
    # ds per problem over seeds: a (1 + 0) / 2 = .5, b .5; plain .25, .25 → Δ = .25 on both problems
    assert eq.delta.diff == pytest.approx(0.25) and (eq.delta.ci_low, eq.delta.ci_high) == (pytest.approx(0.25), pytest.approx(0.25))
    assert steps_text(eq.steps) == "@50/0" and steps_text(eq.ref_steps) == "@100"


def test_five_percent_slack_keeps_the_final_step_of_a_nearly_equal_run() -> None:
    # the plain run: 16 × 100 = 1600 samples, the budget
    # 4% more samples (16.64 × 100 = 1664 ≤ 1600 × 1.05 = 1680): still its final step
    near = child(0, steps=100, samples_per_step=16.64, val_steps=(0, 50, 100))
    # 6% more (1696 > 1680): its last validation within the budget is step 50 (848 samples)
    over = child(0, steps=100, samples_per_step=16.96, val_steps=(0, 50, 100))
    assert SAMPLES_SLACK == 0.05
    assert equal_samples_step(near, 1600) == 100 and equal_samples_step(over, 1600) == 50


def test_equal_samples_delta_is_the_equal_steps_delta_when_samples_match() -> None:
    a_tab, b_tab = {"1": 1.0, "2": 0.5, "3": 0.0}, {"1": 0.5, "2": 0.5, "3": 0.25}
    a = child(0, steps=10, samples_per_step=16.0, val_steps=(0, 10), tables={10: a_tab, 0: {"1": 0.0}})
    b = child(0, steps=10, samples_per_step=16.0, val_steps=(0, 10), tables={10: b_tab, 0: {"1": 0.0}})
    eq = equal_samples_delta([a], [b], "b", lambda c, s: c.per_problem if s == c.final_step else c.tables[s])
    assert eq.steps == [10] and eq.ref_steps == [10]
    assert eq.delta == compare_accuracies(a_tab, b_tab).comparison  # the same bootstrap on the same tables


def test_no_samples_logged_means_no_equal_samples_delta() -> None:
    a = child(0, steps=10, samples_per_step=16.0, val_steps=(0, 10))
    bare = child(0, steps=10, val_steps=(0, 10))
    assert equal_samples_delta([a], [bare], "b", lambda c, s: {}) is None
    assert equal_samples_delta([bare], [a], "a", lambda c, s: {}) is None
    # samples but tables that share no problem: steps shown, no Δ
    eq = equal_samples_delta([a], [a], "a", lambda c, s: {})
    assert eq == EqualSamples(vs="a", budget=160.0, steps=[10], ref_steps=[10], delta=None)


def test_steps_text() -> None:
    assert steps_text([50, 50]) == "@50" and steps_text([50, 50, 100]) == "@50/50/100" and steps_text([]) == "—"
