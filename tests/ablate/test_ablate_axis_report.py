"""An ablation with an axis (``--axis rollout.max_staleness=0,1``) recorded by the fake trainer: each axis
variant is its own row, the Δ columns compare rows with the same setting, and each variant is paired with
its twin at the axis's first value, by seed and over problems (hand-derived values below)."""

from __future__ import annotations

import math

import re
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

sys.path.insert(0, str(Path(__file__).parent))

from ablate_fakes import FakeTrain  # noqa: E402

from dapo_cli.ablate.report import axis_table_rows, build_report, summary_markdown, summary_metrics, to_markdown  # noqa: E402
from dapo_cli.ablate.runner import run_ablation  # noqa: E402
from dapo_cli.ablate.axes import parse_axes  # noqa: E402
from dapo_cli.ablate.variants import make_ablation  # noqa: E402
from dapo_cli.config.load import build_config  # noqa: E402

T975_1 = math.tan(0.475 * math.pi)  # t(0.975, 1): the Cauchy quantile tan(π(p − ½)) = 12.7062


pytestmark = pytest.mark.slow  # one module fixture records 8 fake children in MLflow

TLL = "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss"
T0, T1, D0, D1 = f"{TLL}@max_staleness=0", f"{TLL}@max_staleness=1", "dapo@max_staleness=0", "dapo@max_staleness=1"
# correct answers out of K = 4 on 4 problems
CORRECT = {
    (T0, 0): [2, 2, 2, 2], (T0, 1): [2, 2, 2, 2],  # acc .5 everywhere
    (T1, 0): [2, 2, 2, 2], (T1, 1): [2, 2, 2, 2],  # the same: Δ 0 to T0
    (D0, 0): [4, 2, 0, 4],  # acc [1, .5, 0, 1]    avg .625
    (D0, 1): [2, 2, 0, 4],  # acc [.5, .5, 0, 1]   avg .5
    (D1, 0): [4, 4, 0, 4],  # acc [1, 1, 0, 1]     avg .75
    (D1, 1): [4, 2, 2, 4],  # acc [1, .5, .5, 1]   avg .75
}


@pytest.fixture(scope="module")
def axis_store(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("axis")
    cfg = build_config(None, [f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}", "tracking.experiment=axis",
                              f"trainer.output_dir={tmp / 'runs'}", "trainer.total_steps=2", "validation.k=4"])
    plan = make_ablation(cfg, mode="grid", techniques=("dynamic_sampling",), seeds=2,
                         axes=parse_axes(["rollout.max_staleness=0,1"], cfg))
    fake = FakeTrain(CORRECT)
    outcome = run_ablation(plan, command="dapo ablate --grid dynamic_sampling --axis rollout.max_staleness=0,1",
                           config_path=None, train=fake)
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    return client, client.get_run(outcome.parent_run_id), plan, fake


