"""The report: every number recomputed from MLflow (hand-derived values below), tampering shows through,
figures and report files; plus the pure statistics it uses."""

from __future__ import annotations

import json
import math
from statistics import NormalDist
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

sys.path.insert(0, str(Path(__file__).parent))

from ablate_fakes import FakeTrain  # noqa: E402

from dapo_cli.ablate.variants import LADDER_NAMES, make_ablation  # noqa: E402
from dapo_cli.ablate.plots import cumulative, mean_curve  # noqa: E402
from dapo_cli.ablate.report import build_report, summary_metrics, table_rows, write_report  # noqa: E402
from dapo_cli.ablate.results import CURVE_METRICS  # noqa: E402
from dapo_cli.ablate.stats import mean_per_problem, seed_interval, t_critical_95  # noqa: E402
from dapo_cli.ablate.store import resolve_parent  # noqa: E402
from dapo_cli.ablate.runner import run_ablation  # noqa: E402
from dapo_cli.config.load import build_config  # noqa: E402

T975_1 = math.tan(0.475 * math.pi)  # t(0.975, 1): the Cauchy quantile tan(π(p − ½)) = 12.7062
Z975 = NormalDist().inv_cdf(0.975)  # 1.959964
from dapo_cli.errors import UserError  # noqa: E402

pytestmark = pytest.mark.slow  # every test reads one ablation that a module fixture trains (tens of seconds)

A, B = "grpo", "grpo+overlong_filtering"
# correct answers out of K = 4 on 5 problems
CORRECT = {
    (A, 0): [4, 2, 0, 4, 1],  # acc [1, .5, 0, 1, .25]   avg .55
    (A, 1): [2, 2, 0, 4, 1],  # acc [.5, .5, 0, 1, .25]  avg .45
    (B, 0): [4, 4, 0, 4, 1],  # acc [1, 1, 0, 1, .25]    avg .65
    (B, 1): [4, 2, 2, 4, 1],  # acc [1, .5, .5, 1, .25]  avg .65
}


def record_ladder(tmp: Path, experiment: str, steps: int, only: list[str], seeds: int, fake: FakeTrain, *, html: bool = False):
    """Record a ladder of the ``only`` rungs × ``seeds`` with the fake trainer in ``tmp``; returns (client, plan, outcome)."""
    cfg = build_config(None, [f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}", f"tracking.experiment={experiment}",
                              f"trainer.output_dir={tmp / 'runs'}", f"trainer.total_steps={steps}", "validation.k=4"])
    plan = make_ablation(cfg, mode="ladder", only=only, seeds=seeds)
    outcome = run_ablation(plan, command="dapo ablate --ladder", config_path=None, train=fake, html=html)
    return MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}"), plan, outcome


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    """A two-rung ladder × 2 seeds recorded by the fake trainer; returns (client, parent run, tmp dir, plan)."""
    tmp = tmp_path_factory.mktemp("report")
    client, plan, outcome = record_ladder(tmp, "abl", 3, [A, B], 2, FakeTrain(CORRECT), html=True)
    return client, client.get_run(outcome.parent_run_id), tmp, plan, outcome


