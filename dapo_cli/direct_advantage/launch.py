"""Open, resume and finish a direct-advantage run: run directory, config checks, data, MLflow.

The stages themselves are in :mod:`dapo_cli.direct_advantage.run`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import yaml

from dapo_cli.config import dump_saved, flatten
from dapo_cli.config.versions import split_version, upgrade
from dapo_cli.direct_advantage import STAGES
from dapo_cli.direct_advantage.checks import flat_dict, phase_of_key, settings_changed
from dapo_cli.direct_advantage.phases import TrainProblem
from dapo_cli.direct_advantage.run import (
    Context,
    Reporter,
    log_stage_files,
    run_stage,
    stage_metrics,
    validate,
)
from dapo_cli.direct_advantage.store import STATE_FILE, RunStore
from dapo_cli.errors import UserError
from dapo_cli.fileio import write_json_atomic, write_text_atomic
from dapo_cli.runs import read_model_info, read_run_data, run_tags, upload_model


def run_stem(cfg: Any) -> str:
    return cfg.trainer.run_name or f"direct-advantage-s{cfg.trainer.seed}"


def find_run(cfg: Any) -> str:
    """The run ``--resume`` / ``--from-phase`` continue: ``trainer.run_name``, else the newest run named
    like this config's that has started."""
    from dapo_cli.checkpoint import latest_run_name

    out, experiment, stem = cfg.trainer.output_dir, cfg.tracking.experiment, run_stem(cfg)
    if cfg.trainer.run_name:
        found = stem if (Path(out) / experiment / stem / STATE_FILE).is_file() else None
    else:
        found = latest_run_name(out, experiment, stem, marker=STATE_FILE)
    if found is None:
        raise UserError(f"no direct-advantage run named '{stem}' under {Path(out) / experiment}; start it without --resume/--from-phase")
    return found


def restart_point(store: RunStore, cfg: Any, *, resume: bool, from_phase: str | None) -> tuple[int, str] | None:
    """Where the run (re)starts: (iteration, stage); None when a resumed run has nothing left to do."""
    if from_phase is not None:
        if from_phase not in STAGES:
            raise UserError(f"--from-phase {from_phase}: unknown phase; valid: {', '.join(STAGES)}")
        i = store.latest_iteration()
        missing = [s for s in STAGES[: STAGES.index(from_phase)] if not store.done(i, s)]
        if missing:
            raise UserError(
                f"--from-phase {from_phase}: iteration {i + 1} has no finished {missing[0]} to reuse; "
                f"use --resume (continues at the first phase not done) or --from-phase {missing[0]}"
            )
        return i, from_phase
    if resume:
        return store.next_stage(cfg.direct_advantage.iterations)
    return 0, STAGES[0]


def check_changes(store: RunStore, cfg: Any, start: tuple[int, str]) -> list[str]:
    """Settings changed since the run's config.yaml: allowed when no stored data that is reused
    depends on them (see :func:`~dapo_cli.direct_advantage.checks.phase_of_key`); returns them. A key
    an older dapo's config.yaml lacks counts at the value that does what that dapo did (config/versions.py)."""
    path = store.root / "config.yaml"
    if not path.is_file():
        return []
    version, saved = split_version(yaml.safe_load(path.read_text(encoding="utf-8")), str(path))
    upgraded, _, missing = upgrade(saved, version)
    changed = sorted({*settings_changed(flat_dict(upgraded), flatten(cfg)), *missing})
    _, stage = start
    blocking = []
    for key in changed:
        owner = phase_of_key(key)
        if owner is not None and STAGES.index(owner) < STAGES.index(stage):
            blocking.append(f"{key} ({owner})")
    if blocking:
        raise UserError(
            f"the config differs from the run's config.yaml in {', '.join(blocking)}, which stored phases before "
            f"{stage} depend on; restart from that phase (--from-phase) or keep the saved settings"
        )
    return changed


def load_problems(cfg: Any, tokenizer: Any) -> tuple[list[TrainProblem], list[Any], list[str], dict[str, Any]]:
    """Training problems (templated, too-long ones dropped), validation problems and prompts, manifest."""
    data = read_run_data(cfg.data, tokenizer)
    if not data.train_prompts:
        raise UserError("the training set is empty after filtering; check data.train_files and data.max_prompt_length")
    problems = [TrainProblem(key=str(n), prompt=p.text, ground_truth=p.ground_truth) for n, p in enumerate(data.train_prompts)]
    manifest = {**data.manifest(cfg.data), "val_problems": len(data.val_problems)}
    return problems, data.val_problems, [data.format(p.messages) for p in data.val_problems], manifest


