"""The runner with a fake trainer: parent/child structure in MLflow, reruns that skip, resume and supersede,
the print launcher, calibration. (Real training through the CLI: tests/ablate/test_ablate_e2e.py.)"""

from __future__ import annotations

import dataclasses
import sys
import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

sys.path.insert(0, str(Path(__file__).parent))

from ablate_fakes import Died, FakeTrain  # noqa: E402

from dapo_cli.ablate.variants import make_ablation  # noqa: E402
from dapo_cli.ablate.estimate import calibrate  # noqa: E402
from dapo_cli.ablate.launchers import AblationClock  # noqa: E402
from dapo_cli.ablate.runner import PriorRun, decide, print_launch, run_ablation  # noqa: E402
from dapo_cli.config import TECHNIQUES  # noqa: E402
from dapo_cli.config.load import build_config  # noqa: E402
from dapo_cli.errors import UserError  # noqa: E402

LADDER = ["grpo", "grpo+overlong_filtering", "grpo+overlong_filtering+clip_higher",
          "grpo+overlong_filtering+clip_higher+overlong_shaping",
          "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss", "dapo"]


@pytest.fixture(autouse=True)
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's tests check what it records, not the figures (tests/ablate/test_ablate_report.py does)."""
    monkeypatch.setattr("dapo_cli.ablate.report.plot_curves", lambda report, out_dir: {"step": [], "samples": []})


def config(tmp: Path, *extra: str):
    return build_config(None, [f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}", "tracking.experiment=abl",
                               f"trainer.output_dir={tmp / 'runs'}", "trainer.total_steps=3", "validation.k=4", *extra])


def runs_of(tmp: Path):
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    exp = client.get_experiment_by_name("abl")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return client, parents, children


def test_decide_covers_every_branch() -> None:
    done = PriorRun("a", "FINISHED", True)
    assert decide([done], has_checkpoint=True) == ("skip", [])
    assert decide([PriorRun("b", "FAILED", False), done], has_checkpoint=False) == ("skip", [])
    # FINISHED without summary (killed between the two) is not done: resume it from its checkpoint
    assert decide([PriorRun("c", "FINISHED", False)], has_checkpoint=True) == ("resume", [])
    assert decide([PriorRun("d", "RUNNING", False)], has_checkpoint=True) == ("resume", [])
    assert decide([PriorRun("e", "FAILED", False), PriorRun("f", "RUNNING", False)], has_checkpoint=False) == ("fresh", ["e", "f"])
    assert decide([], has_checkpoint=False) == ("fresh", [])


def test_the_eta_divides_the_remaining_children_among_the_jobs_running_at_once() -> None:
    one = AblationClock(5)
    assert one.eta_s() is None  # nothing trained yet: no mean
    one.finished(10.0)
    assert one.eta_s() == 40.0  # one after another: 4 left × 10 s
    two = AblationClock(5, jobs=2)
    two.skipped()
    assert two.eta_s() is None
    two.finished(10.0)
    two.finished(20.0)
    assert two.eta_s() == 2 * 15.0 / 2  # 2 left × mean 15 s / 2 at once
    two.finished(15.0)
    assert two.eta_s() == 15.0  # the last one runs alone: no faster than one child
    two.finished(15.0)
    assert two.eta_s() == 0.0 and two.line().startswith("ablation: 5/5 children done, ")
    assert AblationClock(7, jobs=3).jobs == 3 and AblationClock(7, jobs=0).jobs == 1