@pytest.mark.slow
def test_table_is_recomputed_from_the_children(store) -> None:
    client, parent, _, _, _ = store
    report = build_report(client, parent)
    assert report.k == 4 and report.mode == "ladder" and report.missing == [] and report.unfinished == []
    a, b = report.rows
    assert (a.name, a.label, a.paper, b.label, b.paper) == (A, "Naive GRPO", 30.0, "+ Overlong Filtering", 36.0)
    assert a.seeds == [0, 1] and a.final_steps == [3, 3]
    # A: mean(.55, .45) = .5; sd = sqrt((.05² + .05²)/1) = .0707107; t(0.975, 1) = 12.706
    #    half = 12.706 · .0707107 / sqrt 2 = 12.706 · .05 = .6353
    assert a.mean == pytest.approx(0.5, abs=1e-12)
    assert a.seed_half == pytest.approx(T975_1 * 0.05, abs=1e-9)
    # stderr seed 0: acc [1,.5,0,1,.25], mean .55, Σdev² = .8, s² = .2, se = sqrt(.2/5) = .2
    # stderr seed 1: acc [.5,.5,0,1,.25], mean .45, Σdev² = .55, s² = .1375, se = sqrt(.1375/5) = .1658312
    assert a.problem_half == pytest.approx(Z975 * (0.2 + math.sqrt(0.1375 / 5)) / 2, abs=1e-9)
    # B: .65 both seeds → half-width 0; se seed 0: Σdev² = .95 → sqrt(.2375/5); seed 1: Σdev² = .45 → sqrt(.1125/5) = .15
    assert b.mean == pytest.approx(0.65, abs=1e-12) and b.seed_half == pytest.approx(0.0, abs=1e-12)
    assert b.problem_half == pytest.approx(Z975 * (math.sqrt(0.2375 / 5) + 0.15) / 2, abs=1e-9)
    # Δ B − A, paired over problems on seed-averaged accuracy:
    #   A = [.75, .5, 0, 1, .25], B = [1, .75, .25, 1, .25], d = [.25, .25, .25, 0, 0], mean .15
    #   a resample of 5 problems holds X ~ Bin(5, .6) of the .25s: P(X = 0) = .4^5 = .01024 < .025 < P(X <= 1)
    #   → 2.5% quantile .05; P(X = 5) = .6^5 = .078 > .025 → 97.5% quantile .25; P(mean > 0) = 1 − .01024
    assert a.delta is None and b.delta_vs == A
    assert b.delta.diff == pytest.approx(0.15, abs=1e-12)
    assert (b.delta.ci_low, b.delta.ci_high) == (pytest.approx(0.05, abs=1e-12), pytest.approx(0.25, abs=1e-12))
    assert b.delta.share_positive == pytest.approx(1 - 0.4**5, abs=0.006)
    # shares: fake truncated_frac = .1 · step over steps 1..3 → .2; kept .25; 16 samples × 3 steps
    assert a.shares == {"truncated": pytest.approx(0.2, abs=1e-12), "kept_groups": pytest.approx(0.25, abs=1e-12)}
    assert a.samples == 48
    row = table_rows(report)[1]
    assert row["avg@4 %"] == "65.0" and row["95% CI seeds (t)"] == "±0.0" and row["Δ %"] == "+15.0"
    assert row["Δ 95% CI (paired)"] == "[+5.0, +25.0]" and row["paper AIME24 avg@32"] == "36"


@pytest.mark.slow
def test_tampering_with_a_metric_in_mlflow_changes_the_table(store, tmp_path: Path) -> None:
    client, parent, _, _, _ = store
    before = table_rows(build_report(client, parent))[0]["avg@4 %"]
    child = next(c for c in build_report(client, parent).children if (c.variant, c.seed) == (A, 0))
    # a later value at the final step wins (what a re-logged metric means in MLflow)
    client.log_metric(child.run_id, "val/avg_at_4", 0.95, step=3, timestamp=int(1e13))
    try:
        after = build_report(client, parent)
        assert before == "50.0" and table_rows(after)[0]["avg@4 %"] == "70.0"  # mean(.95, .45)
        assert after.rows[0].seed_half == pytest.approx(T975_1 * 0.25, abs=1e-9)  # sd .3536 / sqrt 2 = .25
    finally:
        client.log_metric(child.run_id, "val/avg_at_4", 0.55, step=3, timestamp=int(2e13))


def test_report_files_figures_and_parent_artifacts(store) -> None:
    client, parent, tmp, plan, outcome = store
    out = tmp / "runs" / "abl" / plan.name / "report"
    assert outcome.files == {"markdown": out / "report.md", "json": out / "report.json", "html": out / "report.html"}
    for axis in ("step", "samples"):
        pngs = sorted((out / f"curves_{axis}").iterdir())
        fits = ["fits.png"] if axis == "samples" else []  # the fitted curves over the points (ablate.fit_report)
        assert [p.name for p in pngs] == sorted([m.replace("/", "_") + ".png" for m in CURVE_METRICS] + fits)
        assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    md = (out / "report.md").read_text()
    assert "![rollout_acc](curves_step/rollout_acc.png)" in md and "![rollout_acc](curves_samples/rollout_acc.png)" in md
    assert "| 1 | grpo+overlong_filtering | + Overlong Filtering | 36 | 65.0 | ±0.0 |" in md
    assert "Student t" in md and parent.info.run_id in md
    data = json.loads((out / "report.json").read_text())
    assert data["rows"][1]["mean"] == pytest.approx(0.65) and data["table"][0]["variant"] == A
    page = (out / "report.html").read_text()
    assert "<td>+ Overlong Filtering</td>" in page
    # self-contained: every figure inline (MLflow's artifact viewer cannot follow relative links)
    assert page.count("src='data:image/png;base64,") == 2 * len(CURVE_METRICS) + 1 and "curves_step/" not in page  # + fits.png
    assert "val_avg_at_k.png" in [p.name for p in (out / "curves_step").iterdir()]
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/report.json", "report/curves_step"} <= logged


