"""The data phases of one iteration: generate, mc_values, advantages (critic and actor have their modules).

Each phase takes the previous phase's rows (plain dicts, as stored in its parquet table) and
returns ``(rows, metrics)``; rollout engines and the critic come in as arguments (any
:class:`~dapo_cli.rollout.base.RolloutEngine`, any ``texts -> probabilities`` function), so
the phases run as well on fakes as on models.

Costs (the paper's warning): a solution of T steps has T states, each given M completions of
up to T - k remaining steps, so the Monte-Carlo phase generates ``T * M`` completions and on
the order of ``M * T^2 / 2`` steps' worth of tokens per solution. Identical states (every
solution of a problem shares the problem itself; right answers often share their first
steps) are completed once; ``states_without_dedup`` shows what that saved.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dapo_cli.algo.direct_advantage import centered_advantages, gap_filter, state_gaps
from dapo_cli.direct_advantage.steps import (
    choose_solutions,
    first_step,
    split_steps,
    state_prefixes,
)
from dapo_cli.rewards import score_batch
from dapo_cli.rollout.base import RolloutEngine, Rollouts, SamplingParams

Progress = Callable[[int, int], None]
"""``(done, total)`` after each generate call."""


@dataclass(frozen=True)
class TrainProblem:
    """One training problem of an iteration: ``key`` (unique in the run), templated ``prompt``, ``ground_truth``."""

    key: str
    prompt: str
    ground_truth: str


def chunks(items: Sequence[Any], per_call: int) -> list[list[Any]]:
    """``items`` in consecutive lists of at most ``per_call`` (at least one item each)."""
    size = max(1, per_call)
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def sample_in_chunks(
    engine: RolloutEngine,
    prompts: Sequence[str],
    n: int,
    params_for: Callable[[int], SamplingParams],
    *,
    max_sequences: int,
    progress: Progress | None = None,
) -> list[Rollouts]:
    """``engine.generate`` over ``prompts`` in calls of at most ``max_sequences // n`` prompts;
    call ``c`` samples with ``params_for(c)`` (its own seed), so results do not depend on timing."""
    parts = chunks(list(prompts), max(1, max_sequences // n))
    out = []
    for c, part in enumerate(parts):
        out.append(engine.generate(part, n, params_for(c)))
        if progress is not None:
            progress(c + 1, len(parts))
    return out


# ---------------------------------------------------------------- generate


def generate_phase(
    engine: RolloutEngine,
    problems: Sequence[TrainProblem],
    *,
    samples: int,
    chosen: int,
    params_for: Callable[[int], SamplingParams],
    verifier: str,
    delimiter: str,
    seed: int,
    max_sequences: int = 512,
    progress: Progress | None = None,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """``samples`` solutions per problem from the reference policy, scored; ``chosen`` distinct ones
    per problem kept, balanced between right and wrong (:func:`~.steps.choose_solutions`)."""
    rows: list[dict[str, Any]] = []
    tokens = 0
    outs = sample_in_chunks(engine, [p.prompt for p in problems], samples, params_for, max_sequences=max_sequences, progress=progress)
    offset = 0
    for out in outs:
        owners = [problems[offset + int(i)] for i in out.prompt_index.tolist()]
        offset += len(set(out.prompt_index.tolist()))
        _, acc, _ = score_batch(verifier, out.texts, [p.ground_truth for p in owners])
        tokens += int(out.lengths.sum())
        counters: dict[str, int] = {}
        for i, p in enumerate(owners):
            j = counters[p.key] = counters.get(p.key, -1) + 1
            rows.append({
                "problem": p.key, "prompt": p.prompt, "ground_truth": p.ground_truth, "sample": j,
                "response": out.texts[i], "acc": bool(acc[i]), "length": int(out.lengths[i]),
                "truncated": bool(out.truncated[i]), "steps": len(split_steps(out.texts[i], delimiter)), "chosen": False,
            })
    by_problem: dict[str, list[int]] = {}
    for r, row in enumerate(rows):
        by_problem.setdefault(row["problem"], []).append(r)
    rng = random.Random(f"{seed}:choose")
    all_right = all_wrong = 0
    for idx in by_problem.values():
        texts = [rows[r]["response"] for r in idx]
        right = [rows[r]["acc"] for r in idx]
        all_right += all(right)
        all_wrong += not any(right)
        for k in choose_solutions(texts, right, chosen, rng):
            rows[idx[k]]["chosen"] = True
    picked = [r for r in rows if r["chosen"]]
    metrics = {
        "samples": float(len(rows)),
        "tokens": float(tokens),
        "problems": float(len(by_problem)),
        "acc": mean([float(r["acc"]) for r in rows]),
        "truncated_frac": mean([float(r["truncated"]) for r in rows]),
        "steps_mean": mean([float(r["steps"]) for r in rows]),
        "chosen": float(len(picked)),
        "chosen_acc": mean([float(r["acc"]) for r in picked]),
        "chosen_steps_mean": mean([float(r["steps"]) for r in picked]),
        "problems_all_right": float(all_right),
        "problems_all_wrong": float(all_wrong),
    }
    return rows, metrics


# ---------------------------------------------------------------- mc_values


def collect_states(gen_rows: Sequence[dict[str, Any]], *, delimiter: str, max_states: int) -> tuple[list[dict[str, Any]], int]:
    """The distinct states of the chosen solutions (non-terminal first, then finished solutions),
    and how many states there are counting duplicates."""
    open_states: dict[tuple[str, str], dict[str, Any]] = {}
    finished: dict[tuple[str, str], dict[str, Any]] = {}
    naive = 0
    for row in gen_rows:
        if not row["chosen"]:
            continue
        key = row["problem"]
        prefixes = state_prefixes(row["response"], delimiter, max_states)
        naive += len(prefixes)
        for depth, prefix in prefixes:
            state = open_states.setdefault((key, prefix), {
                "problem": key, "prompt": row["prompt"], "ground_truth": row["ground_truth"], "prefix": prefix,
                "depth": depth, "terminal": False, "sources": 0, "from_correct": bool(row["acc"]),
            })
            state["sources"] += 1
        if not row["truncated"]:  # a finished solution is a state whose value is its reward
            state = finished.setdefault((key, row["response"]), {
                "problem": key, "prompt": row["prompt"], "ground_truth": row["ground_truth"], "prefix": row["response"],
                "depth": len(split_steps(row["response"], delimiter)), "terminal": True, "sources": 0,
                "from_correct": bool(row["acc"]),
            })
            state["sources"] += 1
    states = [*open_states.values(), *finished.values()]
    for i, s in enumerate(states):
        s["state"] = i
    return states, naive


def mc_values_phase(
    completer: RolloutEngine,
    gen_rows: Sequence[dict[str, Any]],
    *,
    completions: int,
    params_for: Callable[[int], SamplingParams],
    verifier: str,
    delimiter: str,
    max_states: int = 0,
    max_sequences: int = 512,
    progress: Progress | None = None,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Soft value target of every state: the share of ``completions`` completer samples from it that
    end correct (scored on prefix + completion). A finished solution's target is its own reward."""
    states, naive = collect_states(gen_rows, delimiter=delimiter, max_states=max_states)
    open_states = [s for s in states if not s["terminal"]]
    outs = sample_in_chunks(
        completer, [s["prompt"] + s["prefix"] for s in open_states], completions, params_for,
        max_sequences=max_sequences, progress=progress,
    )
    tokens = 0
    offset = 0
    for out in outs:
        owners = [open_states[offset + int(i)] for i in out.prompt_index.tolist()]
        offset += len(set(out.prompt_index.tolist()))
        full = [s["prefix"] + t for s, t in zip(owners, out.texts)]
        _, acc, _ = score_batch(verifier, full, [s["ground_truth"] for s in owners])
        tokens += int(out.lengths.sum())
        for i, s in enumerate(owners):
            s.setdefault("completions", []).append(out.texts[i])
            s.setdefault("completion_acc", []).append(bool(acc[i]))
            s.setdefault("completion_truncated", []).append(bool(out.truncated[i]))
    for s in states:
        if s["terminal"]:
            s.update(completions=[], completion_acc=[], completion_truncated=[], value=float(s["from_correct"]))
        else:
            s["value"] = mean([float(a) for a in s["completion_acc"]])
    values = [s["value"] for s in open_states]
    metrics = {
        "samples": float(len(open_states) * completions),
        "tokens": float(tokens),
        "states": float(len(open_states)),
        "terminal_states": float(len(states) - len(open_states)),
        "states_without_dedup": float(naive),
        "value_mean": mean(values),
        "value_mixed_frac": mean([float(0.0 < v < 1.0) for v in values]),
        "depth_mean": mean([float(s["depth"]) for s in open_states]),
        "depth_max": float(max((s["depth"] for s in open_states), default=0)),
    }
    return states, metrics