@pytest.mark.slow
def test_ladder_records_one_parent_and_six_tagged_children(tmp_path: Path) -> None:
    plan = make_ablation(config(tmp_path), mode="ladder")
    fake = FakeTrain()
    outcome = run_ablation(plan, command="dapo ablate --ladder", config_path=None, train=fake)
    assert [c[:2] for c in fake.calls] == [(n, 0) for n in LADDER] and not any(c[2] for c in fake.calls)
    client, parents, children = runs_of(tmp_path)
    assert len(parents) == 1 and len(children) == 6
    parent = parents[0]
    assert parent.info.run_id == outcome.parent_run_id and parent.info.status == "FINISHED"
    assert parent.info.run_name == plan.name
    ptags = parent.data.tags
    assert ptags["ablate.mode"] == "ladder" and ptags["ablate.id"] == plan.ablation_id
    assert ptags["ablate.variants"] == ",".join(LADDER) and ptags["ablate.seeds"] == "0"
    assert len(ptags["ablate.config_hash"]) == 16 and ptags["dapo.command"] == "dapo ablate --ladder"
    by_rung = {int(r.data.tags["ablate.rung"]): r for r in children}
    assert sorted(by_rung) == list(range(6))
    for rung, run in by_rung.items():
        tags = run.data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id == tags["ablate.parent"]
        assert tags["ablate.variant"] == LADDER[rung] == tags["dapo.variant"] and tags["ablate.seed"] == "0"
        assert {t: tags[f"technique.{t}"] for t in TECHNIQUES} == {t: str(j < rung).lower() for j, t in enumerate(TECHNIQUES)}
        assert run.info.run_name == f"{plan.name}/{LADDER[rung]}-s0"
        assert Path(tags["dapo.run_dir"]) == (tmp_path / "runs" / "abl" / plan.name / f"{LADDER[rung]}-s0").resolve()
    # the child's command is the equivalent dapo train line, toggles spelled out
    assert fake.commands[0].startswith(
        f"dapo train --set trainer.seed=0 --set trainer.run_name={plan.name}/grpo-s0 --set 'tracking.run_label=GRPO s0' "
        "--no-overlong-filtering"
    )
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"ablation_config.yaml", "plan.json", "report"} <= artifacts
    assert (tmp_path / "runs" / "abl" / plan.name / "report" / "report.md").is_file()
    assert [r.name for r in outcome.report.rows] == LADDER


@pytest.mark.slow
def test_reruns_skip_finished_resume_checkpointed_and_supersede_dead_children(tmp_path: Path) -> None:
    plan = make_ablation(config(tmp_path), mode="ladder")
    run = lambda fake: run_ablation(plan, command="dapo ablate --ladder", config_path=None, train=fake)  # noqa: E731
    # 1. rung 2 dies after its first checkpoint
    first = FakeTrain(crash_after_checkpoint={(LADDER[2], 0)})
    with pytest.raises(Died):
        run(first)
    assert [c[0] for c in first.calls] == LADDER[:3]
    _, parents, children = runs_of(tmp_path)
    assert parents[0].info.status == "FAILED"
    rung2_id = next(r.info.run_id for r in children if r.data.tags["dapo.variant"] == LADDER[2])
    # 2. rung 2 resumes; rung 3 dies before any checkpoint
    second = FakeTrain(crash_before_checkpoint={(LADDER[3], 0)})
    with pytest.raises(Died):
        run(second)
    assert second.calls == [(LADDER[2], 0, True), (LADDER[3], 0, False)]
    # 3. the rest: rung 3 again from scratch (its dead run superseded), then rungs 4 and 5
    third = FakeTrain()
    outcome = run(third)
    assert third.calls == [(LADDER[3], 0, False), (LADDER[4], 0, False), (LADDER[5], 0, False)]
    assert [o.action for o in outcome.children] == ["skip", "skip", "skip", "fresh", "fresh", "fresh"]
    assert len(outcome.children[3].superseded) == 1
    client, parents, children = runs_of(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"  # the same parent all along
    assert len(children) == 7
    dead = [r for r in children if r.data.tags.get("ablate.superseded") == "true"]
    assert len(dead) == 1 and dead[0].data.tags["dapo.variant"] == LADDER[3] and dead[0].info.status == "FAILED"
    live = [r for r in children if r not in dead]
    assert sorted(r.data.tags["dapo.variant"] for r in live) == sorted(LADDER)
    assert all(r.info.status == "FINISHED" for r in live)
    resumed = next(r for r in live if r.data.tags["dapo.variant"] == LADDER[2])
    assert resumed.info.run_id == rung2_id and resumed.data.tags["dapo.resumed_from_step"] == "1"
    # each live child logged every step exactly once: nothing trained twice
    for r in live:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "rollout/acc")] == [1, 2, 3]
    assert outcome.report.unfinished == [] and len(outcome.report.rows) == 6
    # 4. nothing left to do
    fourth = FakeTrain()
    assert [o.action for o in run(fourth).children] == ["skip"] * 6 and fourth.calls == []