def test_parent_metrics_form_one_chart_section(store) -> None:
    client, _, _, _, outcome = store
    keys = set(client.get_run(outcome.parent_run_id).data.metrics)
    # MLflow's chart view: one section per key's part before its last "/"
    assert "variants/1_OverlongFilter.avg_at_4" in keys and "variants/1_OverlongFilter.delta" in keys
    assert {k.rsplit("/", 1)[0] for k in keys} == {"variants"}  # one section, not one per variant


@pytest.mark.slow
def test_report_targets_resolve_by_id_name_and_experiment(store) -> None:
    client, parent, _, plan, _ = store
    pid = parent.info.run_id
    assert resolve_parent(client, pid).info.run_id == pid
    assert resolve_parent(client, plan.name).info.run_id == pid
    assert resolve_parent(client, "abl").info.run_id == pid
    with pytest.raises(UserError, match=f"no ablation .* named 'nope'; ablations in this store: {plan.name}"):
        resolve_parent(client, "nope")
    with pytest.raises(UserError, match="named 'it's'"):  # a quote never reaches MLflow's filter parser
        resolve_parent(client, "it's")
    child_id = build_report(client, parent).children[0].run_id
    with pytest.raises(UserError, match="not an ablation parent run"):
        resolve_parent(client, child_id)


@pytest.mark.slow
def test_unfinished_children_are_listed_not_reported(store) -> None:
    client, parent, _, _, _ = store
    child = build_report(client, parent).children[-1]
    client.set_terminated(child.run_id, status="FAILED")
    try:
        report = build_report(client, parent)
        assert report.rows[1].seeds == [0] and len(report.unfinished) == 1 and "FAILED" in report.unfinished[0]
    finally:
        client.set_terminated(child.run_id, status="FINISHED")


