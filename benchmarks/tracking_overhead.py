"""MLflow's time per RL step as a fraction of the step: SQLite, a local ``mlflow server``, and none.

    .venv/bin/python benchmarks/tracking_overhead.py [--steps 20] [--threads 2] [--server-timeout 90]

Workload: the dapo side of ``benchmarks/rl_step_vs_trl.py`` at 16 new tokens (random-init Qwen2,
8 prompts x 8 samples, one optimizer step per batch: the shortest step, the hardest case for a
fixed per-step cost), with a sample table logged every 5 steps. Each run records the duration
of every call into the tracker (``log_metrics``, ``log_table``, ...) by wrapping the object
``dapo train`` tracks with, and the wall time between the ends of consecutive steps; a step's
tracking time is the sum of the calls made since the previous step ended.

Stores: ``sqlite`` (``sqlite:///…/mlflow.db``, dapo's default kind), ``server``
(``http://127.0.0.1:PORT``: ``mlflow server`` on a SQLite store, started here and stopped
after; if it does not answer within ``--server-timeout`` seconds that row is skipped), and
``none`` (``tracking.backend: null``, the step time without tracking). Each store runs twice:
with ``tracking.background: true`` (the default: a worker thread writes the step's metrics and
tables, the step only queues them; ``dapo_cli/tracking/background.py``) and ``false`` (every call
writes before it returns). The worker thread still shares the two cores with the step, which the
``wall vs none`` column (the whole step's slowdown against the untracked run) shows.
Medians over steps 5 .. ``--steps`` - 1; ``share`` = a step's tracking time / the wall step of the
run without tracking (``none``), so load on the machine during one run does not shrink its share.
The server runs without MLflow's job runner (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import build_policy_dir, machine, median, run_dapo_in_process, table, thread_env
from rl_step_vs_trl import dapo_words

SKIP = 4


def worker(spec: dict) -> None:
    """``dapo train`` in this process with the tracker wrapped in a timer."""
    from dapo_cli import progress
    from dapo_cli.train import loop

    calls: list[tuple[float, float, str]] = []  # (start, seconds, method)
    ends: list[float] = []
    done = progress.StepReporter.step_done

    def step_done(self, step, metrics):
        ends.append(time.perf_counter())
        return done(self, step, metrics)

    class Timed:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            value = getattr(self._inner, name)
            if not callable(value):
                return value

            def timed(*a, **k):
                t0 = time.perf_counter()
                try:
                    return value(*a, **k)
                finally:
                    calls.append((t0, time.perf_counter() - t0, name))
            return timed

    original = loop.open_tracker

    @contextlib.contextmanager
    def open_timed(*a, **k):
        with original(*a, **k) as tracker:
            yield Timed(tracker)

    progress.StepReporter.step_done = step_done
    loop.open_tracker = open_timed
    run_dapo_in_process(spec["words"])
    Path(spec["out"]).write_text(json.dumps({"ends": ends, "calls": calls}))


def run(model: Path, store: str, uri: str, steps: int, threads: int, *, background: bool = True) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="tracking-bench-") as tmp:
        work = Path(tmp)
        words = [str(w) for w in dapo_words(model, work, 16, steps, threads, "fast")]
        words += ["--set", "trainer.log_samples_freq=5"]
        if store == "none":
            words += ["--set", "tracking.backend=null"]
        else:
            store_uri = uri or f"sqlite:///{work / 'mlflow.db'}"
            words += ["--set", f"tracking.tracking_uri={store_uri}", "--set", f"tracking.background={str(background).lower()}"]
        spec = {"words": words, "out": str(work / "out.json")}
        proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], env=thread_env(threads),
                              capture_output=True, text=True, cwd=work)
        if proc.returncode != 0:
            sys.exit(f"{store} run failed:\n{proc.stderr[-3000:]}")
        out = json.loads((work / "out.json").read_text())
    ends, calls = out["ends"], out["calls"]
    walls, tracked, tables = [], [], []
    for i in range(SKIP, len(ends) - 1):  # step i+1 ran between ends[i-1] and ends[i]
        lo, hi = ends[i - 1], ends[i]
        walls.append(hi - lo)
        tracked.append(sum(d for t, d, _ in calls if lo < t <= hi))
        tables.append(sum(d for t, d, name in calls if lo < t <= hi and name == "log_table"))
    mean_tracked = sum(tracked) / len(tracked)
    return {"wall": median(walls), "tracking": median(tracked), "mean_tracking": mean_tracked,
            "table": max(tables) if tables else 0.0}


@contextlib.contextmanager
def mlflow_server(root: Path, timeout: float, *, port: int | None = None, app_name: str | None = None,
                  env: dict[str, str] | None = None, settle: float = 5.0):
    """``mlflow server`` on 127.0.0.1 (its own session; the whole group is stopped on exit).

    Its SQLite store and artifacts are under ``root`` (``server.db``, ``artifacts/``; the log in ``server.log``,
    appended to), so a server started again on the same ``root`` and ``port`` serves the same runs. ``app_name``:
    e.g. ``basic-auth`` (MLflow's auth app; ``env`` then names its config and secret key); ``settle``: seconds
    to wait after the first healthy answer. Yields the URL, or None when it does not answer within ``timeout``."""
    if port is None:
        port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    cmd = [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{root / 'server.db'}", "--artifacts-destination", str(root / "artifacts")]
    if app_name:
        cmd += ["--app-name", app_name]
    log = (root / "server.log").open("a")
    # no job runner: its consumers (GenAI evaluation jobs, periodic tasks) take several CPU-seconds at
    # start-up on these 2 cores, and a tracking server for training never uses them
    server_env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=server_env)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                yield None
                return
            time.sleep(0.5)
        time.sleep(settle)  # let its start-up finish before the run is timed
        yield uri
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--server-timeout", type=float, default=90.0)
    args = parser.parse_args()
    header = machine()
    started = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory(prefix="tracking-bench-") as tmp:
        model = build_policy_dir(Path(tmp) / "model")
        results["none"] = run(model, "none", "", args.steps, args.threads)
        results["sqlite"] = run(model, "sqlite", "", args.steps, args.threads)
        results["sqlite, synchronous"] = run(model, "sqlite", "", args.steps, args.threads, background=False)
        server_root = Path(tmp) / "server"
        server_root.mkdir()
        with mlflow_server(server_root, args.server_timeout) as uri:
            if uri is None:
                print(f"mlflow server did not answer within {args.server_timeout:.0f} s; server row skipped", file=sys.stderr)
            else:
                results["server"] = run(model, "server", uri, args.steps, args.threads)
                results["server, synchronous"] = run(model, "server", uri, args.steps, args.threads, background=False)
    print(f"tracking overhead: dapo RL step at 16 new tokens (8 x 8, random-init Qwen2), {args.threads} threads, "
          f"sample table every 5 steps, median of steps {SKIP + 1}-{args.steps - 1} ({time.perf_counter() - started:.0f} s in all)")
    for line in header:
        print(line)
    print()
    rows = []
    base = results["none"]["wall"]
    for store, r in results.items():
        share = r["tracking"] / base
        rows.append([store, r["wall"], f"{r['wall'] / base - 1:+.1%}", f"{1e3 * r['tracking']:.1f}",
                     f"{1e3 * r['mean_tracking']:.1f}", f"{1e3 * r['table']:.1f}", f"{share:.1%}"])
    print(table(["store", "wall step s", "wall vs none", "tracking ms (median)", "tracking ms (mean)", "log_table ms (max)",
                 "share"], rows))
    print()
    for store in ("sqlite", "sqlite, synchronous", "server", "server, synchronous"):
        if store in results:
            r = results[store]
            print(f"tracking share ({store}): {r['tracking'] / base:.1%} of an untracked step (mean incl. tables: "
                  f"{r['mean_tracking'] / base:.1%})")


if __name__ == "__main__":
    main()
