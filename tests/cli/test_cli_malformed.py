"""Bad input to every command: exit 2, exactly one ``error:`` line, no traceback, nothing left behind.

The promise of the CLI (docs/reliability.md): whatever is wrong with what the user typed or
pointed at, ``dapo`` prints one line starting ``error:`` that says what to fix, exits 2, and
writes nothing: no output file, no run directory, no MLflow store. Each case below runs in a
fresh, otherwise empty working directory with ``$MLFLOW_TRACKING_URI`` unset, and the
directory listing after the command must equal the listing before it.

Read-only outputs: the tests run as root, for whom ``chmod`` changes nothing, so they use a
read-only tmpfs mount (skipped where mounting is not permitted) or a file where a directory
is expected.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from malformed_harness import Case, case, places_for, run_case


M = ("--set", "model.path={model}")  # a real local model: nothing builds builtin:tiny
EVAL = ("eval", "{model}", "--dataset", "{data}", "--avg", "2", "--max-tokens", "4")
TECHNIQUES = "valid: overlong_filtering, clip_higher, overlong_shaping, token_level_loss, dynamic_sampling"

CASES = [
    # ------------------------------------------------------------ usage errors (Click), any command
    case("top-unknown-command", "fly", expect="No such command 'fly'; see 'dapo --help'"),
    case("top-unknown-option", "--bogus", expect="No such option: --bogus; see 'dapo --help'"),
    case("train-unknown-option", "train", "--bogus",
         expect="No such option: --bogus (Possible options: --verbose); see 'dapo train --help'"),  # Click's guess
    case("eval-bad-choice", "eval", "{model}", "--engine", "foo", expect="Invalid value for '--engine': 'foo' is not one of"),
    case("eval-not-an-int", "eval", "{model}", "--avg", "many", expect="Invalid value for '--avg'"),
    case("report-missing-argument", "report", expect="Missing argument"),
    case("config-set-without-value", "config", "--set", expect="Option '--set' requires an argument"),
    case("ablate-bad-launcher", "ablate", "--ladder", "--launcher", "ssh", expect="Invalid value for '--launcher'"),
    case("lint-unknown-option", "lint", "--strictly", expect="No such option: --strictly"),
    case("prepare-n-not-an-int", "prepare-data", "--synthetic", "add-3digit", "--n", "abc", "-o", "x.parquet",
         expect="Invalid value for '--n'"),
    # ------------------------------------------------------------ config files and --set (config, lint, train)
    case("config-binary-file", "config", "bin.yaml", expect="config bin.yaml is not a UTF-8 text file", setup=("bin.yaml",)),
    case("config-directory", "config", "adir", expect="config adir is a directory; give a YAML file", setup=("adir",)),
    case("config-missing", "config", "nope.yaml", expect="config file not found: nope.yaml"),
    case("config-bad-yaml", "config", "bad.yaml", expect="bad.yaml is not valid YAML at line 2", setup=("bad.yaml",)),
    case("config-yaml-list", "config", "list.yaml", expect="must hold a mapping of sections", setup=("list.yaml",)),
    case("config-set-no-equals", "config", "--set", "trainer.lr", expect="must look like section.key=value"),
    case("config-unknown-key", "config", "--set", "trainer.lrr=1e-6", expect="did you mean 'trainer.lr'?"),
    case("config-not-a-number", "config", "--set", "trainer.lr=fast", expect="trainer.lr must be a number, got 'fast'"),
    case("config-eval-temperature", "config", "--set", "eval.temperature=-1", expect="eval.temperature=-1.0 must be >= 0"),
    case("config-synthetic-val-size", "config", "--set", "data.synthetic_val_size=0",
         expect="data.synthetic_val_size=0 must be >= 1: data.val_files generates synthetic:add-3digit"),
    case("lint-directory", "lint", "adir", expect="config adir is a directory", setup=("adir",)),
    case("lint-invalid-value", "lint", "--set", "rollout.n=1", expect="rollout.n=1: group advantages"),
    case("lint-toggle-contradicts-set", "lint", "--clip-higher", "--set", "algorithm.clip_ratio_high=0.2",
         expect="--clip-higher contradicts --set algorithm.clip_ratio_high=0.2"),
    # ------------------------------------------------------------ train
    case("train-truncated-weights", "train", "--set", "model.path={trunc}",
         expect="model.safetensors is truncated or corrupt"),
    case("train-garbage-weights", "train", "--set", "model.path={garbage}", expect="model.safetensors has a corrupt header"),
    case("train-no-weights", "train", "--set", "model.path={noweights}", expect="it holds no weights"),
    case("train-weights-misfit-config", "train", "--set", "model.path={wrongshape}", expect="its weights do not fit its config.json"),
    case("train-model-not-found", "train", "--set", "model.path=./no/such/model", expect="model directory not found"),
    case("train-resume-corrupt-checkpoint", "train", "--resume", *M, expect="has no complete checkpoint (step_000001: model/model.safetensors has a corrupt header",
         setup=("corrupt-run",)),
    case("train-resume-nothing", "train", "--resume", *M, expect="--resume: no checkpoint of a run named 'dapo-s0'"),
    case("train-validation-max-tokens", "train", *M, "--set", "validation.max_tokens=-7", expect="validation.max_tokens=-7 must be >= 0"),
    case("train-validation-temperature", "train", *M, "--set", "validation.temperature=-1", expect="validation.temperature=-1.0 must be >= 0"),
    case("train-float16-on-cpu", "train", *M, "--set", "engine.device=cpu", "--set", "model.dtype=float16",
         expect="model.dtype=float16 trains on the CPU here"),
    case("train-output-dir-is-a-file", "train", *M, "--set", "trainer.output_dir=afile",
         expect="trainer.output_dir afile is a file, not a directory", setup=("afile",)),
    case("train-output-dir-read-only", "train", *M, "--set", "trainer.output_dir={ro}/runs",
         expect="is on a read-only file system; give a writable trainer.output_dir", read_only=True),
    case("train-clip-inverted", "train", *M, "--set", "algorithm.clip_ratio_high=0.1",
         expect="algorithm.clip_ratio_high=0.1 must be >= algorithm.clip_ratio_low=0.2; equal turns clip-higher off"),
    case("train-toggle-contradicts-set", "train", "--no-clip-higher", "--set", "algorithm.clip_ratio_high=0.28",
         expect="--no-clip-higher contradicts --set algorithm.clip_ratio_high=0.28"),
    case("train-dynamic-sampling-contradicts-set", "train", "--no-dynamic-sampling", "--set", "algorithm.filter_groups.enable=true",
         expect="--no-dynamic-sampling contradicts --set algorithm.filter_groups.enable=true"),
    case("train-synthetic-val-size", "train", *M, "--set", "data.synthetic_val_size=0", expect="data.synthetic_val_size=0 must be >= 1"),
    case("train-bogus-tracking-uri", "train", *M, "--set", "tracking.tracking_uri=bogus://::", expect="unsupported scheme 'bogus:'"),
    case("train-store-read-only", "train", *M, "--set", "tracking.tracking_uri=sqlite:///{ro}/mlflow.db",
         expect="is on a read-only file system; use a writable directory", read_only=True),
    case("train-store-is-a-directory", "train", *M, "--set", "tracking.tracking_uri=sqlite:///adir",
         expect="adir is a directory; name a database file", setup=("adir",)),
    case("train-dataset-missing", "train", *M, "--set", "data.train_files=[missing.parquet]",
         expect="data.train_files: dataset file not found: missing.parquet"),
    case("train-dataset-directory", "train", *M, "--set", "data.val_files=[adir]",
         expect="data.val_files: adir is a directory", setup=("adir",)),
    case("train-dataset-unknown-name", "train", *M, "--set", "data.val_files=[aime99]", expect="unknown dataset 'aime99'"),
    case("train-prompts-all-too-long", "train", *M, "--set", "data.max_prompt_length=1",
         expect="the training set is empty after filtering"),
    case("train-plan-option-without-dry-run", "train", "--world-size", "2", expect="--world-size only works with --dry-run"),
    case("train-tiny-heads", "train", "--set", "model.tiny.hidden_size=30",
         expect="model.tiny.hidden_size=30 must be divisible by model.tiny.num_heads=4"),
    # ------------------------------------------------------------ eval
    case("eval-truncated-weights", "eval", "{trunc}", "--dataset", "{data}", "--output", "out",
         expect="model.safetensors is truncated or corrupt"),
    case("eval-garbage-weights", "eval", "{garbage}", "--dataset", "{data}", expect="model.safetensors has a corrupt header"),
    # found only while the model loads, after the MLflow run opened (dapo_cli/eval/run.py): --no-track here
    case("eval-weights-misfit-config", "eval", "{wrongshape}", "--dataset", "{data}", "--avg", "1", "--max-tokens", "2",
         "--output", "out", "--no-track", expect="its weights do not fit its config.json", progress_first=True),
    case("eval-no-config", "eval", "adir", expect="holds no config.json", setup=("adir",)),
    case("eval-no-checkpoint", "eval", expect="give a CHECKPOINT to evaluate"),
    case("eval-max-tokens-zero", *EVAL, "--max-tokens", "0", expect="--max-tokens=0 must be >= 1"),
    case("eval-batch-size-negative", *EVAL, "--batch-size", "-3", expect="--batch-size=-3 must be >= 0"),
    case("eval-avg-huge", *EVAL, "--avg", str(10**12), expect="--avg=1000000000000 is more than 4096 samples per problem"),
    case("eval-avg-zero", *EVAL, "--avg", "0", expect="--avg must be at least 1 (got 0)"),
    case("eval-pass-k-above-avg", *EVAL, "--pass-k", "8", expect="--pass-k values must lie in 1..2"),
    case("eval-limit-zero", *EVAL, "--limit", "0", expect="--limit must be at least 1"),
    case("eval-temperature-negative", *EVAL, "--temperature", "-1", expect="--temperature=-1.0 must be >= 0 (0: greedy decoding"),
    case("eval-top-p-zero", *EVAL, "--top-p", "0", expect="--top-p=0.0 must be in (0, 1]"),
    case("eval-top-p-above-one", *EVAL, "--top-p", "1.5", expect="--top-p=1.5 must be in (0, 1]"),
    case("eval-output-is-a-file", *EVAL, "--output", "afile", expect="--output afile is a file, not a directory", setup=("afile",)),
    case("eval-output-read-only", *EVAL, "--output", "{ro}/out", expect="is on a read-only file system; give a writable --output",
         read_only=True),
    case("eval-dataset-directory", *EVAL, "--dataset", "adir", expect="dataset adir is a directory", setup=("adir",)),
    case("eval-dataset-empty", *EVAL, "--dataset", "empty.parquet", "--output", "out", expect="empty.parquet holds no rows",
         setup=("empty.parquet",)),
    case("eval-dataset-binary", *EVAL, "--dataset", "bin.yaml", expect="cannot tell the format of bin.yaml", setup=("bin.yaml",)),
    case("eval-bogus-tracking-uri", *EVAL, "--tracking-uri", "bogus://::", expect="unsupported scheme 'bogus:'"),
    case("eval-store-read-only", *EVAL, "--tracking-uri", "sqlite:///{ro}/mlflow.db", expect="is on a read-only file system",
         read_only=True),
    case("eval-compare-missing", "eval", "--compare", "a", "b", expect="comparison input not found: a"),
    # ------------------------------------------------------------ ablate
    case("ablate-unknown-technique", "ablate", "--grid", "clip_higher,foo", "--dry-run", "--no-calibrate",
         expect=f"unknown technique 'foo'; {TECHNIQUES}"),
    case("ablate-misspelt-technique", "ablate", "--grid", "clip_higer", "--dry-run", "--no-calibrate",
         expect="unknown technique 'clip_higer'; did you mean 'clip_higher'?"),
    case("ablate-both-modes", "ablate", "--ladder", "--grid", expect="give exactly one of --ladder"),
    case("ablate-no-mode", "ablate", expect="give exactly one of --ladder"),
    case("ablate-config-directory", "ablate", "adir", "--ladder", expect="config adir is a directory", setup=("adir",)),
    case("ablate-seeds-zero", "ablate", "--ladder", "--seeds", "0", "--dry-run", "--no-calibrate", expect="--seeds must be a positive number or auto"),
    # sizes asked for are counted before any work (issue 54: a billion seeds took the planner past 5 GB)
    case("ablate-seeds-billion", "ablate", "--ladder", "--seeds", "1000000000", "--dry-run", "--no-calibrate",
         expect="this ablation is 6,000,000,000 children (6 variants x 1 axis combinations x 1,000,000,000 seeds); at most 2,000"),
    case("ablate-seeds-5000-digits", "ablate", "--ladder", "--seeds", "9" * 5000, "--dry-run", "--no-calibrate",
         expect="--seeds must be a positive number or auto"),
    case("ablate-axis-empty-value", "ablate", "--ladder", "--axis", "trainer.lr=1e-4,,2e-4", "--dry-run", "--no-calibrate",
         expect="--axis trainer.lr: an empty value in '1e-4,,2e-4'"),
    case("ablate-axis-too-many", "ablate", "--ladder", "--axis", "trainer.lr=" + ",".join(f"{i}e-6" for i in range(1, 10001)),
         "--dry-run", "--no-calibrate", expect="--axis trainer.lr gives 10,000 values; at most 100"),
    case("prepare-repeat-billion", "prepare-data", "--synthetic", "add-3digit", "--n", "4", "--repeat", "1000000000",
         "-o", "x.parquet", "--no-track", expect="--repeat must be in [1, 4096], got 1,000,000,000"),
    case("prepare-n-trillion", "prepare-data", "--synthetic", "add-3digit", "--n", "1000000000000", "-o", "x.parquet",
         "--no-track", expect="--n 1,000,000,000,000 x --repeat 1 = 1,000,000,000,000 rows; at most 2,000,000 per run"),
    case("ablate-unknown-variant", "ablate", "--ladder", "--only", "nope", "--dry-run", "--no-calibrate", expect="unknown variant(s) nope"),
    case("ablate-axis-unknown-key", "ablate", "--grid", "--axis", "rollout.max_stalenes=0,1", "--dry-run", "--no-calibrate",
         expect="unknown config key 'rollout.max_stalenes'; did you mean 'rollout.max_staleness'?"),
    case("ablate-axis-bad-value", "ablate", "--ladder", "--axis", "rollout.max_staleness=0,one", "--dry-run", "--no-calibrate",
         expect="rollout.max_staleness must be an integer, got 'one'"),
    case("ablate-axis-technique-key", "ablate", "--grid", "--axis", "algorithm.loss_agg_mode=token-mean,seq-mean-token-mean",
         "--dry-run", "--no-calibrate", expect="the technique toggles own it"),
    case("ablate-axis-seed", "ablate", "--ladder", "--axis", "trainer.seed=0,1", "--dry-run", "--no-calibrate",
         expect="--axis trainer.seed: --seeds sets it"),
    case("ablate-axis-and-set", "ablate", "--ladder", "--axis", "rollout.max_staleness=0,1", "--set", "rollout.max_staleness=1",
         "--dry-run", "--no-calibrate", expect="--axis rollout.max_staleness and --set rollout.max_staleness=1 both set"),
    case("ablate-axis-one-value", "ablate", "--ladder", "--axis", "rollout.max_staleness=1", "--dry-run", "--no-calibrate",
         expect="--axis rollout.max_staleness needs at least 2 comma-separated values"),
    case("ablate-axis-repeated-value", "ablate", "--ladder", "--axis", "rollout.max_staleness=1,1", "--dry-run", "--no-calibrate",
         expect="--axis rollout.max_staleness gives the value 1 twice"),
    case("ablate-output-dir-is-a-file", "ablate", "--ladder", "--set", "trainer.output_dir=afile",
         expect="trainer.output_dir afile is a file", setup=("afile",)),
    case("ablate-print-bogus-store", "ablate", "--ladder", "--launcher", "print", "--set", "tracking.tracking_uri=bogus://::",
         expect="unsupported scheme 'bogus:'"),
    # ------------------------------------------------------------ report
    case("report-bogus-tracking-uri", "report", "x", "--tracking-uri", "bogus://::", expect="unsupported scheme 'bogus:'"),
    case("report-no-store", "report", "x", expect="no MLflow store at mlflow.db"),
    case("report-store-is-a-directory", "report", "x", "--tracking-uri", "sqlite:///adir", expect="adir is a directory",
         setup=("adir",)),
    case("report-store-read-only", "report", "x", "--tracking-uri", "sqlite:///{ro}/mlflow.db", expect="no MLflow store at",
         read_only=True),
    # ------------------------------------------------------------ prepare-data
    case("prepare-input-directory", "prepare-data", "adir", "-o", "x.parquet", expect="input adir is a directory",
         setup=("adir",)),
    case("prepare-input-missing", "prepare-data", "nope.jsonl", "-o", "x.parquet", expect="input file not found: nope.jsonl"),
    case("prepare-input-binary", "prepare-data", "bin.yaml", "-o", "x.parquet", "--no-track", expect="cannot tell the format",
         setup=("bin.yaml",)),
    case("prepare-input-empty", "prepare-data", "empty.jsonl", "-o", "x.parquet", "--no-track", expect="holds no rows",
         setup=("empty.jsonl",)),
    case("prepare-no-output", "prepare-data", "--synthetic", "add-3digit", expect="missing -o/--output"),
    case("prepare-output-directory", "prepare-data", "--synthetic", "add-3digit", "-o", "adir", "--no-track",
         expect="output adir is a directory", setup=("adir",)),
    case("prepare-output-inside-a-file", "prepare-data", "--synthetic", "add-3digit", "-o", "afile/x.parquet", "--no-track",
         expect="-o/--output afile/x.parquet is inside afile, which is a file, not a directory", setup=("afile",)),
    case("prepare-output-read-only", "prepare-data", "--synthetic", "add-3digit", "-o", "{ro}/x.parquet", "--no-track",
         expect="is on a read-only file system; give a writable -o/--output", read_only=True),
    case("prepare-n-zero", "prepare-data", "--synthetic", "add-3digit", "--n", "0", "-o", "x.parquet", expect="--n must be >= 1"),
    case("prepare-unknown-task", "prepare-data", "--synthetic", "add-9digit", "-o", "x.parquet", expect="unknown synthetic task"),
    case("prepare-bogus-tracking-uri", "prepare-data", "--synthetic", "add-3digit", "-o", "x.parquet", "--tracking-uri", "bogus://::",
         expect="unsupported scheme 'bogus:'"),
    case("prepare-store-read-only", "prepare-data", "--synthetic", "add-3digit", "-o", "x.parquet", "--tracking-uri",
         "sqlite:///{ro}/mlflow.db", expect="is on a read-only file system", read_only=True),
    # ------------------------------------------------------------ init-model
    case("init-output-exists", "init-model", "--output", "afile", expect="afile already exists; pass --force", setup=("afile",)),
    case("init-output-is-a-file", "init-model", "--output", "afile", "--force", expect="--output afile is a file", setup=("afile",)),
    case("init-output-inside-a-file", "init-model", "--output", "afile/model", expect="inside afile, which is a file",
         setup=("afile",)),
    case("init-output-read-only", "init-model", "--output", "{ro}/model", expect="is on a read-only file system", read_only=True),
    case("init-tiny-heads", "init-model", "--set", "model.tiny.hidden_size=30", expect="must be divisible by model.tiny.num_heads"),
    case("init-unknown-tiny-key", "init-model", "--set", "model.tiny.layers=2", expect="unknown config key 'model.tiny.layers'"),
]



def test_the_table_covers_every_command_and_at_least_50_inputs() -> None:
    commands = {c.args[0] for c in CASES if not c.args[0].startswith("-")}
    assert {"prepare-data", "init-model", "train", "eval", "ablate", "report", "config", "lint"} <= commands
    assert len(CASES) >= 50 and len({c.id for c in CASES}) == len(CASES)



@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
@pytest.mark.slow
def test_malformed_input_is_one_error_line_exit_2_and_leaves_nothing(
    c: Case, request: pytest.FixtureRequest, models: dict[str, Path], dataset: Path, case_dir: Path,
) -> None:
    run_case(c, places_for(c, request, models, dataset), case_dir)
