"""The slurm launcher's job record and its checkpointable job, without a cluster (the real one: test_ablate_slurm_*)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from dapo_cli.ablate.slurm_jobs import ChildFailed, ChildJob, JobRecord
from dapo_cli.errors import PREEMPTED, UserError

STOPS_ON_USR2 = f"""
import signal, sys, time
stop = []
signal.signal(signal.SIGUSR2, lambda *_: stop.append(1))
open(sys.argv[1], "w").write("started")
for _ in range(600):
    if stop:
        sys.exit({PREEMPTED})  # what dapo train does after the checkpoint the signal asked for
    time.sleep(0.05)
"""
"""A stand-in child: exits PREEMPTED once SIGUSR2 came, after writing a marker that says it is running."""


def test_the_record_is_rewritten_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "abl" / "slurm-jobs.json"
    record = JobRecord(path)
    assert record.jobs == {}
    record.add("abl/grpo-s0", "12", "runs/slurm")
    record.add("abl/dapo-s0", "13", "runs/slurm")
    record.add("abl/grpo-s0", "14", "runs/slurm")  # resubmitted: the newest job is the one to re-attach to
    again = JobRecord(path)
    assert {k: v.job_id for k, v in again.jobs.items()} == {"abl/grpo-s0": "14", "abl/dapo-s0": "13"}
    assert again.jobs["abl/dapo-s0"].folder == str((Path.cwd() / "runs" / "slurm").resolve())
    assert [p.name for p in path.parent.iterdir()] == ["slurm-jobs.json"]  # no temp file left


@pytest.mark.parametrize("text", ['{"jobs": {"a": {"job_id": 12, "folder": "x"}}}', '[]', '{"jobs": {"a": "12"}}'])
def test_a_record_that_is_not_one_is_one_line_naming_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / "slurm-jobs.json"
    path.write_text(text)
    with pytest.raises(UserError, match=r"slurm-jobs.json is not a dapo job record .* remove it to submit every "
                                        r"unfinished child again$"):
        JobRecord(path)


def test_the_job_survives_a_second_pickling_without_its_process(tmp_path: Path) -> None:
    import pickle

    job = ChildJob("abl/grpo-s0", ["a"], ["a", "--resume"], {"K": "V"}, str(tmp_path), "runs/x/abl/grpo-s0")
    job._proc = object()  # type: ignore[assignment]  (a live Popen cannot be pickled; submitit pickles the job again)
    back = pickle.loads(pickle.dumps(job))
    assert back._proc is None and back.resume_argv == ["a", "--resume"] and back.extra_env == {"K": "V"}


def test_on_the_warning_signal_the_child_stops_and_the_requeued_job_resumes_it(tmp_path: Path, monkeypatch) -> None:
    """What submitit does on Slurm's SIGUSR2, played here: its handler runs while the job's call waits for the child,
    calls checkpoint() and leaves (submitit then requeues the job and exits). checkpoint() must reap the child from
    inside that handler (the interrupted wait holds the child's wait lock); the requeued job resumes the child."""
    pytest.importorskip("submitit")
    marker = tmp_path / "started"
    argv = [sys.executable, "-c", STOPS_ON_USR2, str(marker)]
    job = ChildJob("abl/grpo-s0", argv, [*argv, "--resume"], {}, str(tmp_path), "run")
    result: dict[str, object] = {}

    class Requeued(Exception):
        pass

    def submitit_handler(signum, frame):
        result["next"] = job.checkpoint()
        raise Requeued  # submitit's handler exits the job's process here

    def signal_once_running() -> None:
        for _ in range(400):
            if marker.exists():
                break
            threading.Event().wait(0.05)
        os.kill(os.getpid(), signal.SIGUSR2)

    previous = signal.signal(signal.SIGUSR2, submitit_handler)
    try:
        threading.Thread(target=signal_once_running, daemon=True).start()
        with pytest.raises(Requeued):
            job()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    with pytest.raises(ProcessLookupError):  # reaped inside the handler: the child is gone, not a zombie
        os.kill(job._proc.pid, 0)
    nxt = result["next"].function
    assert nxt.requeued and nxt.name == "abl/grpo-s0" and result["next"].args == ()
    assert nxt.command() == argv  # no checkpoint in its run dir (the stand-in saves none): started again
    from dapo_cli.checkpoint import CheckpointManager

    seen = []
    monkeypatch.setattr(CheckpointManager, "latest", lambda self: seen.append(self.root) or self.root / "step_000003")
    assert nxt.command() == [*argv, "--resume"]  # a complete checkpoint (as the manager judges it): resumed
    assert seen == [tmp_path / "run" / "checkpoints"]  # the child's run dir, under the job's working directory
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text("{}")
    assert nxt.command() is None and nxt() == 0  # finished as the warning came: nothing to run, the job completes


def test_a_signal_after_the_child_finished_its_run_is_not_a_failure(tmp_path: Path, capsys) -> None:
    """scancel landing while a finished child exits (summary.json written, its last act): the job completes, as the
    rerun would skip the child anyway. Without summary.json the same signal is a failure (the test below)."""
    write_then_die = ("import os, pathlib, signal; p = pathlib.Path('run'); p.mkdir(); (p / 'summary.json').write_text('{}'); "
                      "os.kill(os.getpid(), signal.SIGTERM)")
    job = ChildJob("abl/grpo-s1", [sys.executable, "-c", write_then_die], [], {}, str(tmp_path), "run")
    assert job() == 0
    assert "abl/grpo-s1: finished its run before the signal stopped it (exit -15)" in capsys.readouterr().out


def test_a_child_killed_by_a_signal_is_named_as_stopped(tmp_path: Path) -> None:
    job = ChildJob("abl/grpo-s0", [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
                   [], {}, str(tmp_path), "run")
    with pytest.raises(ChildFailed, match=r"^child abl/grpo-s0 was stopped by SIGTERM \(scancel, or the job's time "
                                          r"limit\); its newest checkpoint is kept$"):
        job()
    ok = ChildJob("abl/dapo-s0", [sys.executable, "-c", "print(__import__('os').environ['DAPO_X'])"], [], {"DAPO_X": "1"},
                  str(tmp_path), "run")
    assert ok() == 0
    assert json.dumps(ok.__getstate__())  # plain data only


class FakeSlurmJob:
    """What :func:`~dapo_cli.ablate.slurm.wait` reads of a submitit SlurmJob: ``done()`` as submitit answers it
    (its sacct state, cached once it reads as ended), the result file, the error and the state it logs."""

    def __init__(self, tmp: Path, job_id: str, sacct_done_from: int) -> None:
        self.job_id, self.looks, self.sacct_done_from = job_id, 0, sacct_done_from
        self.paths = type("Paths", (), {"result_pickle": tmp / f"{job_id}_result.pkl"})()
        self.state, self.error = "FAILED", None

    def done(self) -> bool:
        self.looks += 1
        return self.paths.result_pickle.exists() or self.looks >= self.sacct_done_from

    def exception(self) -> BaseException | None:
        return None if self.paths.result_pickle.exists() else RuntimeError(f"Job {self.job_id} has not produced any output")

    def cancel(self, check: bool = False) -> None:
        raise AssertionError("nothing is cancelled when the wait ends normally")


def fake_submitit() -> object:
    return type("FakeSubmitit", (), {"SlurmJob": FakeSlurmJob})()


def test_a_job_between_its_requeued_attempts_is_waited_for_though_sacct_reads_it_as_ended(tmp_path: Path) -> None:
    """issue 51's flaky cluster test: after a requeue, sacct (what submitit reads) showed the ended attempt as
    FAILED while Slurm's controller held the job again, and the ablation called the child failed. Looks 1-2:
    submitit says ended, no result file, squeue says PENDING then RUNNING: still waited for. Look 3: the requeued
    attempt wrote its result: finished, no failure."""
    from dapo_cli.ablate.slurm import wait

    job = FakeSlurmJob(tmp_path, "7", sacct_done_from=1)
    controller = iter(["PENDING", "RUNNING"])

    def queue(job_id: str) -> str | None:
        assert job_id == "7"
        state = next(controller, None)
        if state == "RUNNING":
            job.paths.result_pickle.write_bytes(b"result")  # the attempt ends before the next look
        return state

    logs: list[str] = []
    assert wait(fake_submitit(), [("grpo-s0", job)], poll_s=0.0, log=logs.append, queue=queue) == []
    assert job.looks == 3 and logs == ["job 7 (grpo-s0): finished"]


@pytest.mark.parametrize("controller", [None, "FAILED", "CANCELLED"])
def test_a_job_that_ended_without_a_result_is_a_failure_once_the_controller_agrees(tmp_path: Path, controller) -> None:
    """No result file, and squeue lists the job as ended (or no longer lists it): the failure is reported at once."""
    from dapo_cli.ablate.slurm import wait

    job = FakeSlurmJob(tmp_path, "9", sacct_done_from=2)
    logs: list[str] = []
    failed = wait(fake_submitit(), [("dapo-s1", job)], poll_s=0.0, log=logs.append, queue=lambda job_id: controller)
    assert failed == ["dapo-s1 (job 9: Job 9 has not produced any output)"]
    assert job.looks == 2 and logs == ["job 9 (dapo-s1): FAILED, failed: Job 9 has not produced any output"]


def test_queue_state_reads_squeue_and_is_none_where_it_cannot_answer(tmp_path: Path, monkeypatch) -> None:
    from dapo_cli.ablate.slurm_jobs import queue_state

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\n[ "$5" = 12 ] && echo pending && exit 0\nexit 1\n')
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert queue_state("12") == "PENDING"
    assert (bin_dir / "args").read_text().split() == ["-h", "-t", "all", "-j", "12", "-o", "%T"]
    assert queue_state("13") is None  # squeue exits 1 for a job id it does not know
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert queue_state("12") is None  # no squeue on this machine


def test_a_rerun_reattaches_to_a_job_sacct_reads_as_ended_while_the_controller_holds_it(monkeypatch) -> None:
    """live_state (the rerun's and --status's view): sacct FAILED but squeue PENDING (a requeue between its attempts)
    is PENDING, so the job is waited for, not submitted twice; sacct FAILED and squeue silent stays FAILED; an active
    sacct state is taken without asking squeue."""
    from dapo_cli.ablate import slurm_jobs
    from dapo_cli.ablate.slurm_jobs import RecordedJob, live_state

    sacct = {"1": "FAILED", "2": "FAILED", "3": "RUNNING"}
    controller = {"1": "PENDING", "2": None}
    asked: list[str] = []

    class Job:
        def __init__(self, folder: str, job_id: str) -> None:
            self.job_id = job_id
            self.watcher = type("W", (), {"get_state": staticmethod(lambda job_id, mode: sacct[job_id])})()

    monkeypatch.setattr(slurm_jobs, "queue_state", lambda job_id: asked.append(job_id) or controller[job_id])
    fake = type("FakeSubmitit", (), {"SlurmJob": Job})()
    assert [live_state(fake, RecordedJob(j, "/f"))[1] for j in ("1", "2", "3")] == ["PENDING", "FAILED", "RUNNING"]
    assert asked == ["1", "2"]
