"""Children as processes: the child command (dapo train / torchrun), its environment, the local launcher with
``ablate.nproc > 1``, and the slurm launcher for real on submitit's LocalExecutor (``ablate.slurm.cluster: local``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

sys.path.insert(0, str(Path(__file__).parent))

from ablate_fakes import Died, FakeTrain  # noqa: E402

from dapo_cli.ablate import slurm as jobs  # noqa: E402
from dapo_cli.ablate.variants import make_ablation  # noqa: E402
from dapo_cli.ablate.child import child_argv, child_tags, run_child, train_words  # noqa: E402
from dapo_cli.ablate.runner import run_ablation, slurm_launch  # noqa: E402
from dapo_cli.config import TECHNIQUES  # noqa: E402
from dapo_cli.config.load import build_config  # noqa: E402
from dapo_cli.errors import UserError  # noqa: E402
from dapo_cli.tracking.tags import child_env, extra_tags_from_env  # noqa: E402

FAKE_CLI = str(Path(__file__).parent / "fake_train_cli.py")
NO_TOGGLES = [f"--no-{t.replace('_', '-')}" for t in TECHNIQUES]


@pytest.fixture(autouse=True)
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dapo_cli.ablate.report.plot_curves", lambda report, out_dir: {"step": [], "samples": []})


def sets_for(tmp: Path, *extra: str) -> list[str]:
    return [f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}", "tracking.experiment=abl",
            f"trainer.output_dir={tmp / 'runs'}", "trainer.total_steps=2", "validation.k=4", *extra]


def plan_for(tmp: Path, *extra: str, seeds: int = 1):
    return make_ablation(build_config(None, sets_for(tmp, *extra)), mode="ladder", only=["grpo", "dapo"], seeds=seeds)


def children_of(tmp: Path, parent_id: str):
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    exp = client.get_experiment_by_name("abl")
    return client, [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("mlflow.parentRunId") == parent_id]


# ---------------------------------------------------------------- the child command and environment


def test_child_argv_spells_dapo_train_or_torchrun_for_printing_and_this_interpreter_for_running(tmp_path: Path) -> None:
    plan = plan_for(tmp_path)
    grpo = plan.children[0]
    words = train_words(plan, grpo, "exp.yaml", ["a.b=1"])
    tail = ["train", "exp.yaml", "--set", "a.b=1", "--set", "trainer.seed=0", "--set", f"trainer.run_name={plan.name}/grpo-s0",
            "--set", "tracking.run_label=GRPO s0", *NO_TOGGLES]
    assert words == ["dapo", *tail]
    assert child_argv(plan, grpo, "exp.yaml", ["a.b=1"]) == words  # nproc 1 prints what it always printed
    assert child_argv(plan, grpo, "exp.yaml", ["a.b=1"], executable=True) == [sys.executable, "-m", "dapo_cli", *tail]
    assert child_argv(plan, grpo, "exp.yaml", ["a.b=1"], nproc=2, resume=True) == [
        "torchrun", "--standalone", "--nproc_per_node", "2", "-m", "dapo_cli", *tail, "--resume"]
    run = child_argv(plan, grpo, "exp.yaml", ["a.b=1"], nproc=4, executable=True)
    assert run == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", "-m", "dapo_cli", *tail]
    # torchrun itself reads it as: module dapo_cli, 4 local processes, and the train words untouched
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(run[3:])
    assert (args.module, args.standalone, args.nproc_per_node) == (True, True, "4")
    assert [args.training_script, *args.training_script_args] == ["dapo_cli", *tail]
    # without an explicit nproc: ablate.nproc of the config (which does not change the ablation)
    two = plan_for(tmp_path, "ablate.nproc=2")
    assert two.ablation_id == plan.ablation_id
    assert child_argv(two, two.children[1], None)[:7] == ["torchrun", "--standalone", "--nproc_per_node", "2", "-m", "dapo_cli", "train"]


def test_child_env_carries_the_parent_and_tags_that_extra_tags_from_env_reads_back(tmp_path: Path) -> None:
    plan = plan_for(tmp_path)
    child = plan.children[1]
    tags = child_tags(plan, child, "p" * 32)
    env = child_env("p" * 32, tags)
    assert env["DAPO_PARENT_RUN_ID"] == "p" * 32
    assert extra_tags_from_env(env) == tags and tags["ablate.variant"] == "dapo" and tags["ablate.rung"] == "1"
    assert extra_tags_from_env({}) is None and extra_tags_from_env({"DAPO_EXTRA_TAGS": " "}) is None
    assert extra_tags_from_env({"DAPO_EXTRA_TAGS": '{"n": 3, "s": "x"}'}) == {"n": "3", "s": "x"}
    with pytest.raises(UserError, match=r"\$DAPO_EXTRA_TAGS is not valid JSON"):
        extra_tags_from_env({"DAPO_EXTRA_TAGS": "{nope"})
    with pytest.raises(UserError, match=r"must be a JSON object of tag names to values, got list"):
        extra_tags_from_env({"DAPO_EXTRA_TAGS": "[1]"})


def test_run_child_adds_to_our_environment_and_streams_or_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("INHERITED", "yes")
    script = "import os, sys; print(os.environ['INHERITED'], os.environ['EXTRA'], os.getcwd()); sys.exit(int(sys.argv[1]))"
    assert run_child([sys.executable, "-c", script, "0"], {"EXTRA": "1"}, cwd=str(tmp_path)) == 0
    assert capfd.readouterr().out == f"yes 1 {tmp_path}\n"
    log = tmp_path / "logs" / "child.log"
    assert run_child([sys.executable, "-c", script, "5"], {"EXTRA": "2"}, log_path=log) == 5
    assert capfd.readouterr().out == "" and log.read_text().startswith("yes 2 ")


# ---------------------------------------------------------------- local launcher, nproc > 1


class RecordingSpawn:
    """Stands in for run_child: records each child's argv/env and trains it with FakeTrain, as the process would."""

    def __init__(self, plan, code: int = 0) -> None:
        self.plan, self.code, self.calls, self.fake = plan, code, [], FakeTrain()

    def __call__(self, argv, extra_env, *, log_path=None):
        self.calls.append((list(argv), dict(extra_env), log_path))
        if self.code:
            return self.code
        run_name = next(a.split("=", 1)[1] for a in argv if a.startswith("trainer.run_name="))
        child = next(c for c in self.plan.children if c.run_name == run_name)
        self.fake(self.plan.child_config(child), resume="--resume" in argv, command="x",
                  parent_run_id=extra_env["DAPO_PARENT_RUN_ID"], extra_tags=extra_tags_from_env(extra_env), quiet=False)
        return 0


