"""``dapo train --algo direct-advantage --dry-run``: what one run will generate, from the settings alone.

No weights are loaded. The number of problems comes from the config (``direct_advantage.problems``,
or the size of a synthetic training set; a file-backed set with ``problems: 0`` is counted
from its rows when it can be read). Per iteration, with P problems, K samples, c chosen
solutions of T steps each, M completions per state and L_max the response limit:

* generate:   P·K solutions (≤ P·K·L_max tokens);
* mc_values:  at most P·(1 + c·(T − 1)) distinct states (the problem itself is shared by its c
  solutions) → M completions each (≤ L_max tokens); a completion from depth k runs the remaining
  T − k steps, so the steps generated are ≈ M·c·P·T(T + 1)/2: **quadratic in T** at a fixed step length;
* critic:     one forward/backward per state per epoch;
* advantages: ≤ M critic forwards per state (one per distinct candidate step);
* actor:      ≤ M candidates per kept state, forward + backward per epoch.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

STEP_COUNTS = (4, 8, 16, 32)


def count_problems(cfg: Any) -> tuple[int, str]:
    """Training problems per iteration and where the number comes from."""
    da = cfg.direct_advantage
    if da.problems:
        return da.problems, "direct_advantage.problems"
    total, unknown = 0, []
    for spec in cfg.data.train_files:
        if spec.startswith("synthetic:"):
            total += cfg.data.synthetic_train_size
            continue
        try:
            from dapo_cli.data.registry import load_dataset_rows

            total += len(load_dataset_rows(spec).rows)
        except Exception:  # noqa: BLE001 - a plan must not fail on a dataset it cannot read
            unknown.append(spec)
    if unknown:
        return total, f"rows of the readable training sets ({', '.join(unknown)} not counted)"
    return total, "every training problem (direct_advantage.problems: 0)"


def estimate(cfg: Any, steps: int, problems: int) -> dict[str, float]:
    """Upper-bound counts of one iteration whose chosen solutions have ``steps`` steps each."""
    da, lmax = cfg.direct_advantage, cfg.rollout.max_response_length
    p, k, c, m, t = problems, da.samples_per_problem, da.chosen_per_problem, da.mc_completions, max(steps, 1)
    depth = t if not da.max_states_per_solution else min(t, da.max_states_per_solution)
    states = p * (1 + c * (depth - 1))
    mc_tokens = states * m * lmax  # every completion at most L_max tokens
    return {
        "steps": float(t),
        "generate_samples": float(p * k),
        "generate_tokens_max": float(p * k * lmax),
        "mc_states_max": float(states),
        "mc_samples_max": float(states * m),
        "mc_step_generations_approx": float(m * c * p * depth * (depth + 1) / 2),
        "mc_tokens_max": float(mc_tokens),
        "critic_examples": float((states + p * c) * da.critic_epochs),
        "advantage_critic_forwards_max": float(states * m),
        "actor_candidates_max": float(states * m * da.actor_epochs),
    }


def estimate_workload(cfg: Any, *, config_name: str) -> dict[str, Any]:
    problems, source = count_problems(cfg)
    da = cfg.direct_advantage
    counts = [da.expected_steps] if da.expected_steps else list(STEP_COUNTS)
    rows = [estimate(cfg, t, problems) for t in counts]
    return {
        "config": config_name,
        "algo": "direct-advantage",
        "iterations": da.iterations,
        "problems_per_iteration": problems,
        "problems_source": source,
        "samples_per_problem": da.samples_per_problem,
        "chosen_per_problem": da.chosen_per_problem,
        "mc_completions": da.mc_completions,
        "max_response_length": cfg.rollout.max_response_length,
        "per_iteration": rows,
        "whole_run_samples_max": [r["generate_samples"] * da.iterations + r["mc_samples_max"] * da.iterations for r in rows],
    }


def fmt(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:,.0f}"


def render_workload(plan: dict[str, Any], as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(plan, indent=2))
        return
    console = Console(width=max(Console().width, 140))
    console.print(
        f"[bold]direct-advantage plan[/] for {plan['config']} (no weights loaded): {plan['iterations']} iteration(s), "
        f"{plan['problems_per_iteration']:,} problems each ({plan['problems_source']}), "
        f"K={plan['samples_per_problem']} samples, c={plan['chosen_per_problem']} chosen, "
        f"M={plan['mc_completions']} completions per state, L_max={plan['max_response_length']}",
        highlight=False,
    )
    table = Table(title="per iteration, by steps per chosen solution (T)", title_justify="left")
    table.add_column("T", justify="right")
    for head in ("generate samples", "mc states ≤", "mc completions ≤", "mc steps generated ≈", "mc tokens ≤", "critic examples", "critic forwards ≤", "actor candidates ≤", "run samples ≤"):
        table.add_column(head, justify="right")
    for r, total in zip(plan["per_iteration"], plan["whole_run_samples_max"]):
        table.add_row(
            f"{r['steps']:.0f}", fmt(r["generate_samples"]), fmt(r["mc_states_max"]), fmt(r["mc_samples_max"]),
            fmt(r["mc_step_generations_approx"]), fmt(r["mc_tokens_max"]), fmt(r["critic_examples"]), fmt(r["advantage_critic_forwards_max"]),
            fmt(r["actor_candidates_max"]), fmt(total),
        )
    console.print(table)
    console.print(
        "mc_values dominates: completions grow like T·M per solution and the steps they generate like M·T(T+1)/2 "
        "(the paper's warning: quadratic in T at a fixed step length); tokens ≤ assumes each solution fills L_max. "
        "Identical states are completed once, so real counts are lower. "
        "Measured counts are logged per phase as da/<phase>/samples, tokens, wall_s.",
        highlight=False,
    )