@pytest.mark.slow
def test_print_launcher_attaches_commands_to_the_same_parent(tmp_path: Path) -> None:
    plan = make_ablation(config(tmp_path), mode="ladder", only=["grpo", "dapo"], seeds=2)
    printed = print_launch(plan, command="dapo ablate --ladder --launcher print", config_path="exp.yaml", sets=["a.b=1"])
    pid = printed.parent_run_id
    assert len(printed.commands) == 4
    assert printed.commands[0] == (
        f"DAPO_PARENT_RUN_ID={pid} dapo train exp.yaml --set a.b=1 --set trainer.seed=0 "
        f"--set trainer.run_name={plan.name}/grpo-s0 --set 'tracking.run_label=GRPO s0' "
        + " ".join(f"--no-{t.replace('_', '-')}" for t in TECHNIQUES)
    )
    assert printed.commands[3].endswith(" --dynamic-sampling") and "trainer.seed=1" in printed.commands[3]
    _, parents, children = runs_of(tmp_path)
    assert [p.info.run_id for p in parents] == [pid] and children == []
    assert parents[0].data.tags["ablate.launcher"] == "print"
    # grpo seed 0 finishes, dapo seed 0 stops after a checkpoint; reprinting skips / resumes them
    with pytest.raises(Died):
        run_ablation(plan, command="x", config_path=None, train=FakeTrain(crash_after_checkpoint={("dapo", 0)}))
    again = print_launch(plan, command="x", config_path="exp.yaml")
    assert again.parent_run_id == pid
    assert again.commands[0] == f"# done: {plan.name}/grpo-s0"
    assert again.commands[1].endswith("--dynamic-sampling --resume")
    assert not again.commands[2].endswith("--resume")


def test_calibration_times_one_untracked_step_without_validation(tmp_path: Path) -> None:
    plan = make_ablation(config(tmp_path), mode="ladder", seeds=2)
    seen = []

    def fake(cfg, **kwargs):
        seen.append((cfg, kwargs))
        return {}

    est = calibrate(plan, train=fake)
    cfg, kwargs = seen[0]
    assert cfg.trainer.total_steps == 1 and cfg.data.val_files == [] and cfg.tracking.backend == "null"
    assert not cfg.trainer.output_dir.startswith(str(tmp_path)) and cfg.trainer.run_name == "calibration"
    assert kwargs["resume"] is False and kwargs["parent_run_id"] is None
    assert cfg.algorithm.filter_groups.enable is False  # the first child: naive GRPO
    assert est.children == 12 and est.steps == 3 and est.variant == "grpo"
    assert est.total_s == pytest.approx(12 * 3 * est.step_s, rel=1e-12)
    assert not (tmp_path / "runs").exists()


def test_a_null_tracking_backend_is_a_user_error(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    plan = make_ablation(dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, backend="null")), mode="ladder")
    with pytest.raises(UserError, match="set tracking.backend=mlflow"):
        run_ablation(plan, command="x", config_path=None, train=FakeTrain())


