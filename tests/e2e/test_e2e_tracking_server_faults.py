"""dapo against a real ``mlflow server --app-name basic-auth`` (issue 50): refusals come before anything loads, as one
line; two ablation children at once over HTTP record the same report as a local SQLite store; and the password is
in no file, record, artifact or output of train, eval and ablate. The server's outage: test_e2e_tracking_server.py.

Users: ``admin`` (the server's, from its auth config; only the test's setup uses it), ``alice`` (every dapo command;
her password is the one searched for) and ``bob`` (denied one experiment)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from test_e2e_reliability import clean_env  # noqa: E402
from test_e2e_train import write_config  # noqa: E402

from dapo_cli.cli import app  # noqa: E402
from dapo_cli.data.schema import make_row, write_dapo_parquet  # noqa: E402

pytestmark = [pytest.mark.cluster,  # MLflow's auth client imports starlette's WSGI middleware, deprecated there
              pytest.mark.filterwarnings("ignore:starlette.middleware.wsgi is deprecated")]

ADMIN, ADMIN_PASSWORD = "admin", "admin-pw-3b9d07c1e2"
ALICE, ALICE_PASSWORD = "alice", "alice-pw-8e41f5a6c0d7"  # the secret: found nowhere
BOB, BOB_PASSWORD = "bob", "bob-pw-29c7d1e04b58"
CREDENTIAL_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
CLEAN = {"COLUMNS": "300", "MLFLOW_TRACKING_URI": None, **dict.fromkeys(CREDENTIAL_VARS)}
"""An in-process command's environment: no store or credentials but those a test gives (all restored after)."""
ONLY = ["--ladder", "--only", "grpo", "--only", "grpo+overlong_filtering", "--seeds", "1"]
"""The ablation every test runs: 2 rungs x 1 seed of the e2e config (2 steps each)."""


@contextlib.contextmanager
def logged_in(user: str, password: str) -> Iterator[None]:
    """MLflow's client in this process authenticates as ``user`` until the block ends."""
    before = {var: os.environ.get(var) for var in CREDENTIAL_VARS}
    os.environ.update(zip(CREDENTIAL_VARS, (user, password)))
    try:
        yield
    finally:
        for var, value in before.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def deny(admin, user: str, experiment_id: str) -> None:
    """``user`` may not read the experiment: a DENY grant (MLflow >= 3.x's grants refuse NO_PERMISSIONS), or
    NO_PERMISSIONS through the per-experiment API of older servers."""
    if hasattr(admin, "grant_user_permission"):
        admin.grant_user_permission(user, "experiment", experiment_id, "DENY")
    else:
        admin.create_experiment_permission(experiment_id, user, "NO_PERMISSIONS")


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    """A basic-auth server (default permission READ) with users alice and bob, and two experiments made by the
    admin: ``secret``, which bob is denied, and ``shared``. Yields ``(url, root)``."""
    from mlflow.server.auth.client import AuthServiceClient
    from tracking_overhead import mlflow_server

    root = tmp_path_factory.mktemp("auth-server")
    (root / "auth.ini").write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{root / 'auth.db'}\n"
        f"admin_username = {ADMIN}\nadmin_password = {ADMIN_PASSWORD}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        # each request otherwise hashes its password anew (scrypt): ~0.1 CPU-second, which on 2 cores made a
        # 2-step run's ~100 requests and an ablation's report read-back take minutes
        "auth_cache_ttl_seconds = 600\n"
    )
    env = {"MLFLOW_AUTH_CONFIG_PATH": str(root / "auth.ini"), "MLFLOW_FLASK_SERVER_SECRET_KEY": "e2e-" + "k" * 28}
    with mlflow_server(root, timeout=90, app_name="basic-auth", env=env, settle=1) as url:
        if url is None:
            pytest.fail(f"mlflow server --app-name basic-auth did not start: {(root / 'server.log').read_text()[-2000:]}")
        with logged_in(ADMIN, ADMIN_PASSWORD):
            admin = AuthServiceClient(url)
            admin.create_user(ALICE, ALICE_PASSWORD)
            admin.create_user(BOB, BOB_PASSWORD)
            deny(admin, BOB, MlflowClient(url).create_experiment("secret"))
            MlflowClient(url).create_experiment("shared")  # bob may read it (default_permission), not write to it
        yield url, root


