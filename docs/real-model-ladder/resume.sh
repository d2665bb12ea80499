#!/bin/bash
# Starts or resumes issue 49's ladder (docs/real-model-ladder.md, "The run's settings") so that a lost machine
# loses only the children in flight:
#   1. the children run the predictions commit (668c595) from a worktree at /work/ladder-wt;
#   2. the run dir is /work/ladder-run (MLflow records absolute artifact paths, so it must be this path);
#      if it has no store yet and the repo holds docs/real-model-ladder/run-state.tar.xz, the state is restored
#      from it, and `dapo ablate` skips every child whose run is FINISHED with a summary.json;
#   3. beside the driver a loop removes each finished child's final checkpoint (1.6 GB, nothing reads it) and,
#      each time a child finishes, writes the state again (SQLite backup of mlflow.db, mlartifacts/, the run
#      dirs without checkpoints) as run-state.tar.xz (temp file, then rename), to be committed.
# Usage, from the repo root after `make setup smollm2`: docs/real-model-ladder/resume.sh
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WT=/work/ladder-wt RUN=/work/ladder-run STATE="$REPO/docs/real-model-ladder/run-state.tar.xz" PY="$REPO/.venv/bin/python"
[ -d "$WT" ] || git -C "$REPO" worktree add --detach "$WT" 668c595
mkdir -p "$RUN" && cd "$RUN"
if [ ! -f mlflow.db ] && [ -f "$STATE" ]; then
  tar -xJf "$STATE" -C "$RUN"
  echo "$(date -u +%T) restored from $STATE" >> "$RUN/pauses.log"
fi

snapshot() {
  local tmp; tmp=$(mktemp -d)
  "$PY" -c "import sqlite3,sys; s=sqlite3.connect('mlflow.db'); d=sqlite3.connect(sys.argv[1]); s.backup(d); d.close()" "$tmp/mlflow.db"
  tar -cf "$tmp/state.tar" --exclude='checkpoint*' --exclude='.lock' mlartifacts runs $(ls run.log pauses.log clean.log 2>/dev/null)
  tar -rf "$tmp/state.tar" -C "$tmp" mlflow.db
  xz -T1 -6 -c "$tmp/state.tar" > "$STATE.tmp" && mv "$STATE.tmp" "$STATE"
  rm -rf "$tmp"
  echo "$(date -u +%T) snapshot $(du -h "$STATE" | cut -f1)" >> "$RUN/clean.log"
}

keep() {  # the cleaner and snapshotter, every minute while the driver runs
  local done_before=-1
  while kill -0 "$1" 2>/dev/null; do
    local n=0
    for s in runs/dapo-smollm2-ladder/*/*/summary.json; do
      [ -f "$s" ] || continue
      n=$((n + 1))
      rm -rf "$(dirname "$s")"/checkpoint*
    done
    if [ "$n" != "$done_before" ] && [ -f mlflow.db ]; then snapshot; done_before=$n; fi
    sleep 60
  done
  snapshot
}

D=@adv_estimator=dr_grpo
PYTHONPATH="$WT" /usr/bin/time -v "$PY" -m dapo_cli ablate "$WT/experiments/smollm2-ladder.yaml" \
    --ladder --seeds auto --max-seeds 8 --axis algorithm.adv_estimator=grpo,dr_grpo \
    --skip "grpo$D" --skip "grpo+overlong_filtering$D" --skip "grpo+overlong_filtering+clip_higher$D" \
    --skip "grpo+overlong_filtering+clip_higher+overlong_shaping+token_level_loss$D" >> "$RUN/run.log" 2>&1 &
driver=$!
echo "$(date -u +%T) driver $driver started" >> "$RUN/pauses.log"
keep "$driver"
wait "$driver"
