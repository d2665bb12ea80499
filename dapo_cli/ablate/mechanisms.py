"""What each technique acts on, per rung, and Δ at equal generated samples: pure functions over ``ChildResult``
(the report's mechanisms table; not :mod:`dapo_cli.diagnostics`, the per-step training diagnostics).

**Mechanisms.** One :class:`~dapo_cli.ablate.results.MechanismRow` per variant. Each number is first computed per child
from its metric history (training steps ``>= 1``, non-finite values dropped), then averaged over
the variant's seeds that logged the metric; NaN (shown "—") when none did:

* ``entropy_start`` / ``entropy_end``: mean ``actor/entropy`` (nats/token) over the first and the last
  :data:`ENTROPY_WINDOW` logged steps (every window here: at most half the logged steps, so a short run's first
  and last windows do not overlap). Clip-higher's target: the entropy collapse of Naive GRPO;
* ``clip_high`` / ``clip_low``: mean over steps of ``actor/clipfrac_high`` / ``actor/clipfrac_low``, the
  share of tokens whose ratio hit the upper / lower clip bound (clip-higher raises the upper one); a child trained
  with another policy loss logs its own at its own level instead (:data:`CLIP_KEYS`): GSPO the share of responses
  its sequence clip bound, CISPO the share of tokens whose IS weight hit a bound;
* ``masked``: mean over steps of ``rollout/masked_seq_frac``, the share of trained responses a rollout correction
  dropped (``geo_mask``) or masked (``opsm``);
* ``truncated_early`` / ``truncated_late``: mean ``overlong/truncated_frac`` over the first and the last
  :data:`EARLY_LATE_WINDOW` steps (what the soft punishment pushes down; the results table has the mean
  over all steps);
* ``truncated_on_path``: ``overlong/truncated_on_correct_path_frac``, the share of truncated responses whose
  work, repetitions collapsed, begins a correct response of their group
  (:func:`dapo_cli.diagnostics.on_correct_path`); logged only at steps with a truncated response, so
  the mean over the logged steps. What overlong filtering stops punishing (reward noise);
* ``truncated_looping``: ``overlong/truncated_looping_frac`` (same rule): runaway, repeating text,
  what overlong shaping's soft punishment pushes down;
* ``spread_early`` / ``spread_late``: ``response_length/group_std_mean`` (tokens: the within-group
  standard deviation of response lengths) over the first and the last :data:`EARLY_LATE_WINDOW` steps,
  and ``length_mean``, mean ``response_length/mean`` over all steps (tokens):
  token-level loss gives long responses their tokens' weight (sample-level loss dilutes them);
* ``informative_early`` / ``informative_late``: mean ``train/kept_group_frac`` over the first and the last
  :data:`EARLY_LATE_WINDOW` steps: the share of generated groups that are informative (neither
  all-correct nor all-wrong); with dynamic sampling, kept / generated groups, the same share. Its
  fall over training is what dynamic sampling pays for in extra samples;
* ``samples``: generated samples per seed (mean over seeds of :math:`\\sum` ``train/samples_generated``).

**Δ at equal generated samples.** Every rung trains the same steps, but dynamic sampling generates
more samples per step. For a variant ``v`` and its reference ``u`` the budget is
:math:`B = \\min(\\text{samples}_u, \\text{samples}_v)`; each child of either takes the latest
validation step ``s`` (the steps of its ``val/avg_at_K`` history) whose cumulative generated
samples :math:`\\sum_{t \\le s}` ``train/samples_generated`` (0 at step 0) are at most
:math:`B\\,(1 +` :data:`SAMPLES_SLACK` :math:`)`; the 5% slack keeps the final step of two runs whose
totals differ by noise (then this Δ is the equal-steps Δ). Per-problem accuracy at those steps,
averaged over seeds, goes through the same paired bootstrap as the equal-steps Δ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from dapo_cli.ablate.results import (
    SAMPLES_METRIC,
    VAL_CURVE,
    AblationReport,
    ChildResult,
    EqualSamples,
    MechanismRow,
    VariantRow,
)
from dapo_cli.ablate.stats import mean_or_nan, mean_per_problem
from dapo_cli.eval.compare import compare_accuracies

ENTROPY, CLIP_HIGH, CLIP_LOW = "actor/entropy", "actor/clipfrac_high", "actor/clipfrac_low"
CLIP_KEYS = {
    CLIP_HIGH: (CLIP_HIGH, "actor/seq_clipfrac_high", "actor/is_clipfrac_high"),
    CLIP_LOW: (CLIP_LOW, "actor/seq_clipfrac_low", "actor/is_clipfrac_low"),
}
"""A clip fraction and its counterparts under the other policy losses (gspo, cispo), the first a child logged."""
MASKED = "rollout/masked_seq_frac"
TRUNCATED_ON_PATH, TRUNCATED_LOOPING = "overlong/truncated_on_correct_path_frac", "overlong/truncated_looping_frac"
LENGTH_SPREAD, LENGTH = "response_length/group_std_mean", "response_length/mean"
KEPT, TRUNCATED = "train/kept_group_frac", "overlong/truncated_frac"
ENTROPY_WINDOW = 5
"""Steps averaged for entropy at the start and at the end."""
EARLY_LATE_WINDOW = 10
"""Steps averaged for the truncated and informative shares and the length spread, early and late."""
SAMPLES_SLACK = 0.05
"""Δ at equal samples: a child's step may hold up to 5% more samples than the budget."""