@pytest.mark.slow
def test_local_launcher_with_nproc_2_runs_each_missing_child_under_torchrun_resuming_where_it_can(tmp_path: Path) -> None:
    one = plan_for(tmp_path, seeds=2)
    with pytest.raises(Died):  # in-process: grpo-s0 finishes, dapo-s0 dies after its checkpoint
        run_ablation(one, command="x", config_path=None, sets=sets_for(tmp_path),
                     train=FakeTrain(crash_after_checkpoint={("dapo", 0)}))
    two = plan_for(tmp_path, "ablate.nproc=2", seeds=2)
    spawn = RecordingSpawn(two)
    sets = sets_for(tmp_path, "ablate.nproc=2")
    outcome = run_ablation(two, command="x", config_path=None, sets=sets, spawn=spawn,
                           train=lambda *a, **k: pytest.fail("nproc 2 must not train in-process"))
    assert [o.action for o in outcome.children] == ["skip", "resume", "fresh", "fresh"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "dapo_cli", "train"]
    expected = [(c, resume) for c, resume in zip(two.children[1:], (True, False, False))]
    assert len(spawn.calls) == 3
    for (argv, env, log_path), (child, resume) in zip(spawn.calls, expected):
        assert argv[:9] == torchrun and argv == child_argv(two, child, None, sets, resume=resume, executable=True)
        assert ("--resume" in argv) == resume and log_path is None
        assert env == {"DAPO_PARENT_RUN_ID": outcome.parent_run_id,
                       "DAPO_EXTRA_TAGS": json.dumps(child_tags(two, child, outcome.parent_run_id), sort_keys=True)}
    assert outcome.report.unfinished == [] and [r.name for r in outcome.report.rows] == ["grpo", "dapo"]
    client, children = children_of(tmp_path, outcome.parent_run_id)
    assert sorted((r.data.tags["ablate.variant"], r.data.tags["ablate.seed"]) for r in children) == [
        ("dapo", "0"), ("dapo", "1"), ("grpo", "0"), ("grpo", "1")]

    # a child process that fails stops the ablation: one line with its name and exit code (3 seeds: the same
    # parent, whose seeds 0 and 1 are finished, so the first child to run is grpo-s2)
    three = plan_for(tmp_path, "ablate.nproc=2", seeds=3)
    assert three.name == two.name
    failing = RecordingSpawn(three, code=7)
    with pytest.raises(UserError, match=rf"^child {three.name}/grpo-s2 failed with exit code 7 \(output: .*/logs/grpo-s2.log\); rerun"):
        run_ablation(three, command="x", config_path=None, spawn=failing, quiet=True)
    assert len(failing.calls) == 1  # nothing after the failure
    assert failing.calls[0][2] == tmp_path / "runs" / "abl" / three.name / "logs" / "grpo-s2.log"  # --quiet: output to a log
    failed_parent = next(r for r in client.search_runs([client.get_experiment_by_name("abl").experiment_id])
                         if r.info.run_name == three.name)
    assert failed_parent.info.status == "FAILED"