def test_the_dry_run_estimate_counts_waves_of_parallel_children() -> None:
    from dapo_cli.ablate.estimate import Estimate

    # 18 children × 60 steps × 2 s: one at a time 2160 s; two at a time 9 waves → 1080 s;
    # 4 at a time ceil(18 / 4) = 5 waves → 600 s (the last wave runs 2 children, as long as a full one)
    assert Estimate("grpo", 2.0, children=18, steps=60).total_s == 2160.0
    assert Estimate("grpo", 2.0, children=18, steps=60, jobs=2).total_s == 1080.0
    assert Estimate("grpo", 2.0, children=18, steps=60, jobs=4).total_s == 600.0


@pytest.mark.slow
def test_more_seeds_later_extend_the_same_parent(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    one = make_ablation(cfg, mode="ladder", only=LADDER[:2], seeds=1)
    first = FakeTrain()
    run_ablation(one, command="dapo ablate --ladder", config_path=None, train=first)
    three = make_ablation(cfg, mode="ladder", only=LADDER[:2], seeds=3)
    assert three.name == one.name  # the same ablation (and run dirs): only the seeds differ
    again = FakeTrain()
    outcome = run_ablation(three, command="dapo ablate --ladder --seeds 3", config_path=None, train=again)
    # seed 0 of both rungs finished in the first run: skipped; seeds 1 and 2 trained now
    assert [o.action for o in outcome.children] == ["skip", "skip", "fresh", "fresh", "fresh", "fresh"]  # seed-major order
    assert sorted(again.calls) == sorted((v, s, False) for v in LADDER[:2] for s in (1, 2))
    client, parents, children = runs_of(tmp_path)
    assert len(parents) == 1 and len(children) == 6
    assert parents[0].data.tags["ablate.seeds"] == "0,1,2"
    assert [row.seeds for row in outcome.report.rows] == [[0, 1, 2], [0, 1, 2]]
    plan_json = json.loads(Path(client.download_artifacts(parents[0].info.run_id, "plan.json", str(tmp_path))).read_text())
    assert plan_json["seeds"] == [0, 1, 2] and len(plan_json["children"]) == 6  # rewritten by the second run


def test_an_ablation_an_older_dapo_started_is_continued_only_with_the_same_config(tmp_path: Path, monkeypatch) -> None:
    """An older dapo hashed the config as its schema had it (another ablate.id, so another name) and recorded the
    base config without the keys added since: a rerun finds its parent by that config, reuses its finished
    children and resumes the checkpointed one under their old run names. Another config starts its own."""
    from foreign_files import as_written_by

    from dapo_cli.ablate import runner
    from dapo_cli.config import to_dict

    plan = make_ablation(config(tmp_path), mode="ladder", only=LADDER[:3])
    older = dataclasses.replace(plan, ablation_id="0123456789ab", name="abl-ladder-01234567")
    with monkeypatch.context() as m:  # what the older dapo saved: no schema_version, none of the keys added since
        m.setattr(runner, "dump_saved", lambda base: json.dumps(as_written_by(to_dict(base), "4e22362")))
        with pytest.raises(Died):
            run_ablation(older, command="dapo ablate --ladder", config_path=None, train=FakeTrain(crash_after_checkpoint={(LADDER[2], 0)}))
    again = FakeTrain()
    outcome = run_ablation(plan, command="dapo ablate --ladder", config_path=None, train=again)
    assert [o.action for o in outcome.children] == ["skip", "skip", "resume"] and again.calls == [(LADDER[2], 0, True)]
    assert outcome.name == older.name and {o.child.run_name.split("/")[0] for o in outcome.children} == {older.name}
    _, parents, children = runs_of(tmp_path)
    assert len(parents) == 1 and parents[0].data.tags["ablate.id"] == older.ablation_id and len(children) == 3
    other = make_ablation(config(tmp_path, "trainer.lr=2e-6"), mode="ladder", only=LADDER[:3])
    assert run_ablation(other, command="dapo ablate --ladder", config_path=None, train=FakeTrain()).name == other.name
    assert len(runs_of(tmp_path)[1]) == 2  # its own parent