def resolve_path(spec: str, cfg: Any) -> Path:
    """The folder of model ``spec`` (``builtin:tiny`` built first when missing)."""
    from dapo_cli.warmstart import ensure_model

    return Path(ensure_model(spec, cfg.model.tiny))


def relog(ctx: Context, upto: tuple[int, str]) -> None:
    """Record the reused stages (before ``upto``) in a new MLflow run: metrics and tables."""
    base = ctx.store.state.get("base_val")
    if base:
        ctx.tracker.log_metrics(base, step=0)
    stop_i, stop_stage = upto
    for key in sorted(ctx.store.state["iterations"], key=int):
        i = int(key)
        for stage, record in ctx.store.stages(i).items():
            if (i, STAGES.index(stage)) >= (stop_i, STAGES.index(stop_stage)):
                continue
            ctx.tracker.log_metrics(stage_metrics(stage, record["metrics"]), step=i + 1)
            ctx.tracker.set_tags({f"da.reused.{i}.{stage}": "true"})
            log_stage_files(ctx, i, stage)
            ctx.reporter.stage(i, ctx.da.iterations, stage, record["metrics"], reused=True)


def run_direct_advantage(
    cfg: Any,
    *,
    resume: bool = False,
    from_phase: str | None = None,
    command: str = "dapo train --algo direct-advantage",
    parent_run_id: str | None = None,
    extra_tags: dict[str, str] | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run, resume (``resume``) or partly rerun (``from_phase``) a direct-advantage training run; its summary."""
    from dapo_cli import components
    from dapo_cli.checkpoint import claim_run_dir
    from dapo_cli.models.loading import load_tokenizer

    dist = components.build_collective(cfg.engine)
    if dist.world_size > 1:
        dist.close()
        raise UserError("algo: direct-advantage runs in one process; launch it without torchrun")
    if cfg.engine.num_threads > 0:
        torch.set_num_threads(cfg.engine.num_threads)
    again = resume or from_phase is not None
    stem = find_run(cfg) if again else run_stem(cfg)
    name, run_dir, lock, _created = claim_run_dir(
        cfg.trainer.output_dir, cfg.tracking.experiment, stem, exact=again or bool(cfg.trainer.run_name)
    )
    reporter = Reporter(quiet)
    t_start = time.perf_counter()
    try:
        store = RunStore(run_dir)
        if not again and store.started():
            raise UserError(f"run {run_dir} has already started; add --resume or --from-phase NAME, or pick another trainer.run_name")
        start = restart_point(store, cfg, resume=resume, from_phase=from_phase)
        changed = check_changes(store, cfg, start) if start is not None else []
        if start is not None and from_phase is not None:
            gone = store.forget_from(*start)
            if gone:
                reporter.note(f"rerunning {', '.join(gone)}")
        if changed:
            store.state["config_changes"].append({"at": f"{start[0]}/{start[1]}", "keys": changed})
            reporter.note(f"settings changed since the run started: {', '.join(changed)}")
        write_text_atomic(run_dir / "config.yaml", dump_saved(cfg))
        base_path = resolve_path(cfg.model.path, cfg)
        tokenizer = load_tokenizer(base_path)
        problems, val_problems, val_prompts, manifest = load_problems(cfg, tokenizer)
        if cfg.direct_advantage.problems > len(problems):
            raise UserError(f"direct_advantage.problems={cfg.direct_advantage.problems} but the training set has {len(problems)}; lower it (0: all)")
        same_run = resume and from_phase is None and bool(store.state["mlflow_run_ids"])
        old_ids = list(store.state["mlflow_run_ids"])
        tags = {
            **run_tags(command, seed=cfg.trainer.seed, variant="direct-advantage", run_dir=run_dir),
            "dapo.algo": "direct-advantage",
            **({"da.from_phase": from_phase, "da.branched_from": old_ids[-1]} if from_phase and old_ids else {}),
            **(extra_tags or {}),
        }
        label = getattr(cfg.tracking, "run_label", "") or name
        with components.open_tracker(
            cfg.tracking, dist, label, tags=tags, parent_run_id=parent_run_id,
            resume_run_id=old_ids[-1] if same_run else None,
        ) as tracker:
            if not same_run:
                store.state["mlflow_run_ids"].append(tracker.run_id)
                store.save()
            tracker.log_params(flatten(cfg))
            tracker.log_text(dump_saved(cfg), "config.yaml")
            tracker.log_dict(manifest, "dataset_manifest.json")
            ctx = Context(
                cfg=cfg, store=store, tracker=tracker, reporter=reporter, base_path=base_path,
                completer_path=resolve_path(cfg.direct_advantage.completer, cfg) if cfg.direct_advantage.completer else base_path,
                critic_path=resolve_path(cfg.direct_advantage.critic_path, cfg) if cfg.direct_advantage.critic_path else base_path,
                tokenizer=tokenizer, problems=problems, val_problems=val_problems, val_prompts=val_prompts,
                model_info=read_model_info(base_path), device=components.training_device(cfg.engine, dist), dist=dist,
            )
            if not same_run and store.started() and start is not None:
                relog(ctx, start)
            if "base_val" not in store.state:
                t0 = time.perf_counter()
                base = validate(ctx, base_path, step=0)
                store.state["base_val"] = {k: v for k, v in base.items() if "/" in k}
                store.save()
                tracker.log_metrics(store.state["base_val"], step=0)
                reporter.note(f"reference (base) greedy held-out accuracy {base.get('greedy_acc', float('nan')):.3f} ({time.perf_counter() - t0:.1f} s)")
            if start is not None:
                for i in range(start[0], cfg.direct_advantage.iterations):
                    for stage in STAGES:
                        if not store.done(i, stage):
                            run_stage(ctx, i, stage)
            summary = finish(ctx, name, time.perf_counter() - t_start)
        return summary
    finally:
        lock.release()


def finish(ctx: Context, name: str, wall_s: float) -> dict[str, Any]:
    cfg, store, tracker = ctx.cfg, ctx.store, ctx.tracker
    iterations = cfg.direct_advantage.iterations
    last = max((i for i in range(iterations) if store.done(i, "actor")), default=None)
    base = store.state.get("base_val", {}).get("val/greedy/avg_at_1")
    per_iteration = {
        i + 1: store.stages(i)["evaluate"]["metrics"].get("greedy_acc") for i in range(iterations) if store.done(i, "evaluate")
    }
    final = per_iteration.get(last + 1) if last is not None else None
    totals = {"samples": 0.0, "tokens": 0.0, "wall_s": 0.0}
    for i in range(iterations):
        for record in store.stages(i).values():
            for k in totals:
                totals[k] += float(record["metrics"].get(k, 0.0))
    final_metrics = {f"da/total/{k}": v for k, v in totals.items()}
    if base is not None and final is not None:
        final_metrics.update({"final/val_acc": final, "final/base_val_acc": base, "final/val_gain": final - base})
    tracker.log_metrics(final_metrics, step=iterations)
    tracker.log_table(
        [{"iteration": i + 1, "stage": s, **{k: float(r["metrics"].get(k, 0.0)) for k in totals}} for i in range(iterations) for s, r in store.stages(i).items()],
        "da/stages.json",
    )
    checkpoint = store.actor_model(last) if last is not None else None
    if checkpoint is not None:
        tracker.set_tags({"dapo.checkpoint": str(checkpoint.resolve())})
        upload_model(tracker, checkpoint, "checkpoint")
    summary = {
        "run_name": name, "run_dir": str(store.root), "mlflow_run_id": tracker.run_id or None,
        "checkpoint": str(checkpoint) if checkpoint else None, "base_val": base, "final_val": final,
        "val_by_iteration": per_iteration, "wall_s_this_process": round(wall_s, 1), "stopped": None,
        "totals": totals,
    }
    write_json_atomic(store.root / "summary.json", summary)
    if base is not None and final is not None:
        ctx.reporter.note(f"held-out greedy accuracy: {base:.3f} (reference) → {final:.3f} (actor), {final - base:+.3f}")
    ctx.reporter.note(f"run dir:    {store.root}")
    if checkpoint is not None:
        ctx.reporter.note(f"checkpoint: {checkpoint}")
    if tracker.run_id:
        from dapo_cli.tracking.mlflow import ui_lines

        for line in ui_lines(tracker.tracking_uri, tracker.run_id):
            ctx.reporter.note(line)
    return summary