Loader = Callable[[ChildResult, int], dict[str, float]]
"""``(child, validation step) -> problem_id -> accuracy`` (the child's table at that step)."""


# ---------------------------------------------------------------- per child


def training_values(curve: dict[int, float]) -> list[float]:
    """The finite values at training steps (``>= 1``), in step order."""
    return [curve[s] for s in sorted(curve) if s >= 1 and math.isfinite(curve[s])]


def window_mean(curve: dict[int, float], n: int, *, last: bool = False) -> float:
    """Mean over the first (``last``: the last) ``n`` logged training steps, at most half of them (one when only one
    is logged), so that a short run's start and end windows never overlap; NaN when none."""
    values = training_values(curve)
    n = min(n, max(1, len(values) // 2))
    return mean_or_nan(values[-n:] if last else values[:n])


def total_samples(child: ChildResult) -> float:
    """Generated samples over the whole run (NaN when the child never logged them)."""
    curve = child.curves.get(SAMPLES_METRIC, {})
    return sum(training_values(curve)) if curve else math.nan


def cumulative_samples(child: ChildResult, step: int) -> float:
    """Generated samples up to and including ``step`` (0 at step 0)."""
    return sum(v for s, v in child.curves.get(SAMPLES_METRIC, {}).items() if 1 <= s <= step and math.isfinite(v))


# ---------------------------------------------------------------- mechanisms


def mechanism_row(row: VariantRow, results: Sequence[ChildResult]) -> MechanismRow:
    """Aggregate one variant's children (see the module docstring)."""

    def per_seed(key: str, stat: Callable[[dict[int, float]], float]) -> float:
        return mean_or_nan([stat(r.curves.get(key, {})) for r in results])

    def clip(key: str) -> float:  # each child's own loss's clip fraction
        own = [next((r.curves[k] for k in CLIP_KEYS[key] if r.curves.get(k)), {}) for r in results]
        return mean_or_nan([whole(c) for c in own])

    def whole(curve: dict[int, float]) -> float:
        return mean_or_nan(training_values(curve))

    def early(curve: dict[int, float]) -> float:
        return window_mean(curve, EARLY_LATE_WINDOW)

    def late(curve: dict[int, float]) -> float:
        return window_mean(curve, EARLY_LATE_WINDOW, last=True)

    return MechanismRow(
        position=row.position,
        name=row.name,
        label=row.label,
        seeds=len(results),
        entropy_start=per_seed(ENTROPY, lambda c: window_mean(c, ENTROPY_WINDOW)),
        entropy_end=per_seed(ENTROPY, lambda c: window_mean(c, ENTROPY_WINDOW, last=True)),
        clip_high=clip(CLIP_HIGH),
        clip_low=clip(CLIP_LOW),
        masked=per_seed(MASKED, whole),
        truncated_early=per_seed(TRUNCATED, early),
        truncated_late=per_seed(TRUNCATED, late),
        truncated_on_path=per_seed(TRUNCATED_ON_PATH, whole),
        truncated_looping=per_seed(TRUNCATED_LOOPING, whole),
        spread_early=per_seed(LENGTH_SPREAD, early),
        spread_late=per_seed(LENGTH_SPREAD, late),
        length_mean=per_seed(LENGTH, whole),
        informative_early=per_seed(KEPT, early),
        informative_late=per_seed(KEPT, late),
        samples=row.samples,
    )


def _fmt(x: float, spec: str, scale: float = 1.0) -> str:
    return "—" if not math.isfinite(x) else format(scale * x, spec)


def _arrow(a: float, b: float, spec: str, scale: float = 1.0) -> str:
    return "—" if not (math.isfinite(a) and math.isfinite(b)) else f"{_fmt(a, spec, scale)}→{_fmt(b, spec, scale)}"


MECHANISM_LEGEND = {
    "entropy start→end (nats/token)": "clip-higher: actor/entropy, mean of the first and of the last 5 steps "
                                      "(at most half the steps each) (Naive GRPO's entropy collapses)",
    "clip high %": "clip-higher: tokens whose ratio hit the upper bound 1+ε_high (actor/clipfrac_high; policy_loss gspo: "
                   "responses, actor/seq_clipfrac_high; cispo: tokens whose IS weight was capped, actor/is_clipfrac_high)",
    "clip low %": "clip-higher: tokens whose ratio hit the lower bound 1−ε_low (actor/clipfrac_low; gspo and cispo: "
                  "their own, as for clip high)",
    "masked %": "rollout correction: trained responses geo_mask dropped or opsm masked (rollout/masked_seq_frac)",
    "truncated % early→late": "overlong filtering / shaping: responses cut at the length limit, first and last 10 "
                              "steps (at most half the steps each) (overlong/truncated_frac)",
    "truncated on a correct path %": "overlong filtering: truncated responses doing the work of a correct response "
                                     "of their group, over steps with truncation (overlong/truncated_on_correct_path_frac)",
    "truncated looping %": "overlong shaping: truncated responses that loop (overlong/truncated_looping_frac)",
    "length spread early→late (tokens)": "token-level loss: within-group std of response lengths, first and last 10 "
                                         "steps (at most half the steps each) (response_length/group_std_mean)",
    "length (tokens)": "token-level loss: mean response length (response_length/mean)",
    "informative groups % early→late": "dynamic sampling: groups neither all-correct nor all-wrong, first and last "
                                       "10 steps (at most half the steps each) (train/kept_group_frac)",
    "samples": "dynamic sampling's cost: generated samples per seed (train/samples_generated)",
}
"""Column → the technique it is for and the metric behind it (report.md's legend)."""


def mechanism_table_rows(report: AblationReport) -> list[dict[str, str]]:
    """The mechanisms table as strings, one dict per variant (Markdown, HTML, terminal)."""
    return [{
        "rung": str(m.position),
        "variant": m.name,
        "paper row": m.label or "—",
        "entropy start→end (nats/token)": _arrow(m.entropy_start, m.entropy_end, ".3f"),
        "clip high %": _fmt(m.clip_high, ".2f", 100),
        "clip low %": _fmt(m.clip_low, ".2f", 100),
        "masked %": _fmt(m.masked, ".1f", 100),
        "truncated % early→late": _arrow(m.truncated_early, m.truncated_late, ".1f", 100),
        "truncated on a correct path %": _fmt(m.truncated_on_path, ".1f", 100),
        "truncated looping %": _fmt(m.truncated_looping, ".1f", 100),
        "length spread early→late (tokens)": _arrow(m.spread_early, m.spread_late, ".1f"),
        "length (tokens)": _fmt(m.length_mean, ".1f"),
        "informative groups % early→late": _arrow(m.informative_early, m.informative_late, ".1f", 100),
        "samples": _fmt(m.samples, ".0f"),
    } for m in report.mechanisms]


def mechanisms_markdown(report: AblationReport) -> list[str]:
    """report.md's section: heading, the table, one legend line per column."""
    rows = [{"rung": r["rung"], "variant": r["variant"] if r["paper row"] == "—" else f"{r['variant']} ({r['paper row']})",
             **{h: v for h, v in r.items() if h not in ("rung", "variant", "paper row")}} for r in mechanism_table_rows(report)]
    if not rows:  # one name column ("dapo (+ Dynamic Sampling (DAPO))"): the results table above has them apart
        return []
    head = list(rows[0])
    lines = ["", "## Mechanisms (what each technique acts on)", "",
             ("Mean over each variant's seeds of the per-child value (means over training steps unless said); "
              "— where no child logged the metric."), ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r[h] for h in head) + " |" for r in rows]
    return lines + [""] + [f"- **{h}**: {text}" for h, text in MECHANISM_LEGEND.items()]


# ---------------------------------------------------------------- Δ at equal generated samples


def equal_samples_step(child: ChildResult, budget: float) -> int | None:
    """The latest validation step whose cumulative generated samples are ``<= budget × 1.05``; None if none."""
    limit = budget * (1 + SAMPLES_SLACK)
    fits = [s for s in child.curves.get(VAL_CURVE, {}) if cumulative_samples(child, s) <= limit]
    return max(fits) if fits else None


def equal_samples_delta(
    children: Sequence[ChildResult], ref_children: Sequence[ChildResult], vs: str, load: Loader
) -> EqualSamples | None:
    """Δ of ``children`` − ``ref_children`` at equal generated samples; None when a child logged no samples."""
    totals = [total_samples(c) for c in children], [total_samples(c) for c in ref_children]
    if not all(totals) or not all(math.isfinite(t) for ts in totals for t in ts):
        return None
    budget = min(sum(ts) / len(ts) for ts in totals)
    steps = [equal_samples_step(c, budget) for c in children]
    ref_steps = [equal_samples_step(c, budget) for c in ref_children]
    out = EqualSamples(vs=vs, budget=budget, steps=[s for s in steps if s is not None],
                       ref_steps=[s for s in ref_steps if s is not None])
    if None in steps or None in ref_steps:
        return out
    a = mean_per_problem([load(c, s) for c, s in zip(children, out.steps)])
    b = mean_per_problem([load(c, s) for c, s in zip(ref_children, out.ref_steps)])
    if a and b and set(a) & set(b):
        out.delta = compare_accuracies(a, b).comparison
    return out


def steps_text(steps: Sequence[int]) -> str:
    """``[50, 50]`` → ``@50``; ``[50, 50, 100]`` → ``@50/50/100`` (one step per seed)."""
    if not steps:
        return "—"
    return f"@{steps[0]}" if len(set(steps)) == 1 else "@" + "/".join(str(s) for s in steps)