# ---------------------------------------------------------------- slurm launcher


def test_executor_parameters_and_job_shapes() -> None:
    from dapo_cli.config.schema import AblateConfig, SlurmConfig

    assert jobs.executor_parameters(SlurmConfig(), "a/b") == {
        "name": "a/b", "nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 2, "timeout_min": 240,
        "slurm_signal_delay_s": 300}
    full = jobs.executor_parameters(SlurmConfig(partition="gpu", gpus_per_node=8, mem_gb=64), "n")
    assert full["slurm_partition"] == "gpu" and full["mem_gb"] == 64 and full["gpus_per_node"] == 8
    submitit = pytest.importorskip("submitit")

    submitit.AutoExecutor(folder="unused", cluster="local").update_parameters(**full)  # submitit accepts every key
    jobs.check_resources(AblateConfig(nproc=8, slurm=SlurmConfig(gpus_per_node=8)))
    jobs.check_resources(AblateConfig(nproc=4))  # CPU processes: no GPU count to check against
    with pytest.raises(UserError, match="ablate.slurm.nodes=2: a child runs on one node"):
        jobs.check_resources(AblateConfig(slurm=SlurmConfig(nodes=2)))
    with pytest.raises(UserError, match=r"ablate.nproc=4 > ablate.slurm.gpus_per_node=2"):
        jobs.check_resources(AblateConfig(nproc=4, slurm=SlurmConfig(gpus_per_node=2)))


