"""One driver over a small launcher protocol: what :func:`dapo_cli.ablate.runner.drive` asks of a launcher."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ablate_fakes import FakeTrain  # noqa: E402

from dapo_cli.ablate.child import ChildOutcome  # noqa: E402
from dapo_cli.ablate.launchers import InProcess, Launcher, Parent  # noqa: E402
from dapo_cli.ablate.variants import make_ablation  # noqa: E402
from dapo_cli.ablate.runner import drive, run_ablation  # noqa: E402
from dapo_cli.config.load import build_config  # noqa: E402


@pytest.fixture(autouse=True)
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dapo_cli.ablate.report.plot_curves", lambda report, out_dir: {"step": [], "samples": []})


def plan_for(tmp: Path):
    cfg = build_config(None, [f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}", "tracking.experiment=abl",
                              f"trainer.output_dir={tmp / 'runs'}", "trainer.total_steps=3", "validation.k=4"])
    return make_ablation(cfg, mode="ladder", only=["grpo", "dapo"], seeds=2)


class Recording:
    """A launcher that runs nothing: it records what the driver hands it."""

    name, reports, jobs = "recording", False, 1

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []
        self.finished: list[list[str]] = []
        self.parents: list[Parent] = []

    def attached(self, child) -> str | None:
        return None

    def start(self, o: ChildOutcome, parent: Parent) -> None:
        self.started.append((o.child.run_name.rsplit("/", 1)[-1], o.action))

    def finish(self, outcomes: Sequence[ChildOutcome], parent: Parent) -> None:
        self.finished.append([o.action for o in outcomes])
        self.parents.append(parent)


@pytest.mark.slow
def test_the_driver_starts_each_child_not_skipped_in_plan_order_then_finishes_once(tmp_path: Path) -> None:
    plan = plan_for(tmp_path)
    launcher = Recording()
    lines: list[str] = []
    outcome = drive(plan, launcher, command="x", log=lines.append)
    assert launcher.started == [("grpo-s0", "fresh"), ("dapo-s0", "fresh"), ("grpo-s1", "fresh"), ("dapo-s1", "fresh")]
    assert launcher.finished == [["fresh"] * 4]
    assert outcome.report is None and outcome.files == {}  # reports=False: no report
    # the parent is tagged with the launcher's name; a rerun finds the same parent
    run_ablation(plan, command="x", config_path=None, train=FakeTrain())
    again = Recording()
    rerun = drive(plan, again, command="x", log=lines.append)
    assert rerun.parent_run_id == outcome.parent_run_id
    assert again.started == [] and again.finished == [["skip"] * 4]  # all finished: nothing started
    (parent,) = again.parents
    assert parent.run_id == outcome.parent_run_id
    assert parent.clock is not None and parent.clock.done == 4  # skips count on the clock the driver started
    assert lines[-1].startswith("[4/4] dapo seed 1: finished earlier, skipped; ablation: 4/4 children done")


def test_the_builtin_launchers_satisfy_the_protocol(tmp_path: Path) -> None:
    from dapo_cli.ablate.launchers import OneProcessAtATime, PrintCommands
    from dapo_cli.ablate.pool import Pool

    plan = plan_for(tmp_path)
    where = {"config_path": None, "sets": ()}
    made: list[Launcher] = [
        InProcess(plan, train=FakeTrain(), quiet=False, log=print, **where),
        OneProcessAtATime(plan, quiet=False, log=print, **where),
        Pool(plan, log=print, **where),
        PrintCommands(plan, **where),
    ]
    assert [(x.name, x.reports, x.jobs) for x in made] == [
        ("local", True, 1), ("local", True, 1), ("local", True, 1), ("print", False, None)]