# ---------------------------------------------------------------- advantages


def candidate_steps(state: dict[str, Any], delimiter: str) -> list[dict[str, Any]]:
    """The distinct first steps of a state's completions (first appearance order), with how often
    each was taken and, for one that finishes the solution, that completion's reward."""
    found: dict[str, dict[str, Any]] = {}
    for text, acc, cut in zip(state["completions"], state["completion_acc"], state["completion_truncated"]):
        step = first_step(text, truncated=bool(cut), delimiter=delimiter)
        if not step.valid:
            continue
        entry = found.setdefault(step.text, {"action": step.text, "terminal": step.terminal, "count": 0, "reward": None})
        entry["count"] += 1
        if step.terminal:
            entry["reward"] = float(acc)  # the completion is exactly this step: its reward is the step's value
    return list(found.values())


def advantages_phase(
    mc_rows: Sequence[dict[str, Any]],
    value_of: Callable[[list[str]], list[float]],
    *,
    delimiter: str,
    terminal_value: str,
    min_gap: float,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One row per (state, distinct candidate step): q = V(s + a), A = q − mean q of the state,
    ``kept`` when the state's max − min A reaches ``min_gap``.

    ``value_of(texts)`` is the critic (success probabilities of prompt + prefix + step texts);
    with ``terminal_value="verifier"`` a step that finishes the solution takes its exact reward.
    """
    rows: list[dict[str, Any]] = []
    queries: list[tuple[int, str]] = []
    for state in mc_rows:
        if state["terminal"]:
            continue
        for cand in candidate_steps(state, delimiter):
            row = {
                "state": int(state["state"]), "problem": state["problem"], "prompt": state["prompt"],
                "prefix": state["prefix"], "depth": int(state["depth"]), "state_value": float(state["value"]),
                "action": cand["action"], "terminal": bool(cand["terminal"]), "count": int(cand["count"]),
            }
            if cand["terminal"] and terminal_value == "verifier":
                row.update(q=float(cand["reward"]), q_source="verifier")
            else:
                row.update(q=float("nan"), q_source="critic")
                queries.append((len(rows), state["prompt"] + state["prefix"] + cand["action"]))
            rows.append(row)
    if queries:
        predicted = value_of([text for _, text in queries])
        for (r, _), v in zip(queries, predicted):
            rows[r]["q"] = float(v)
    if rows:
        q = torch.tensor([r["q"] for r in rows], dtype=torch.float64)
        sid = torch.tensor([r["state"] for r in rows], dtype=torch.long)
        adv = centered_advantages(q, sid)
        gap = state_gaps(adv, sid)
        keep = gap_filter(adv, sid, min_gap)
        for r, a, g, k in zip(rows, adv.tolist(), gap.tolist(), keep.tolist()):
            r.update(advantage=a, gap=g, kept=bool(k))
    states = {r["state"] for r in rows}
    kept_states = {r["state"] for r in rows if r["kept"]}
    kept = [r for r in rows if r["kept"]]
    per_state: dict[int, int] = {}
    for r in rows:
        per_state[r["state"]] = per_state.get(r["state"], 0) + 1
    metrics = {
        "samples": float(len(queries)),  # critic forwards
        "tokens": 0.0,
        "states": float(len(states)),
        "states_kept": float(len(kept_states)),
        "states_kept_frac": len(kept_states) / len(states) if states else 0.0,
        "states_single_candidate": float(sum(1 for n in per_state.values() if n == 1)),
        "candidates": float(len(rows)),
        "candidates_kept": float(len(kept)),
        "candidates_per_state": len(rows) / len(states) if states else 0.0,
        "terminal_candidates_frac": mean([float(r["terminal"]) for r in rows]),
        "gap_mean": mean(list({r["state"]: r["gap"] for r in rows}.values())),
        "advantage_abs_mean_kept": mean([abs(r["advantage"]) for r in kept]),
        "advantage_max_kept": max((r["advantage"] for r in kept), default=0.0),
        "advantage_min_kept": min((r["advantage"] for r in kept), default=0.0),
        "q_mean": mean([r["q"] for r in rows]),
    }
    return rows, metrics


def state_batches(state_ids: Sequence[int], batch_states: int, generator: torch.Generator) -> list[list[int]]:
    """Row indices grouped by state into batches of ``batch_states`` states, states in a seeded order:
    the candidates of one state are always in the same batch."""
    by_state: dict[int, list[int]] = {}
    for row, s in enumerate(state_ids):
        by_state.setdefault(int(s), []).append(row)
    order = list(by_state)
    perm = torch.randperm(len(order), generator=generator).tolist()
    shuffled = [order[i] for i in perm]
    return [
        [row for s in shuffled[i : i + batch_states] for row in by_state[s]]
        for i in range(0, len(shuffled), max(1, batch_states))
    ]


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; 0.0 for no values (a metric of an empty set)."""
    return float(sum(values) / len(values)) if values else 0.0
