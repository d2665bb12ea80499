"""``dapo train --algo direct-advantage``: iterations of five resumable phases, then greedy validation.

    for iteration i (reference π_ref = the base policy, then the previous actor):
        generate    π_ref samples solutions ────────────► generate.parquet
        mc_values   fixed completer completes each prefix ► mc_values.parquet
        critic      BCE on the soft targets ──────────────► critic/ + critic.parquet + calibration plot
        advantages  q = V(s + a), A = q − mean q, gap filter ► advantages.parquet
        actor       ½(A/β − log π/π_ref)², π_ref frozen ──► actor/model + actor.parquet
        evaluate    greedy (and sampled avg@k) held-out accuracy

Every phase is a stage of one MLflow run: its metrics under ``da/<phase>/`` at step i + 1
(samples generated, tokens, wall time included), its table as an artifact under
``iter_XX/``. ``--resume`` continues at the first stage not done, in the same MLflow run;
``--from-phase NAME`` reruns the latest iteration from NAME on in a new MLflow run (its
reused stages' metrics and tables are recorded there again, so each run is complete).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from dapo_cli import components
from dapo_cli.direct_advantage import PHASES
from dapo_cli.direct_advantage.phases import (
    TrainProblem,
    advantages_phase,
    generate_phase,
    mc_values_phase,
)
from dapo_cli.direct_advantage.steps import unescape_delimiter
from dapo_cli.direct_advantage.store import RunStore
from dapo_cli.errors import UserError
from dapo_cli.fileio import write_json_atomic, write_text_atomic
from dapo_cli.progress import PhaseReporter
from dapo_cli.engine.dist import Collective
from dapo_cli.rollout.base import RolloutEngine, SamplingParams
from dapo_cli.runs import derive_seed

SUMMARY_KEYS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "generate": (("acc", "acc", "{:.3f}"), ("chosen", "chosen", "{:.0f}"), ("chosen_acc", "chosen acc", "{:.2f}")),
    "mc_values": (("states", "states", "{:.0f}"), ("states_without_dedup", "before dedup", "{:.0f}"), ("value_mean", "value", "{:.3f}")),
    "critic": (("holdout_bce", "holdout BCE", "{:.4f}"), ("holdout_bce_floor", "floor", "{:.4f}"), ("holdout_ece", "ECE", "{:.3f}")),
    "advantages": (("states_kept", "states kept", "{:.0f}"), ("states", "of", "{:.0f}"), ("candidates_kept", "candidates", "{:.0f}")),
    "actor": (("loss_before", "loss", "{:.3g}"), ("loss_after", "->", "{:.3g}"), ("sign_agreement", "sign agreement", "{:.2f}")),
    "evaluate": (("greedy_acc", "greedy acc", "{:.3f}"),),
}


class Reporter(PhaseReporter):
    """One line per stage on stderr and a transient bar while a phase generates (quiet: nothing)."""

    def stage(self, i: int, iterations: int, stage: str, metrics: dict[str, float], reused: bool = False) -> None:
        parts = [f"iteration {i + 1}/{iterations}  {stage:<10}"]
        if reused:
            parts.append("(reused)")
        for key, label, fmt in SUMMARY_KEYS.get(stage, ()):
            if key in metrics:
                parts.append(f"{label} {fmt.format(metrics[key])}")
        if stage != "evaluate":
            parts.append(f"samples {metrics.get('samples', 0):,.0f}  tokens {metrics.get('tokens', 0):,.0f}  {metrics.get('wall_s', 0):.1f} s")
        self.note("  ".join(parts))


@dataclasses.dataclass
class Context:
    """What every stage of a run needs."""

    cfg: Any
    store: RunStore
    tracker: Any
    reporter: Reporter
    base_path: Path
    completer_path: Path
    critic_path: Path
    tokenizer: Any
    problems: list[TrainProblem]
    val_problems: list[Any]
    val_prompts: list[str]
    model_info: dict[str, Any]
    device: torch.device
    dist: Collective

    @property
    def da(self) -> Any:
        return self.cfg.direct_advantage

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.cfg.model.dtype)

    @property
    def delimiter(self) -> str:
        return unescape_delimiter(self.da.step_delimiter)

    def reference_path(self, i: int) -> Path:
        return self.base_path if i == 0 else self.store.actor_model(i - 1)

    def rollout_for(self, path: Path) -> RolloutEngine:
        """A rollout engine (``rollout.engine``: fast or hf) sampling with the policy at ``path``."""
        engine, _ = components.load_policy_rollout(
            self.cfg.rollout.engine, path, device=self.device, dtype=self.dtype, batch_size=self.cfg.rollout.batch_size
        )
        return engine

    def sampling(self, purpose: str, i: int) -> Callable[[int], SamplingParams]:
        r = self.cfg.rollout

        def params(chunk: int) -> SamplingParams:
            seed = derive_seed(self.cfg.trainer.seed, "direct-advantage", purpose, i, chunk)
            return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_response_length, seed=seed)

        return params

    def iteration_problems(self, i: int) -> list[TrainProblem]:
        from dapo_cli.data.loader import PromptStream

        per = self.da.problems or len(self.problems)
        stream = PromptStream(self.problems, seed=self.cfg.trainer.seed, shuffle=self.cfg.data.shuffle)  # type: ignore[arg-type]
        return stream.next(per * (i + 1))[-per:]  # type: ignore[return-value]

    @property
    def max_sequences(self) -> int:
        return self.cfg.rollout.batch_size or 512


# ---------------------------------------------------------------- the stages


def stage_generate(ctx: Context, i: int) -> dict[str, float]:
    engine = ctx.rollout_for(ctx.reference_path(i))
    progress, update = ctx.reporter.bar(f"iteration {i + 1} generate")
    with progress:
        rows, metrics = generate_phase(
            engine, ctx.iteration_problems(i), samples=ctx.da.samples_per_problem, chosen=ctx.da.chosen_per_problem,
            params_for=ctx.sampling("generate", i), verifier=ctx.cfg.reward.verifier, delimiter=ctx.delimiter,
            seed=derive_seed(ctx.cfg.trainer.seed, "choose", i), max_sequences=ctx.max_sequences, progress=update,
        )
    ctx.store.write(i, "generate", rows)
    sample = [{k: r[k] for k in ("problem", "response", "acc", "steps", "chosen")} for r in rows[:32]]
    ctx.tracker.log_table(sample, f"iter_{i:02d}/generate_samples.json")
    return metrics


def stage_mc_values(ctx: Context, i: int) -> dict[str, float]:
    engine = ctx.rollout_for(ctx.completer_path)
    progress, update = ctx.reporter.bar(f"iteration {i + 1} mc_values")
    with progress:
        rows, metrics = mc_values_phase(
            engine, ctx.store.read(i, "generate"), completions=ctx.da.mc_completions, params_for=ctx.sampling("mc", i),
            verifier=ctx.cfg.reward.verifier, delimiter=ctx.delimiter, max_states=ctx.da.max_states_per_solution,
            max_sequences=ctx.max_sequences, progress=update,
        )
    ctx.store.write(i, "mc_values", rows)
    return metrics


def stage_critic(ctx: Context, i: int) -> dict[str, float]:
    from dapo_cli.direct_advantage.critic import critic_phase

    da = ctx.da
    out = ctx.store.critic_dir(i)
    rows, metrics, calibration = critic_phase(
        ctx.store.read(i, "mc_values"), backbone_path=ctx.critic_path, out_dir=out, device=ctx.device, dtype=ctx.dtype,
        lr=da.critic_lr, epochs=da.critic_epochs, batch_size=da.critic_batch_size, micro_batch_size=da.critic_micro_batch_size,
        holdout=da.critic_holdout, weight_decay=da.weight_decay, grad_clip=ctx.cfg.trainer.grad_clip,
        seed=derive_seed(ctx.cfg.trainer.seed, "critic", i), finished_states=da.terminal_value == "critic",
        title=f"critic calibration, iteration {i + 1}",
    )
    ctx.store.write(i, "critic", rows)
    ctx.tracker.log_table(calibration, f"iter_{i:02d}/critic_calibration.json")
    write_json_atomic(out / "calibration.json", calibration)
    return metrics


def stage_advantages(ctx: Context, i: int) -> dict[str, float]:
    from dapo_cli.direct_advantage.critic import load_critic, predict

    model, tokenizer = load_critic(ctx.store.critic_dir(i), device=ctx.device, dtype=ctx.dtype)

    def value_of(texts: list[str]) -> list[float]:
        return predict(model, tokenizer, texts, batch_size=ctx.da.critic_micro_batch_size)

    rows, metrics = advantages_phase(
        ctx.store.read(i, "mc_values"), value_of, delimiter=ctx.delimiter, terminal_value=ctx.da.terminal_value,
        min_gap=ctx.da.min_gap,
    )
    ctx.store.write(i, "advantages", rows)
    gaps = sorted({r["state"]: r["gap"] for r in rows}.values())
    edges = [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0001]
    ctx.tracker.log_table(
        [{"gap_low": lo, "gap_high": min(hi, 1.0), "states": sum(1 for g in gaps if lo <= g < hi)} for lo, hi in itertools.pairwise(edges)],
        f"iter_{i:02d}/advantage_gaps.json",
    )
    return metrics


def stage_actor(ctx: Context, i: int) -> dict[str, float]:
    from dapo_cli.direct_advantage.actor import train_actor
    from dapo_cli.models import load_policy

    cfg, da = ctx.cfg, ctx.da
    ref_path = ctx.reference_path(i)
    kept = [r for r in ctx.store.read(i, "advantages") if r["kept"]]
    torch.manual_seed(derive_seed(cfg.trainer.seed, "actor", i))
    model, tokenizer = load_policy(ref_path, device="cpu", dtype=ctx.dtype)
    # the engine's reference is π_ref of this iteration (its own frozen copy, loaded from the same weights)
    engine = components.build_training_engine(
        cfg.engine, model, ctx.dist, lr=da.actor_lr, weight_decay=da.weight_decay, warmup_steps=0,
        grad_clip=cfg.trainer.grad_clip, bf16=cfg.model.dtype == "bfloat16",
        load_reference=components.model_loader(ref_path, ctx.dtype),
    )
    if not kept:
        ctx.reporter.note(f"iteration {i + 1}: no state passed the gap filter (direct_advantage.min_gap={da.min_gap}); the actor is the reference")
    rows, metrics = train_actor(
        engine, tokenizer, kept, beta=da.beta, epochs=da.actor_epochs, batch_states=da.actor_batch_states,
        micro_batch_size=da.actor_micro_batch_size, seed=derive_seed(cfg.trainer.seed, "actor-batches", i),
    )
    if not engine.params_finite():
        raise UserError(f"iteration {i + 1}: the actor's parameters became non-finite; lower direct_advantage.actor_lr or raise beta")
    target = ctx.store.actor_model(i)
    shutil.rmtree(target, ignore_errors=True)
    engine.save_model(target, tokenizer)
    if ctx.model_info:
        write_text_atomic(target / "dapo_model.json", json.dumps(ctx.model_info, indent=2) + "\n")
    ctx.store.write(i, "actor", rows)
    return metrics


def stage_evaluate(ctx: Context, i: int) -> dict[str, float]:
    return validate(ctx, ctx.store.actor_model(i), step=i + 1)


def validate(ctx: Context, path: Path, *, step: int) -> dict[str, float]:
    """Greedy held-out accuracy (the method's evaluation), and avg@k with the validation sampling."""
    from dapo_cli.eval.metrics import tracking_metrics
    from dapo_cli.eval.run import evaluate_problems

    if not ctx.val_problems:
        return {}
    cfg = ctx.cfg
    max_tokens = cfg.validation.max_tokens or cfg.rollout.max_response_length
    engine = ctx.rollout_for(path)
    greedy = evaluate_problems(
        engine, ctx.val_problems, ctx.val_prompts, k=1, params=SamplingParams(temperature=0.0, max_tokens=max_tokens),
        verifier=cfg.reward.verifier,
    )
    metrics = tracking_metrics(greedy.metrics, "val/greedy/")
    metrics["greedy_acc"] = greedy.metrics["avg@1"]
    if ctx.da.validate_sampled:
        v = cfg.validation
        params = SamplingParams(
            temperature=v.temperature, top_p=v.top_p, max_tokens=max_tokens, seed=derive_seed(cfg.trainer.seed, "validation", step)
        )
        sampled = evaluate_problems(engine, ctx.val_problems, ctx.val_prompts, k=v.k, params=params, verifier=cfg.reward.verifier)
        metrics.update(tracking_metrics(sampled.metrics, "val/"))
    ctx.tracker.log_table(
        [{k: row[k] for k in ("problem_id", "correct", "samples", "majority", "ground_truth")} for row in greedy.per_problem],
        f"val/per_problem_greedy_step_{step:06d}.json",
    )
    return metrics


STAGE_FUNCTIONS: dict[str, Callable[[Context, int], dict[str, float]]] = {
    "generate": stage_generate,
    "mc_values": stage_mc_values,
    "critic": stage_critic,
    "advantages": stage_advantages,
    "actor": stage_actor,
    "evaluate": stage_evaluate,
}


def stage_metrics(stage: str, metrics: dict[str, float]) -> dict[str, float]:
    """A stage's metrics as MLflow keys: ``da/<phase>/<name>``; validation keeps its own ``val/`` keys."""
    if stage == "evaluate":
        return {k: v for k, v in metrics.items() if "/" in k}
    return {f"da/{stage}/{k}": v for k, v in metrics.items()}


def log_stage_files(ctx: Context, i: int, stage: str) -> None:
    """A stage's table (and the critic's plot) as artifacts under ``iter_XX/``."""
    folder = f"iter_{i:02d}"
    if stage in PHASES and ctx.store.table(i, stage).is_file():
        ctx.tracker.log_artifact(ctx.store.table(i, stage), folder)
    if stage == "critic":
        png = ctx.store.critic_dir(i) / "calibration.png"
        if png.is_file():
            ctx.tracker.log_artifact(png, f"{folder}/critic")


def run_stage(ctx: Context, i: int, stage: str) -> dict[str, float]:
    ctx.tracker.set_tags({"da.stage": f"{i}/{stage}"})
    t0 = time.perf_counter()
    metrics = STAGE_FUNCTIONS[stage](ctx, i)
    metrics["wall_s"] = time.perf_counter() - t0
    ctx.store.record(i, stage, metrics)
    ctx.tracker.log_metrics(stage_metrics(stage, metrics), step=i + 1)
    log_stage_files(ctx, i, stage)
    ctx.reporter.stage(i, ctx.da.iterations, stage, metrics)
    return metrics
