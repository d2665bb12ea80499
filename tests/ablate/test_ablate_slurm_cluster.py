"""`dapo ablate --launcher slurm` against a real one-node Slurm (issue 50): sbatch jobs, states from sacct, scancel,
a driver killed or detached, the same report as the local launcher. `make test-cluster` starts the cluster
(.ci/slurm-up: munged, MariaDB, slurmdbd, slurmctld, slurmd) and runs these as root; `make test` deselects them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fixtures.experiment import write_experiment  # noqa: E402
from test_ablate_e2e import config_dict  # noqa: E402

pytestmark = pytest.mark.cluster

EXPERIMENT = "e2e-slurm"


@pytest.fixture(scope="module")
def slurm() -> None:
    """The cluster .ci/slurm-up started: a missing one fails the test (make test-cluster starts it), never skips it."""
    try:
        up = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.fail("no Slurm here: `make test-cluster` (as root) starts one with .ci/slurm-up")
    assert up.returncode == 0 and "UP" in up.stdout, f"Slurm's controller is not up: {up.stdout}{up.stderr}"


def write_config(tmp: Path, model_dir: Path, *, steps: int = 2) -> Path:
    """2 prompts × 2 samples of ≤ 8 tokens, a checkpoint after every step, 4 val problems × 2 samples; one CPU and
    one thread per child job, so the 2-CPU node runs two children at once."""
    cfg = config_dict(model_dir)  # test_ablate_e2e's tiny ablation: 2 prompts x 2 samples of <= 8 tokens
    cfg["trainer"].update(total_steps=steps, collapse_patience=0)  # the untrained policy keeps no group: train on
    cfg["ablate"] = {"slurm": {"cpus_per_task": 1, "timeout_min": 10, "signal_delay_s": 60, "poll_s": 1.0}}
    return write_experiment(tmp, cfg, EXPERIMENT)


def env() -> dict[str, str]:
    out = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "MLFLOW_TRACKING_URI"):
        out.pop(var, None)
    return out


def ablate_argv(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dapo_cli", "ablate", str(config), "--ladder", "--only", "grpo", "--only", "dapo",
            "--seeds", "2", "--launcher", "slurm", *extra]


def run(argv: list[str], cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)


def ablation_dir(work: Path) -> Path:
    (found,) = (work / "runs" / EXPERIMENT).iterdir()
    return found


def recorded_jobs(work: Path) -> dict[str, str]:
    """child run name (last part) → Slurm job id, from the driver's record."""
    data = json.loads((ablation_dir(work) / "slurm-jobs.json").read_text())
    return {name.rsplit("/", 1)[-1]: v["job_id"] for name, v in data["jobs"].items()}


def sacct_states(job_ids: list[str]) -> dict[str, str]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", *(f"-j{j}" for j in job_ids)],
                         capture_output=True, text=True, check=True).stdout
    return {line.split("|")[0]: line.split("|")[1].split()[0] for line in out.splitlines() if line}