def test_axis_variants_are_rows_of_their_own_compared_within_their_setting(axis_store) -> None:
    client, parent, plan, fake = axis_store
    report = build_report(client, parent)
    assert [r.name for r in report.rows] == [T0, T1, D0, D1] and report.missing == []
    assert [r.label for r in report.rows] == ["+ Token-level Loss"] * 2 + ["+ Dynamic Sampling (DAPO)"] * 2
    assert [r.mean for r in report.rows] == [pytest.approx(m, abs=1e-12) for m in (0.5, 0.5, 0.5625, 0.75)]
    # grid: Δ to the first variant with the same max_staleness, never across settings
    assert [r.delta_vs for r in report.rows] == [None, None, T0, T1]
    # D1 − T1 per problem: [1, .75, .25, 1] − [.5, .5, .5, .5] = [.5, .25, −.25, .5], mean .25
    assert report.rows[3].delta.diff == pytest.approx(0.25, abs=1e-12)
    # the child runs carry the ablation's name of their variant; the trainer's dapo.variant is the technique state
    runs = {r.data.tags["ablate.variant"]: r.data.tags["dapo.variant"] for r in client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")}
    assert runs == {T0: TLL, T1: TLL, D0: "dapo", D1: "dapo"}
    assert parent.data.tags["ablate.axes"] == "rollout.max_staleness=0,1"
    # a rerun finds every axis child finished: nothing trains again
    calls = len(fake.calls)
    run_ablation(plan, command="again", config_path=None, train=fake)
    assert len(fake.calls) == calls == 8


def test_each_variant_is_paired_with_its_twin_at_the_first_axis_value(axis_store) -> None:
    client, parent, _, _ = axis_store
    report = build_report(client, parent)
    t, d = report.axis_deltas
    assert (t.variant, t.vs, t.axis, t.seeds) == (T1, T0, "max_staleness", [0, 1])
    assert t.seed_diffs == [0.0, 0.0] and t.seed_mean == 0.0 and t.delta.diff == 0.0
    assert (d.variant, d.vs, d.seeds) == (D1, D0, [0, 1])
    # by seed: .75 − .625 = .125, .75 − .5 = .25 → mean .1875; sd = sqrt(2 · .0625²) = .0883883;
    # half = t(0.975, 1) · sd / sqrt 2 = 12.706 · .0625 = .794125
    assert d.seed_diffs == [pytest.approx(0.125), pytest.approx(0.25)]
    assert d.seed_mean == pytest.approx(0.1875, abs=1e-12) and d.seed_half == pytest.approx(T975_1 * 0.0625, abs=1e-9)
    # over problems: [1, .75, .25, 1] − [.75, .5, 0, 1] = [.25, .25, .25, 0], mean .1875
    assert d.delta.diff == pytest.approx(0.1875, abs=1e-12)
    row = axis_table_rows(report)[1]
    assert (row["variant"], row["vs"], row["Δ by seed 95% CI (t)"], row["seed pairs"]) == (D1, D0, "±79.4", "2")
    md = to_markdown(report, {"step": [], "samples": []}, Path("."))
    assert "## Axis comparisons" in md and f"| {D1} | {D0} | +18.8 | ±79.4 | 2 |" in md
    assert f"- {D1} − {D0}: Δ +18.8 ±79.4 points (paired by seed, 2 pairs)" in summary_markdown(report)
    metrics = summary_metrics(report)
    assert metrics["variants/3_DAPO.ms.1.delta_by_seed_max_staleness"] == pytest.approx(0.1875)
    assert metrics["variants/3_DAPO.ms.1.delta_max_staleness"] == pytest.approx(0.1875)
    assert not any(k.startswith("variants/2_") and "max_staleness" in k for k in metrics)  # the twins have no Δ


@pytest.mark.parametrize("width", [80, 400])
def test_the_terminal_shows_the_axis_pairs_and_keeps_the_variant_names(axis_store, width: int) -> None:
    from rich.console import Console

    from dapo_cli.cli.report import print_report

    client, parent, _, _ = axis_store
    out = Console(width=width, record=True)
    print_report(build_report(client, parent), out)
    text = out.export_text()
    assert "Δ between axis values, at the same techniques" in text
    assert "79.4" in text
    if width == 80:  # the pairs by their run labels; the results table keeps its variant column (wrapped)
        assert "DAPO@ms=1  DAPO@ms=0" in text and "variant" in text.split("Δ between")[0]
    else:
        assert re.search(f"│ {re.escape(D1)} +│ {re.escape(D0)} +│", text)


def test_the_report_says_its_deltas_stay_within_an_axis_setting(axis_store) -> None:
    client, parent, _, _ = axis_store
    md = to_markdown(build_report(client, parent), {"step": [], "samples": []}, Path("."))
    assert "to the first variant with the same axis settings at the final step" in md


def test_a_ladder_with_an_axis_compares_each_rung_with_the_previous_one_at_its_setting(monkeypatch) -> None:
    from dapo_cli.ablate import report as report_module
    from dapo_cli.ablate.results import VariantRow
    from dapo_cli.ablate.variants import LADDER_NAMES

    names = [f"{n}@max_staleness={v}" for n in LADDER_NAMES[:3] for v in (0, 1)]
    rows = [VariantRow(i, n, "", None, [0], [0.5], 0.5, math.nan, math.nan, {}, 0.0, [2]) for i, n in enumerate(names)]
    monkeypatch.setattr(report_module, "compare_variants", lambda a, b, ref, client=None: (None, None))
    report_module.add_deltas(rows, {n: [] for n in names}, "ladder")
    assert [r.delta_vs for r in rows] == [None, None, names[0], names[1], names[2], names[3]]
    report_module.add_deltas(rows, {n: [] for n in names}, "grid")
    assert [r.delta_vs for r in rows][2:] == [names[0], names[1], names[0], names[1]]