def student_t_cdf_half(t: float, df: int, n: int = 20000) -> float:
    """∫_0^t of the Student-t density (Simpson's rule): should be .475 at the 0.975 quantile."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    f = lambda x: c * (1 + x * x / df) ** (-(df + 1) / 2)  # noqa: E731
    h = t / n
    return h / 3 * (f(0) + f(t) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n)))


@pytest.mark.parametrize("df", [1, 2, 4, 9, 30])
def test_t_critical_values_are_the_0975_quantiles(df: int) -> None:
    assert student_t_cdf_half(t_critical_95(df), df) == pytest.approx(0.475, abs=2e-4)


def test_t_approaches_the_normal_and_df_zero_is_rejected() -> None:
    assert t_critical_95(10_000) == pytest.approx(1.959964, abs=3e-4)
    with pytest.raises(ValueError):
        t_critical_95(0)


def test_pure_helpers() -> None:
    mean, half = seed_interval([0.3])
    assert mean == 0.3 and math.isnan(half)
    # [.2, .4, .6]: mean .4, sd .2; t(2) has the closed-form quantile (2p − 1)·sqrt(2 / (4p(1 − p))) at p = .975
    t2 = 0.95 * math.sqrt(2 / (4 * 0.975 * 0.025))
    assert seed_interval([0.2, 0.4, 0.6])[1] == pytest.approx(t2 * 0.2 / math.sqrt(3), abs=1e-12)
    assert cumulative([16, 16, 32]) == [16, 32, 64]
    assert mean_curve([{1: 1.0, 2: 3.0}, {1: 3.0}]) == ([1, 2], [2.0, 3.0])
    assert mean_per_problem([{"a": 1.0, "b": 0.5}, {"a": 0.0, "c": 1.0}]) == {"a": 0.5}
    assert mean_curve([]) == ([], [])


@pytest.mark.slow
def test_write_report_with_no_finished_child(tmp_path: Path, store) -> None:
    client, parent, _, _, _ = store
    report = build_report(client, parent)
    report.rows, report.children, report.missing = [], [], [A, B]
    files = write_report(report, tmp_path)
    md = files["markdown"].read_text()
    assert "No finished child run yet." in md and f"Not finished yet: {A}, {B}." in md


# ---------------------------------------------------------------- mechanisms and Δ at equal generated samples


@pytest.mark.slow
def test_equal_samples_delta_is_the_equal_steps_delta_when_the_rungs_generate_the_same(store) -> None:
    client, parent, _, _, _ = store
    report = build_report(client, parent)
    b = report.rows[1]
    # both rungs: 16 samples × 3 steps = 48 per seed → budget 48, every child at its final step 3
    assert (b.equal_samples.vs, b.equal_samples.budget, b.equal_samples.steps, b.equal_samples.ref_steps) == (A, 48, [3, 3], [3, 3])
    assert b.equal_samples.delta == b.delta and report.rows[0].equal_samples is None
    row = table_rows(report)[1]
    assert (row["Δ equal samples %"], row["Δ equal samples 95% CI"]) == ("+15.0", "[+5.0, +25.0]")
    assert (row["equal-samples steps"], row["equal-samples budget"]) == ("@3 vs @3", "48")
    metrics = summary_metrics(report)
    assert metrics["variants/1_OverlongFilter.delta_equal_samples"] == metrics["variants/1_OverlongFilter.delta"]
    assert "variants/1_OverlongFilter.delta_equal_samples_ci_high" in metrics
    assert all(not c.tables for c in report.children)  # nothing but the final tables was downloaded


@pytest.mark.slow
def test_mechanisms_of_the_fake_children(store) -> None:
    client, parent, _, _, _ = store
    report = build_report(client, parent)
    m = report.mechanisms[0]
    # fake: entropy 1 / step over steps 1..3 (3 steps: each window at most half of them, one step) → 1 and 1/3
    assert (m.entropy_start, m.entropy_end) == (pytest.approx(1.0), pytest.approx(1 / 3))
    # clip fractions .01 / .02, truncated .1 · step (first .1, last .3), length 10 + step (mean 12), kept .25 at every step
    assert (m.clip_high, m.clip_low, m.truncated_early, m.truncated_late, m.length_mean) == (
        pytest.approx(0.01), pytest.approx(0.02), pytest.approx(0.1), pytest.approx(0.3), pytest.approx(12.0))
    assert m.informative_early == m.informative_late == pytest.approx(0.25) and m.samples == 48
    # the fake logs no truncation causes and no length spread: "—"
    assert math.isnan(m.truncated_on_path) and math.isnan(m.truncated_looping) and math.isnan(m.spread_early)


def test_report_files_show_the_mechanisms_and_the_equal_samples_delta(store) -> None:
    _, _, tmp, plan, _ = store
    out = tmp / "runs" / "abl" / plan.name / "report"
    md = (out / "report.md").read_text()
    assert "## Mechanisms (what each technique acts on)" in md
    assert "| 0 | grpo (Naive GRPO) | 1.000→0.333 | 1.00 | 2.00 | — | 10.0→30.0 | — | — | — | 12.0 | 25.0→25.0 | 48 |" in md
    assert "- **clip high %**: clip-higher" in md and "Δ equal samples" in md and "5% slack" in md
    assert "| +15.0 | [+5.0, +25.0] | @3 vs @3 | 48 |" in md  # the rung-1 row's equal-samples columns
    data = json.loads((out / "report.json").read_text())
    assert data["mechanisms"][0]["entropy_start"] == pytest.approx(1.0)
    assert data["mechanisms_table"][1]["clip low %"] == "2.00"
    assert data["rows"][1]["equal_samples"]["steps"] == [3, 3]
    page = (out / "report.html").read_text()
    assert "<h2>Mechanisms (what each technique acts on)</h2>" in page and "<td>1.000→0.333</td>" in page
    assert "<th>Δ equal samples %</th>" in page


PLAIN, DS = LADDER_NAMES[4], LADDER_NAMES[5]  # + token-level loss (16 samples a step), DAPO (32: dynamic sampling)


class CountingClient:
    """An MlflowClient that records the artifacts downloaded through it."""

    def __init__(self, client: MlflowClient) -> None:
        self.client, self.downloads = client, []

    def download_artifacts(self, run_id: str, path: str, dst: str) -> str:
        self.downloads.append((run_id, path))
        return self.client.download_artifacts(run_id, path, dst)

    def __getattr__(self, name: str):
        return getattr(self.client, name)


@pytest.fixture(scope="module")
def ds_store(tmp_path_factory: pytest.TempPathFactory):
    """The last two rungs × 1 seed, 4 steps, validated at every step; returns (client, parent run)."""
    fake = FakeTrain({(PLAIN, 0): [2, 2, 1, 3, 2], (DS, 0): [4, 4, 4, 4, 4]}, val_every=1,
                     mid_correct={(DS, 0): [3, 2, 1, 3, 2]})  # DS at steps 1..3
    client, _, outcome = record_ladder(tmp_path_factory.mktemp("report-ds"), "abl-ds", 4, [PLAIN, DS], 1, fake)
    return client, client.get_run(outcome.parent_run_id)


def test_dynamic_sampling_is_compared_at_the_step_with_the_plain_rungs_samples(ds_store) -> None:
    client, parent = ds_store
    counting = CountingClient(client)
    report = build_report(counting, parent)
    plain, ds = report.rows
    assert (plain.name, ds.name, plain.samples, ds.samples) == (PLAIN, DS, 64, 128)  # 16 × 4, 32 × 4
    # budget min(64, 128) = 64, limit 67.2; DS cumulative samples 0, 32, 64, 96, 128 at steps 0..4 → step 2
    eq = ds.equal_samples
    assert (eq.vs, eq.budget, eq.steps, eq.ref_steps) == (PLAIN, 64, [2], [4])
    # equal steps: DS 1 everywhere − plain [.5, .5, .25, .75, .5] = [.5, .5, .75, .25, .5], mean .5
    assert ds.delta.diff == pytest.approx(0.5)
    # equal samples: DS at step 2 [.75, .5, .25, .75, .5] − plain = [.25, 0, 0, 0, 0], mean .05;
    #   a resample holds X ~ Bin(5, .2) of the .25: P(X = 0) = .8^5 = .328 > .025 → 2.5% quantile 0;
    #   P(X <= 2) = .942 < .975 < P(X <= 3) = .993 → 97.5% quantile 3 · .25 / 5 = .15; P(Δ > 0) = 1 − .328
    assert eq.delta.diff == pytest.approx(0.05)
    assert (eq.delta.ci_low, eq.delta.ci_high) == (pytest.approx(0.0, abs=1e-12), pytest.approx(0.15, abs=1e-12))
    assert eq.delta.share_positive == pytest.approx(1 - 0.8**5, abs=0.03)
    # bounded reads: each child's final table, and DS's step-2 table (none of steps 0, 1, 3)
    paths = sorted(p for _, p in counting.downloads)
    assert paths == ["val/per_problem_step_000002.json", "val/per_problem_step_000004.json", "val/per_problem_step_000004.json"]
    row = table_rows(report)[1]
    assert (row["Δ %"], row["Δ equal samples %"], row["equal-samples steps"], row["equal-samples budget"]) == (
        "+50.0", "+5.0", "@2 vs @4", "64")
    assert report.mechanisms[1].informative_early == pytest.approx(0.5)  # the fake's DS kept share


def test_curves_by_samples_start_at_the_base_validation() -> None:
    from dapo_cli.ablate.plots import curve_points
    from dapo_cli.ablate.results import ChildResult

    def child(samples: dict[int, float], val: dict[int, float]) -> ChildResult:
        return ChildResult(run_id="r", variant="v", seed=0, k=4, final_step=2, avg=val[2], stderr=0.0, per_problem={},
                           curves={"val/avg_at_k": val, "train/samples_generated": samples})

    # seed 0 generates 128 then 256 samples, seed 1 128 then 128: mean per step 128, 192 → cumulative 128, 320;
    # val at steps 0, 2: means 0.1 and (0.3 + 0.5) / 2 = 0.4; step 0 sits at 0 samples
    kids = [child({1: 128, 2: 256}, {0: 0.1, 2: 0.3}), child({1: 128, 2: 128}, {0: 0.1, 2: 0.5})]
    assert curve_points(kids, "val/avg_at_k", "samples") == ([0.0, 320.0], [pytest.approx(0.1), pytest.approx(0.4)])
    assert curve_points(kids, "val/avg_at_k", "step") == ([0.0, 2.0], [pytest.approx(0.1), pytest.approx(0.4)])


@pytest.mark.slow
def test_a_ladder_reports_its_last_rung_against_its_first(tmp_path: Path) -> None:
    from dapo_cli.ablate.variants import LADDER_NAMES
    from dapo_cli.ablate.report import overall_text, summary_markdown, to_markdown

    first, middle, last = LADDER_NAMES[0], LADDER_NAMES[4], LADDER_NAMES[5]
    # K = 4 on 5 problems, one seed: first acc [0, 0, 1, 1, .5] (mean .5), last [1, 1, 1, 1, .5] (mean .9):
    # paired differences [1, 1, 0, 0, 0], Δ +.4. At equal samples: the fake's dynamic-sampling rung (the
    # last) generates 32 samples a step against 16 (budget 2 × 16 = 32), and validates only at steps 0 and 2,
    # so it is taken at step 0 (its base validation: the fake's is all wrong, mean 0) against the first
    # rung's final step (mean .5): Δ −.5.
    fake = FakeTrain({(first, 0): [0, 0, 4, 4, 2], (middle, 0): [2, 2, 4, 4, 2], (last, 0): [4, 4, 4, 4, 2]})
    client, _, outcome = record_ladder(tmp_path, "abl-3", 2, [first, middle, last], 1, fake)
    report = build_report(client, client.get_run(outcome.parent_run_id))
    o = report.overall
    assert (o.first, o.last) == (first, last)
    assert o.delta.diff == pytest.approx(0.4) and o.delta.num_problems == 5
    assert report.rows[-1].delta.diff == pytest.approx(0.2)  # vs the previous rung: [.5, .5, 0, 0, 0] → +.2
    eq = o.equal_samples
    assert (eq.steps, eq.ref_steps, eq.budget) == ([0], [2], 32.0) and eq.delta.diff == pytest.approx(-0.5)
    text = overall_text(report)
    assert text.startswith("Naive GRPO → + Dynamic Sampling (DAPO) (last rung − first, paired over problems): Δ +40.0 [")
    assert "; -50.0 [" in text and "at equal generated samples (@0 vs @2)" in text
    assert text in summary_markdown(report)
    # every rung against the first: middle [.5, .5, 1, 1, .5] (mean .7) − first → [.5, .5, 0, 0, 0], +.2 over
    # problems and by seed (one seed: .7 − .5, no t interval); last − first +.4 as above
    mid, end = report.first_deltas
    assert (mid.variant, mid.vs, end.variant, end.vs) == (middle, first, last, first)
    assert mid.seeds == [0] and mid.seed_diffs == [pytest.approx(0.2)] and math.isnan(mid.seed_half)
    assert mid.delta.diff == pytest.approx(0.2) and end.delta.diff == pytest.approx(0.4) and end.seed_mean == pytest.approx(0.4)
    assert end.equal_samples.delta.diff == pytest.approx(-0.5)  # the overall comparison's equal-samples Δ
    markdown = to_markdown(report, {"step": [], "samples": []}, tmp_path)
    section = markdown.split("## Each rung against the first")[1].split("##")[0]
    assert f"| {middle} | {first} | +20.0 | — | 1 | +20.0 | [" in section and f"| {last} | {first} | +40.0 |" in section
    metrics = summary_metrics(report)
    assert [v for k, v in metrics.items() if k.endswith(".delta_vs_first")] == [pytest.approx(0.2), pytest.approx(0.4)]
    # two rungs: the last-vs-first comparison is the table's own Δ, so none is added
    client2, _, outcome2 = record_ladder(tmp_path / "two", "abl-2", 2, [first, last], 1, fake)
    two = build_report(client2, client2.get_run(outcome2.parent_run_id))
    assert two.overall is None and [d.variant for d in two.first_deltas] == [last]