def wait_for(what: str, check, timeout: float = 240, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def comparable(report: dict) -> dict:
    """What a report says: every child's accuracies, per-problem scores and curves, the rows and the table (not run
    ids, names or paths)."""
    children = sorted(({k: v for k, v in c.items() if k != "run_id"} for c in report["children"]),
                      key=lambda c: (c["variant"], c["seed"]))
    return {"children": children, "rows": report["rows"], "table": report["table"], "mechanisms": report["mechanisms_table"]}


SECRET = "pw-slurm-3e9a1c-not-anywhere"


def test_the_tiny_ladder_through_slurm_gives_the_local_report(tmp_path, tiny_model_dir, slurm):
    """The same ablation through Slurm and here: the same report. The tracking credentials a user has exported
    (read by the jobs from the environment sbatch passes on) are in none of the files the jobs and submitit wrote."""
    local, cluster = tmp_path / "local", tmp_path / "cluster"
    for work in (local, cluster):
        work.mkdir()
    proc = run(ablate_argv(write_config(local, tiny_model_dir))[:-2] + ["--launcher", "local"], local)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with_secret = {**env(), "MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": SECRET}
    proc = subprocess.run(ablate_argv(write_config(cluster, tiny_model_dir)), cwd=cluster, env=with_secret,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert SECRET not in proc.stdout + proc.stderr
    written = [p for p in cluster.rglob("*") if p.is_file()]
    assert any(p.name.endswith("_submitted.pkl") for p in written) and any(p.name.endswith("_log.out") for p in written)
    assert [p for p in written if SECRET.encode() in p.read_bytes()] == []
    jobs = recorded_jobs(cluster)
    assert sorted(jobs) == ["dapo-s0", "dapo-s1", "grpo-s0", "grpo-s1"]
    assert set(sacct_states(list(jobs.values())).values()) == {"COMPLETED"}  # real sbatch jobs, as sacct knows them
    for job_id in jobs.values():
        assert re.search(rf"job {job_id} \(.*\): finished", proc.stderr), proc.stderr[-3000:]
    reports = [json.loads((ablation_dir(w) / "report" / "report.json").read_text()) for w in (local, cluster)]
    assert comparable(reports[0]) == comparable(reports[1])
    assert len(reports[1]["children"]) == 4


def checkpoints(work: Path, child: str) -> list[str]:
    folder = ablation_dir(work) / child / "checkpoints"
    return sorted(p.name for p in folder.glob("step_*")) if folder.is_dir() else []


def test_a_cancelled_child_is_named_and_the_rerun_resumes_only_it(tmp_path, tiny_model_dir, slurm):
    """scancel of one running child (after its first checkpoint): the driver waits for the others, then fails with
    one line naming the cancelled child and its job; the same command again skips the three that finished and
    resumes that one from its checkpoint, as a new job. 20 steps (~1 s each): the cancel lands mid-run, not as the
    child ends (with 6 a loaded machine let grpo-s1 finish first; its run then counts as finished)."""
    config = write_config(tmp_path, tiny_model_dir, steps=20)
    driver = subprocess.Popen(ablate_argv(config), cwd=tmp_path, env=env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        started = tmp_path / "runs" / EXPERIMENT  # runs/ can exist (submitit's runs/slurm) before the ablation's dir
        wait_for("grpo-s1's first checkpoint",
                 lambda: started.is_dir() and any(started.iterdir()) and checkpoints(tmp_path, "grpo-s1"))
        victim = recorded_jobs(tmp_path)["grpo-s1"]
        subprocess.run(["scancel", victim], check=True)
        out, err = driver.communicate(timeout=400)
    finally:
        driver.kill()
    assert driver.returncode == 2, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert re.search(rf"1 of 4 job\(s\) failed: .*/grpo-s1 \(job {victim}: child .*/grpo-s1 was stopped by SIGTERM "
                     r"\(scancel, or the job's time limit\); its newest checkpoint is kept\)", line), line
    assert "rerun the same command to resume them" in line and "Traceback" not in err
    first = recorded_jobs(tmp_path)
    again = run(ablate_argv(config), tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("finished earlier, skipped") == 3
    (resumed,) = [x for x in again.stderr.splitlines() if "submitted job" in x]
    assert "grpo seed 1: submitted job" in resumed and resumed.endswith("(resuming)")
    after = recorded_jobs(tmp_path)
    assert after["grpo-s1"] != victim and {k: v for k, v in after.items() if k != "grpo-s1"} == {
        k: v for k, v in first.items() if k != "grpo-s1"}
    report = json.loads((ablation_dir(tmp_path) / "report" / "report.json").read_text())
    assert len(report["children"]) == 4


def test_a_detached_ablation_outlives_its_driver_and_the_rerun_reattaches(tmp_path, tiny_model_dir, slurm):
    """--detach submits and returns; --status reads every child from Slurm and MLflow and starts nothing; a waiting
    driver killed with SIGKILL leaves the jobs running; the rerun re-attaches to them (no job submitted twice), waits
    and writes the report; --status then says all finished."""
    config = write_config(tmp_path, tiny_model_dir, steps=30)  # ~30 s a child: still running when the driver is killed
    detached = run(ablate_argv(config, "--detach"), tmp_path, timeout=120)
    assert detached.returncode == 0, detached.stderr[-3000:]
    assert "detached: 4 job(s) queued or running" in detached.stderr and "--status" in detached.stdout
    jobs = recorded_jobs(tmp_path)
    assert len(jobs) == 4 and all(state in ("PENDING", "RUNNING") for state in sacct_states(list(jobs.values())).values())
    status = run(ablate_argv(config, "--status"), tmp_path, timeout=120)
    assert status.returncode == 0, status.stderr[-3000:]
    for name, job_id in jobs.items():
        variant, seed = name.rsplit("-s", 1)
        assert re.search(rf"{variant} seed {seed}: (finished|job {job_id}: (PENDING|RUNNING))", status.stdout), status.stdout
    assert "children finished; the report is written once all have" in status.stdout
    assert not (ablation_dir(tmp_path) / "report").exists()

    log = tmp_path / "driver.log"
    with log.open("w") as out:
        driver = subprocess.Popen(ablate_argv(config), cwd=tmp_path, env=env(), stdout=out, stderr=out, text=True)
        try:
            wait_for("the driver to wait for its jobs", lambda: driver.poll() is not None or "waiting for" in log.read_text(),
                     timeout=120)
            assert driver.poll() is None, log.read_text()[-3000:]
            assert log.read_text().count("re-attached to job") >= 1 and "submitted job" not in log.read_text()
        finally:
            driver.send_signal(signal.SIGKILL)
            driver.wait(timeout=30)
    final = run(ablate_argv(config), tmp_path)
    assert final.returncode == 0, final.stderr[-3000:]
    # every child re-attached to or, if its job ended meanwhile, finished: none submitted again
    assert final.stderr.count("re-attached to job") + final.stderr.count("finished earlier, skipped") == 4, final.stderr
    assert "submitted job" not in final.stderr
    assert recorded_jobs(tmp_path) == jobs  # nothing submitted twice
    assert set(sacct_states(list(jobs.values())).values()) == {"COMPLETED"}  # the kill cancelled no job
    all_jobs = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobName", "-S", "now-1hours"], capture_output=True,
                              text=True, check=True).stdout.split()
    assert sorted(n for n in all_jobs if n.startswith(ablation_dir(tmp_path).name)) == sorted(
        f"{ablation_dir(tmp_path).name}/{name}" for name in jobs)
    assert (ablation_dir(tmp_path) / "report" / "report.json").is_file()
    done = run(ablate_argv(config, "--status"), tmp_path, timeout=120)
    assert done.returncode == 0 and "4/4 children finished; writing the report" in done.stdout, done.stdout + done.stderr