def with_password(url: str, user: str = ALICE, password: str = ALICE_PASSWORD) -> str:
    return url.replace("http://", f"http://{user}:{password}@")


def env_of(user: str | None = None, password: str | None = None) -> dict[str, str]:
    """A child process's environment: no tracking URI or credentials but these."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("MLFLOW_TRACKING_")}
    if user is not None:
        env.update(zip(CREDENTIAL_VARS, (user, password)))
    return env


def dapo(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "dapo_cli", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"dapo {' '.join(args[:2])}: {proc.stderr[-3000:]}"
    return proc


def refused(result, url: str, *needles: str) -> str:
    """The one ``error:`` line of an in-process command refused with exit 2 (no traceback), naming the server."""
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    assert url in errors[0] and all(n in errors[0] for n in needles), errors[0]
    return errors[0]


def test_a_refused_login_or_experiment_is_one_line_before_anything_loads(tmp_path, tiny_model_dir, auth_server, monkeypatch,
                                                                         restore_threads):
    url, _ = auth_server
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = write_config(tmp_path, tiny_model_dir, steps=2)
    data = tmp_path / "two.parquet"
    write_dapo_parquet([make_row(f"What is {i}+1?", str(i + 1), index=i, template="{problem} Answer:") for i in range(2)], data)
    from dapo_cli.models import loading

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    load = loading._load_local
    monkeypatch.setattr(loading, "_load_local", no_loading)  # every load of weights goes through it
    runner = CliRunner()
    wrong = with_password(url, ALICE, "not-alices-password")
    cases = [  # (argv, environment, what the line says)
        (["train", str(config), "--set", f"tracking.tracking_uri={wrong}"], {}, ("user 'alice'", "(HTTP 401)")),
        (["train", str(config), "--set", f"tracking.tracking_uri={url}", "--set", "tracking.experiment=secret"],
         dict(zip(CREDENTIAL_VARS, (BOB, BOB_PASSWORD))), ("user 'bob' access to experiment 'secret' (HTTP 403)",)),
        (["ablate", str(config), *ONLY, "--jobs", "2", "--set", f"tracking.tracking_uri={url}"], {},
         ("asks for credentials and none are set", "$MLFLOW_TRACKING_USERNAME and $MLFLOW_TRACKING_PASSWORD")),
        (["eval", str(tiny_model_dir), "--dataset", str(data), "--avg", "2", "--max-tokens", "4", "--tracking-uri", url,
          "--experiment", "secret", "--output", str(tmp_path / "eval")], dict(zip(CREDENTIAL_VARS, (BOB, BOB_PASSWORD))),
         ("(HTTP 403)",)),
    ]
    with logged_in(ADMIN, ADMIN_PASSWORD):
        recorded = run_ids(MlflowClient(url))
    for argv, env, needles in cases:
        t0 = time.monotonic()
        result = runner.invoke(app, argv, env={**CLEAN, **env})
        refused(result, url, *needles)
        assert "not-alices-password" not in result.output and BOB_PASSWORD not in result.output
        assert time.monotonic() - t0 < 30, argv[0]  # no model loaded, no child started
        # nothing claimed: no run directory, no eval output, no local store
        assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml", "two.parquet"], argv[0]
    # bob may read experiment `shared` but not write to it: that is found when the run is created, after the
    # model loaded; the same kind of line, and the run folder is removed
    monkeypatch.setattr(loading, "_load_local", load)
    result = runner.invoke(app, ["train", str(config), "--no-dynamic-sampling", "--set", f"tracking.tracking_uri={url}",
                                 "--set", "tracking.experiment=shared"], env={**CLEAN, **dict(zip(CREDENTIAL_VARS, (BOB, BOB_PASSWORD)))})
    refused(result, url, "user 'bob' access to experiment 'shared' (HTTP 403)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml", "two.parquet"]
    with logged_in(ADMIN, ADMIN_PASSWORD):  # and nothing recorded on the server
        assert run_ids(MlflowClient(url)) == recorded


def run_ids(client: MlflowClient) -> set[str]:
    """Every run of every experiment on the server (as the client's user sees them)."""
    return {r.info.run_id for e in client.search_experiments() for r in client.search_runs([e.experiment_id])}


def decided(report: dict) -> str:
    """An ablation report without what differs between two runs of it (run ids, its name, the parent's tags:
    times, URIs), as canonical JSON (a NaN equals a NaN)."""
    out = {k: v for k, v in report.items() if k not in ("parent_run_id", "name", "tags")}
    out["children"] = [{k: v for k, v in c.items() if k != "run_id"} for c in report["children"]]
    return json.dumps(out, sort_keys=True, default=str)


def the_ablation(client: MlflowClient, experiment: str):
    """The one ablation parent run in ``experiment`` and the runs nested under it."""
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    (parent,) = [r for r in runs if "ablate.id" in r.data.tags and "mlflow.parentRunId" not in r.data.tags]
    return parent, [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]


@pytest.fixture()
def restore_threads():
    """An in-process child sets torch's process-wide thread count from engine.num_threads: give the worker its own back."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_train_eval_and_ablate_over_http_record_everything_and_the_password_nowhere(tmp_path, tiny_model_dir, auth_server,
                                                                                   monkeypatch, restore_threads):
    from dapo_cli.ablate.report import build_report

    url, server_root = auth_server
    secret_uri = with_password(url)
    work, by_http, by_sqlite = (tmp_path / name for name in ("work", "ablate-http", "ablate-sqlite"))
    for folder in (work, by_http, by_sqlite):
        folder.mkdir()
    outputs: list[str] = []  # everything every command printed
    # 1. train: the password in the environment
    config = write_config(work, tiny_model_dir, steps=2)
    train = dapo(["train", str(config), "--no-dynamic-sampling", "--set", f"tracking.tracking_uri={url}"], work,
                 env_of(ALICE, ALICE_PASSWORD))
    # 2. eval of its checkpoint: the password in the URI; the eval run joins the training run's experiment
    checkpoint = next((work / "runs").rglob("step_000002")) / "model"
    data = work / "two.parquet"
    write_dapo_parquet([make_row(f"What is {i}+1?", str(i + 1), index=i, template="{problem} Answer:") for i in range(2)], data)
    evaluated = dapo(["eval", str(checkpoint), "--dataset", str(data), "--avg", "2", "--max-tokens", "4",
                      "--tracking-uri", secret_uri, "--output", str(work / "eval")], work, env_of())
    # 3. ablate --launcher print: the children's commands, printed for a scheduler
    http_config = write_config(by_http, tiny_model_dir, steps=2)
    printed = dapo(["ablate", str(http_config), *ONLY, "--launcher", "print", "--set", f"tracking.tracking_uri={secret_uri}"],
                   by_http, env_of())
    commands = [line for line in printed.stdout.splitlines() if " dapo train " in line]
    assert len(commands) == 2 and all(f"tracking.tracking_uri={url} " in c for c in commands), printed.stdout
    # 4. the same ablation run: two children at once, each a process, over HTTP; and on a local SQLite store
    sqlite_config = write_config(by_sqlite, tiny_model_dir, steps=2)
    sqlite_run = subprocess.Popen([sys.executable, "-m", "dapo_cli", "ablate", str(sqlite_config), *ONLY, "--jobs", "2",
                                   "--set", f"tracking.tracking_uri=sqlite:///{by_sqlite / 'mlflow.db'}"],
                                  cwd=by_sqlite, env=env_of(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ablated = dapo(["ablate", str(http_config), *ONLY, "--jobs", "2", "--set", f"tracking.tracking_uri={secret_uri}"],
                   by_http, env_of())
    assert sqlite_run.wait(timeout=600) == 0, sqlite_run.stderr.read()[-3000:]
    # 5. ablate in this process (--jobs 1), the password in the environment: another experiment, one rung
    monkeypatch.chdir(by_http)
    in_process = CliRunner().invoke(app, ["ablate", str(http_config), "--ladder", "--only", "grpo", "--seeds", "1",
                                          "--set", f"tracking.tracking_uri={url}", "--set", "tracking.experiment=e2e-inproc"],
                                    env={**CLEAN, **dict(zip(CREDENTIAL_VARS, (ALICE, ALICE_PASSWORD)))})
    assert in_process.exit_code == 0, in_process.output
    outputs += [p.stdout + p.stderr for p in (train, evaluated, printed, ablated)] + [in_process.output]

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ALICE)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ALICE_PASSWORD)
    client = MlflowClient(url)
    # what the server holds: the training run with both steps, the eval run beside it
    runs = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
    trained = [r for r in runs if r.data.tags.get("dapo.command", "").startswith("dapo train") and "mlflow.parentRunId" not in r.data.tags]
    evals = [r for r in runs if r.data.tags.get("dapo.source_run_id")]
    assert len(trained) == 1 and trained[0].info.status == "FINISHED" and len(evals) == 1
    assert [m.step for m in client.get_metric_history(trained[0].info.run_id, "train/samples_generated")] == [1, 2]
    assert evals[0].data.tags["dapo.source_run_id"] == trained[0].info.run_id and evals[0].info.status == "FINISHED"
    # the ablation over HTTP: its children nested under its parent, every step once, the report the SQLite one's
    local = MlflowClient(f"sqlite:///{by_sqlite / 'mlflow.db'}")
    reports = []
    for store in (client, local):
        parent, children = the_ablation(store, "e2e")
        assert parent.info.status == "FINISHED"
        assert sorted((c.data.tags["mlflow.parentRunId"], c.data.tags["ablate.variant"], c.info.status) for c in children) == [
            (parent.info.run_id, "grpo", "FINISHED"), (parent.info.run_id, "grpo+overlong_filtering", "FINISHED")]
        for child in children:
            assert [m.step for m in store.get_metric_history(child.info.run_id, "train/samples_generated")] == [1, 2]
        report = asdict(build_report(store, parent))
        assert len(report["children"]) == 2 and all(c["curves"]["actor/entropy"] for c in report["children"])
        reports.append(decided(report))
    assert reports[0] == reports[1]  # read back from the server = read back from the SQLite store
    written = [json.loads(next((folder / "runs" / "e2e").rglob("report.json")).read_text()) for folder in (by_http, by_sqlite)]
    assert decided(written[0]) == decided(written[1])  # and the report.json each command wrote
    inproc_parent, inproc_children = the_ablation(client, "e2e-inproc")
    assert [c.data.tags["mlflow.parentRunId"] for c in inproc_children] == [inproc_parent.info.run_id]

    # the password: in nothing printed, in no param, tag or artifact on the server, in no file here or the server's
    assert all(ALICE_PASSWORD not in text for text in outputs)
    downloads = tmp_path / "downloaded"
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id]):
            values = [*run.data.params.values(), *run.data.tags.values(), run.info.run_name or ""]
            assert [v for v in values if ALICE_PASSWORD in v] == []
            client.download_artifacts(run.info.run_id, "", str(downloads / run.info.run_id))
    files = [p for root in (tmp_path, server_root) for p in root.rglob("*") if p.is_file()]
    assert len([p for p in files if p.is_relative_to(downloads)]) >= 10 and any(p.name == "server.db" for p in files)
    assert [p for p in files if ALICE_PASSWORD.encode() in p.read_bytes()] == []

    # later, without the credentials: a resume and an eval against the server say where they go, in one line
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    monkeypatch.chdir(work)
    runner = CliRunner()
    for argv in (["train", str(config), "--no-dynamic-sampling", "--resume", "--set", f"tracking.tracking_uri={url}"],
                 ["eval", str(checkpoint), "--dataset", str(data), "--avg", "2", "--max-tokens", "4", "--tracking-uri", url]):
        refused(runner.invoke(app, argv, env=CLEAN), url,
                "asks for credentials and none are set", "$MLFLOW_TRACKING_USERNAME and $MLFLOW_TRACKING_PASSWORD")