def test_without_submitit_the_slurm_launcher_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` raises ImportError
    with pytest.raises(UserError, match=r"^launcher slurm needs submitit: pip install 'dapo-cli\[slurm\]'$"):
        slurm_launch(plan_for(tmp_path), command="x", config_path=None)
    assert not (tmp_path / "mlflow.db").exists()  # refused before any parent run


JOB = """
import json, os, sys, time
time.sleep(0.5)
out, code = sys.argv[1], int(sys.argv[2])
seen = {"argv": sys.argv[3:], "parent": os.environ.get("DAPO_PARENT_RUN_ID"), "tags": os.environ.get("DAPO_EXTRA_TAGS"),
        "cwd": os.getcwd()}
open(out, "w").write(json.dumps(seen))
sys.exit(code)
"""
"""A job's stand-in command: after 0.5 s, writes what it was given to a marker (its last act), exits with a code."""


@pytest.mark.slow
def test_slurm_launcher_on_the_local_executor_waits_for_every_job_then_reports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("submitit")
    monkeypatch.chdir(tmp_path)
    markers = tmp_path / "markers"
    markers.mkdir()
    sets = sets_for(tmp_path, "ablate.nproc=2", "ablate.slurm.cluster=local", f"ablate.slurm.folder={tmp_path / 'slurm'}")
    plan = make_ablation(build_config(None, sets), mode="ladder", only=["grpo", "dapo"], seeds=2)
    # in-process first (nproc 1, the same ablation): grpo-s0 finishes, dapo-s0 dies after its checkpoint
    with pytest.raises(Died):
        run_ablation(plan_for(tmp_path, seeds=2), command="x", config_path=None,
                     train=FakeTrain(crash_after_checkpoint={("dapo", 0)}))

    def argv_for(fail: set[str]):
        def argv(child, resume):
            name = f"{child.variant.name}-s{child.seed}"
            return [sys.executable, "-c", JOB, str(markers / f"{name}.json"), "5" if name in fail else "0",
                    *child_argv(plan, child, None, sets, resume=resume, executable=True)]
        return argv

    # 1. grpo-s0 is skipped, dapo-s0 resumed, grpo-s1 and dapo-s1 start; dapo-s1's job fails
    lines: list[str] = []
    with pytest.raises(UserError, match=rf"^1 of 3 job\(s\) failed: {plan.name}/dapo-s1 \(job \d+: child {plan.name}/dapo-s1 "
                                        r"exited with code 5\); logs in .*/slurm; rerun the same command to resume them$"):
        slurm_launch(plan, command="x", config_path=None, sets=sets, log=lines.append, argv_for=argv_for({"dapo-s1"}), poll_s=0.1)
    assert sorted(p.name for p in markers.iterdir()) == ["dapo-s0.json", "dapo-s1.json", "grpo-s1.json"]  # all waited for
    assert sum("submitted job" in line for line in lines) == 3 and "finished earlier, skipped" in lines[0]
    for name in ("dapo-s0", "grpo-s1"):
        assert any(re.fullmatch(rf"job \d+ \({plan.name}/{name}\): finished", line) for line in lines), lines
    assert any(re.fullmatch(rf"job \d+ \({plan.name}/dapo-s1\): \w+, failed: child .* exited with code 5", line) for line in lines)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = client.get_run(client.search_runs([client.get_experiment_by_name("abl").experiment_id],
                                               "tags.`ablate.launcher` = 'slurm'")[0].info.run_id)
    assert parent.info.status == "FAILED"
    for name, resume in (("dapo-s0", True), ("grpo-s1", False)):
        seen = json.loads((markers / f"{name}.json").read_text())
        child = next(c for c in plan.children if c.run_name.endswith(f"/{name}"))
        assert seen["argv"] == child_argv(plan, child, None, sets, resume=resume, executable=True)  # torchrun, --resume
        assert seen["parent"] == parent.info.run_id and seen["cwd"] == str(tmp_path)
        assert json.loads(seen["tags"]) == child_tags(plan, child, parent.info.run_id)

    # 2. every job succeeds: the launcher waits, then writes the report from MLflow as the local launcher does
    for marker in markers.iterdir():
        marker.unlink()
    outcome = slurm_launch(plan, command="x", config_path=None, sets=sets, argv_for=argv_for(set()), poll_s=0.1)
    assert outcome.parent_run_id == parent.info.run_id and len(list(markers.iterdir())) == 3
    assert [o.action for o in outcome.children] == ["skip", "resume", "fresh", "fresh"]
    # the stand-in jobs trained nothing: grpo has seed 0 only, dapo-s0 stays the in-process run that died
    assert [(r.name, r.seeds) for r in outcome.report.rows] == [("grpo", [0])] and len(outcome.report.unfinished) == 1
    assert (tmp_path / "runs" / "abl" / plan.name / "report" / "report.md").is_file()
    assert client.get_run(outcome.parent_run_id).info.status == "FINISHED"
    assert list((tmp_path / "slurm").glob("*_0_log.out"))  # submitit's logs where ablate.slurm.folder says


# ---------------------------------------------------------------- local launcher, jobs > 1


class FakeProc:
    """A child process for :class:`FakePopen`: running for ``polls`` polls, then it trains with FakeTrain (as
    ``dapo train`` would) and exits with its code. SIGINT ends it at once with 130, as Ctrl-C ends a trainer."""

    def __init__(self, owner: FakePopen, argv: list[str], env: dict[str, str], stdout) -> None:
        self.owner, self.argv, self.env, self.returncode, self.signals = owner, argv, env, None, []
        self.name = next(a.split("=", 1)[1] for a in argv if a.startswith("trainer.run_name=")).rsplit("/", 1)[-1]
        self.left = owner.polls.get(self.name, 3)
        stdout.write(f"trainer output of {self.name}\n".encode())

    def poll(self):
        if self.returncode is None:
            self.owner.on_poll(self)
            self.left -= 1
            if self.left <= 0:
                self._end(self.owner.codes.get(self.name, 0))
        return self.returncode

    def wait(self):
        while self.returncode is None:
            self._end(self.owner.codes.get(self.name, 0))
        return self.returncode

    def send_signal(self, sig) -> None:
        self.signals.append(sig)
        self._end(130)

    def _end(self, code: int) -> None:
        if code == 0:
            plan = self.owner.plan
            child = next(c for c in plan.children if c.run_name.endswith(f"/{self.name}"))
            self.owner.fake(plan.child_config(child), resume="--resume" in self.argv, command="x",
                            parent_run_id=self.env["DAPO_PARENT_RUN_ID"], extra_tags=extra_tags_from_env(self.env), quiet=False)
        self.returncode = code
        self.owner.running.remove(self)


class FakePopen:
    """Stands in for subprocess.Popen: records every start and how many children ran at once."""

    def __init__(self, plan, *, codes: dict[str, int] | None = None, polls: dict[str, int] | None = None) -> None:
        self.plan, self.codes, self.polls, self.fake = plan, codes or {}, polls or {}, FakeTrain()
        self.started: list[FakeProc] = []
        self.kwargs: list[dict] = []
        self.running: list[FakeProc] = []
        self.most = 0

    def __call__(self, argv, *, env, stdout, stderr, start_new_session):
        self.kwargs.append({"stdout": stdout.name, "stderr": stderr, "start_new_session": start_new_session})
        proc = FakeProc(self, list(argv), env, stdout)
        self.started.append(proc)
        self.running.append(proc)
        self.most = max(self.most, len(self.running))
        return proc

    def on_poll(self, proc: FakeProc) -> None:
        pass


@pytest.fixture()
def no_policy_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake children need no policy: ensuring builtin:tiny would build it (minutes) into ~/.cache/dapo."""
    monkeypatch.setattr("dapo_cli.warmstart.ensure_model", lambda spec, tiny: Path("/nonexistent/tiny"))


@pytest.mark.usefixtures("no_policy_build")
@pytest.mark.slow
def test_local_launcher_with_jobs_2_keeps_two_children_running_and_skips_finished_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INHERITED", "yes")
    with pytest.raises(Died):  # in-process first (jobs 1): grpo-s0 finishes, dapo-s0 dies after its checkpoint
        run_ablation(plan_for(tmp_path, seeds=2), command="x", config_path=None,
                     train=FakeTrain(crash_after_checkpoint={("dapo", 0)}))
    plan = plan_for(tmp_path, "ablate.jobs=2", seeds=2)
    sets = sets_for(tmp_path, "ablate.jobs=2")
    popen = FakePopen(plan, polls={"dapo-s0": 2, "grpo-s1": 6, "dapo-s1": 2})
    lines: list[str] = []
    outcome = run_ablation(plan, command="x", config_path=None, sets=sets, popen=popen, poll_s=0, log=lines.append,
                           train=lambda *a, **k: pytest.fail("jobs 2 must not train in-process"),
                           spawn=lambda *a, **k: pytest.fail("jobs 2 runs its own processes"))
    assert [o.action for o in outcome.children] == ["skip", "resume", "fresh", "fresh"]
    assert [p.name for p in popen.started] == ["dapo-s0", "grpo-s1", "dapo-s1"] and popen.most == 2  # the skipped one: never
    logs = tmp_path / "runs" / "abl" / plan.name / "logs"
    for proc, child, resume in zip(popen.started, plan.children[1:], (True, False, False)):
        assert proc.argv == child_argv(plan, child, None, sets, resume=resume, executable=True)
        extra = {**child_env(outcome.parent_run_id, child_tags(plan, child, outcome.parent_run_id)), "PYTHONUNBUFFERED": "1"}
        assert {k: proc.env.get(k) for k in extra} == extra and proc.env["INHERITED"] == "yes"  # ours + the child's
        text = (logs / f"{proc.name}.log").read_text()
        assert text.startswith("# ") and text.endswith(f"trainer output of {proc.name}\n")  # a header line, then its output
    assert all(k["start_new_session"] and k["stderr"] == subprocess.STDOUT for k in popen.kwargs)
    assert [o.summary is not None for o in outcome.children] == [False, True, True, True]
    starts = [line for line in lines if ", output in " in line]
    assert len(starts) == 3 and all(str(logs) in line for line in starts)
    assert sum(": done in " in line and "ablation: " in line for line in lines) == 3
    assert lines.index(starts[0]) > max(i for i, line in enumerate(lines) if "finished earlier, skipped" in line)
    assert outcome.report.unfinished == [] and [r.name for r in outcome.report.rows] == ["grpo", "dapo"]
    _, children = children_of(tmp_path, outcome.parent_run_id)
    assert sorted(r.info.status for r in children) == ["FINISHED"] * 4


@pytest.mark.usefixtures("no_policy_build")
@pytest.mark.slow
def test_a_failing_parallel_child_starts_no_new_ones_and_is_named_once_the_running_ones_end(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "ablate.jobs=3", seeds=3)  # grpo-s0, dapo-s0, grpo-s1, dapo-s1, grpo-s2, dapo-s2
    popen = FakePopen(plan, codes={"grpo-s0": 7, "dapo-s0": 1}, polls={"grpo-s0": 1, "dapo-s0": 4, "grpo-s1": 6})
    lines: list[str] = []
    logs = tmp_path / "runs" / "abl" / plan.name / "logs"
    with pytest.raises(UserError) as caught:
        run_ablation(plan, command="x", config_path=None, popen=popen, poll_s=0, log=lines.append)
    assert str(caught.value) == (
        f"2 child(ren) failed: {plan.name}/grpo-s0 (exit code 7, log {logs / 'grpo-s0.log'}); "
        f"{plan.name}/dapo-s0 (exit code 1, log {logs / 'dapo-s0.log'}); rerun the same command to resume the ablation")
    assert [p.name for p in popen.started] == ["grpo-s0", "dapo-s0", "grpo-s1"]  # nothing started after the first failure
    assert all(p.returncode is not None and p.signals == [] for p in popen.started)  # the running ones ran to their end
    assert any(line.startswith("[1/6] grpo seed 0: failed with exit code 7") for line in lines)
    _, children = children_of(tmp_path, client_parent(tmp_path, plan.name))
    assert [(r.data.tags["ablate.variant"], r.data.tags["ablate.seed"], r.info.status) for r in children] == [("grpo", "1", "FINISHED")]


def client_parent(tmp: Path, name: str) -> str:
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    parent, = [r for r in client.search_runs([client.get_experiment_by_name("abl").experiment_id]) if r.info.run_name == name]
    assert parent.info.status in ("FAILED", "KILLED")
    return parent.info.run_id


@pytest.mark.usefixtures("no_policy_build")
@pytest.mark.slow
def test_ctrl_c_during_a_parallel_ablation_interrupts_the_running_children_and_waits_for_them(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, "ablate.jobs=2", seeds=2)
    popen = FakePopen(plan, polls={"grpo-s0": 1, "dapo-s0": 50, "grpo-s1": 50})
    polls = []

    def ctrl_c(proc: FakeProc) -> None:
        polls.append(proc.name)
        if len(polls) == 6:  # grpo-s0 done, dapo-s0 and grpo-s1 running
            raise KeyboardInterrupt

    popen.on_poll = ctrl_c
    with pytest.raises(KeyboardInterrupt):
        run_ablation(plan, command="x", config_path=None, popen=popen, poll_s=0)
    assert [p.name for p in popen.started] == ["grpo-s0", "dapo-s0", "grpo-s1"]
    assert [p.signals for p in popen.started] == [[], [signal.SIGINT], [signal.SIGINT]]
    assert [p.returncode for p in popen.started] == [0, 130, 130]
    client_parent(tmp_path, plan.name)  # the parent ended KILLED


@pytest.mark.slow
def test_jobs_2_resolves_a_builtin_policy_once_before_the_first_child_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_for(tmp_path, "ablate.jobs=2", seeds=2)
    assert plan.base.model.path == "builtin:tiny"
    order: list[str] = []
    monkeypatch.setattr("dapo_cli.warmstart.ensure_model", lambda spec, tiny: order.append(f"resolve {spec}") or tmp_path / "tiny")

    class Recording(FakePopen):
        def __call__(self, argv, **kwargs):
            order.append("start")
            return super().__call__(argv, **kwargs)

    popen = Recording(plan)
    lines: list[str] = []
    run_ablation(plan, command="x", config_path=None, popen=popen, poll_s=0, log=lines.append)
    assert order == ["resolve builtin:tiny"] + ["start"] * 4
    assert any(line.startswith("policy builtin:tiny: ") for line in lines)


# ---------------------------------------------------------------- slurm: asked before anything opens (issue 54)


def fake_tools(bin_dir: Path, sbatch: str) -> None:
    """``sbatch`` (the shell body given), ``srun`` and ``scancel`` stand-ins in ``bin_dir``."""
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("sbatch", sbatch), ("srun", "exit 0"), ("scancel", "exit 0")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        (bin_dir / name).chmod(0o755)


def test_the_probe_is_sbatch_test_only_with_a_childs_job_shape() -> None:
    from dapo_cli.config.schema import SlurmConfig

    assert jobs.probe_argv("/x/sbatch", SlurmConfig()) == [
        "/x/sbatch", "--test-only", "--job-name=dapo-ablate-probe", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2",
        "--time=240", "--wrap=true"]
    full = jobs.probe_argv("sbatch", SlurmConfig(partition="gpu", gpus_per_node=8, mem_gb=64, timeout_min=30))
    assert full[-4:] == ["--partition=gpu", "--gpus-per-node=8", "--mem=64G", "--wrap=true"] and "--time=30" in full


def test_the_probe_refuses_missing_tools_a_refusal_and_silence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dapo_cli.config.schema import SlurmConfig

    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    (tmp_path / "bin").mkdir()
    with pytest.raises(UserError, match=r"^ablate.slurm.cluster=slurm but sbatch and srun are not on PATH; run dapo ablate "
                                        r"on a Slurm login node, or set ablate.slurm.cluster=local"):
        jobs.probe_sbatch(SlurmConfig())
    # the controller's last line is quoted, its credentials redacted and its escapes made visible
    fake_tools(tmp_path / "bin", 'echo "sbatch: error: Unable to contact slurm controller at http://u:pw@ctl \033[2J" >&2; exit 1')
    with pytest.raises(UserError) as refused:
        jobs.probe_sbatch(SlurmConfig(partition="gpu"))
    message = str(refused.value)
    assert message.startswith("Slurm refused a child's job shape (`sbatch --test-only --job-name=dapo-ablate-probe --nodes=1 ")
    assert "--partition=gpu --wrap=true`): sbatch: error: Unable to contact slurm controller at http://***@ctl \\x1b[2J; " in message
    assert "pw" not in message and message.endswith("or set ablate.slurm.cluster=local to run the jobs as processes here")

    def silent(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    with pytest.raises(UserError, match=r"did not answer in 30 s: is the Slurm controller up\?"):
        jobs.probe_sbatch(SlurmConfig(), run=silent)
    fake_tools(tmp_path / "bin", 'echo "sbatch: Job 7 to start at 2026-12-06T10:00:00" >&2; exit 0')
    jobs.probe_sbatch(SlurmConfig())  # accepted: nothing raised


@pytest.mark.slow
def test_a_slurm_that_refuses_leaves_no_parent_and_a_failed_submission_no_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("submitit")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    sets = sets_for(tmp_path, "ablate.slurm.cluster=slurm", f"ablate.slurm.folder={tmp_path / 'slurm'}")
    plan = make_ablation(build_config(None, sets), mode="ladder", only=["grpo"], seeds=1)
    fake_tools(tmp_path / "bin", 'echo "sbatch: error: slurm_load_partitions: Unable to contact slurm controller" >&2; exit 1')
    with pytest.raises(UserError, match=r"Unable to contact slurm controller; check ablate.slurm.partition"):
        slurm_launch(plan, command="x", config_path=None, sets=sets)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]  # no store, no parent run, no run directory
    # the probe passes, the submission itself is refused: the pickle and script submitit wrote for it are gone
    fake_tools(tmp_path / "bin", 'case "$*" in *--test-only*) exit 0;; esac; echo "sbatch: error: Invalid account" >&2; exit 1')
    with pytest.raises(UserError, match=rf"^submitting {plan.name}/grpo-s0 failed: sbatch: error: Invalid account; rerun"):
        slurm_launch(plan, command="x", config_path=None, sets=sets)
    assert not (tmp_path / "slurm").exists()
