"""Seeds chosen by the question (issue 48): a group-sequential rule for an ablation's comparisons.

Seeds run in waves; after each wave (a *look*) every comparison's paired by-seed Δ is decided as ``different``,
``equivalent`` (inside ±δ) or ``open``, and only the variants an open comparison needs get more seeds.

Looking again and again at a growing sample inflates a fixed-level test's false positives. The rule spends the
two-sided level α over the looks with the Lan–DeMets O'Brien–Fleming-type spending function (Lan & DeMets 1983,
Biometrika 70:659-663)

.. math::  \\alpha(t) = 2 - 2\\,\\Phi\\!\\left(z_{1-\\alpha/2} / \\sqrt{t}\\right),\\qquad t = n_k / N

(``n_k`` seeds at look ``k``, ``N`` the most seeds), and tests look ``k`` at the level it spends,
``α_k = α(t_k) − α(t_{k−1})``: by the union bound the chance of any false ``different`` over all looks is at most
``Σ α_k = α(1) = α`` (conservative: the exact boundaries of the joint normal recursion are a little wider than
these). Look ``k`` declares ``different`` when the paired t statistic exceeds ``t_{1−α_k/2, n_k−1}``, and
``equivalent`` when the interval ``mean ± t_{1−α_k/2, n_k−1} · sd/√n_k`` lies inside ``(−δ, δ)``.
Formulas and a worked example: ``docs/ablation-statistics.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as sps

from dapo_cli.ablate.stats import ALPHA, sample_sd
from dapo_cli.ablate.axes import axis_twins, split_axes

RULE = ("Lan–DeMets alpha spending, O'Brien–Fleming type (Lan & DeMets 1983), each look tested at the level it "
        "spends (union bound over looks)")


def spent(t: float, alpha: float = ALPHA) -> float:
    """α(t) = 2 − 2Φ(z_{1−α/2}/√t): the level spent by information fraction ``t`` in (0, 1] (α(1) = α)."""
    if t <= 0:
        return 0.0
    return float(2 - 2 * sps.norm.cdf(sps.norm.ppf(1 - alpha / 2) / math.sqrt(t)))


def look_levels(looks: Sequence[int], alpha: float = ALPHA) -> list[float]:
    """Each look's level ``α_k = α(n_k/N) − α(n_{k−1}/N)`` for seeds ``looks`` (increasing, the last is ``N``)."""
    n_max = looks[-1]
    out, before = [], 0.0
    for n in looks:
        now = spent(n / n_max, alpha)
        out.append(now - before)
        before = now
    return out


def wave_sizes(start: int, max_seeds: int, looks: int = 5) -> list[int]:
    """Seeds at each look: ``start`` first, then evenly up to ``max_seeds`` in at most ``looks`` looks."""
    if start < 2 or max_seeds < start:
        raise ValueError(f"the sequential rule needs 2 <= start <= max_seeds, got {start}, {max_seeds}")
    k = min(looks, max_seeds - start + 1)
    if k == 1:
        return [max_seeds]
    return sorted({start + round(i * (max_seeds - start) / (k - 1)) for i in range(k)})


@dataclass
class Decision:
    """One comparison after one look."""

    verdict: str
    """``different``, ``equivalent`` or ``open``."""
    look: int
    """1-based look (wave) the verdict was reached at."""
    seeds: int
    mean: float
    half: float
    """Half-width of the interval at this look's level."""


def decide(diffs: Sequence[float], look: int, level: float, equivalence: float) -> Decision:
    """The verdict on the paired differences ``diffs`` (one per seed) at a look tested at ``level``."""
    n = len(diffs)
    mean = sum(diffs) / n
    sd = sample_sd(diffs)
    crit = float(sps.t.ppf(1 - level / 2, n - 1))
    half = crit * sd / math.sqrt(n) if sd > 0 else 0.0
    if (sd == 0 and mean != 0) or (sd > 0 and abs(mean) > half):
        verdict = "different"
    elif equivalence > 0 and -equivalence < mean - half and mean + half < equivalence:
        verdict = "equivalent"
    else:
        verdict = "open"
    return Decision(verdict, look, n, mean, half)


def needed_variants(comparisons: Sequence[tuple[str, str]], verdicts: dict[tuple[str, str], Decision]) -> list[str]:
    """The variants some open comparison needs (both sides of each open comparison), in first-seen order."""
    out: list[str] = []
    for pair in comparisons:
        if verdicts.get(pair) is None or verdicts[pair].verdict == "open":
            out += [v for v in pair if v not in out]
    return out


def comparison_pairs(names: Sequence[str], ladder: bool) -> list[tuple[str, str]]:
    """``(variant, reference)`` pairs. Among the variants with the same axis settings (all of them when there is no
    ``--axis``): a ladder's rungs against the previous and against the first (the second rung once), otherwise each
    variant against the first. Then each variant against its twin at each axis's first value, where the twin runs
    (:func:`~dapo_cli.ablate.axes.axis_twins`): ``dapo@adv_estimator=dr_grpo`` against ``dapo@adv_estimator=grpo``."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for name in names:
        groups.setdefault(split_axes(name)[1], []).append(name)
    pairs: list[tuple[str, str]] = []
    for group in groups.values():
        pairs += [(b, a) for a, b in zip(group, group[1:])] if ladder else []
        pairs += [(n, group[0]) for n in group[1:] if (n, group[0]) not in pairs]
    return pairs + [(n, twin) for n, twin, _ in axis_twins(names) if twin in names and (n, twin) not in pairs]


def worst_case_children(variants: int, looks: Sequence[int]) -> int:
    """Children the rule runs when no comparison is ever decided: every variant to the last look's seeds."""
    return variants * looks[-1]


def plan_text(variants: Sequence[str], comparisons: Sequence[tuple[str, str]], looks: Sequence[int],
              equivalence: float, child_minutes: float | None = None) -> str:
    """``dapo ablate --seeds auto --dry-run``: the waves, each look's level, the comparisons and the worst case."""
    levels = look_levels(looks)
    lines = [f"sequential seeds: {RULE}; α = {ALPHA} two-sided over {len(looks)} looks; equivalence ±{equivalence:g} points",
             "look  seeds  level α_k   spent α(t)"]
    total = 0.0
    for k, (n, a) in enumerate(zip(looks, levels), 1):
        total += a
        lines.append(f"{k:>4}  {n:>5}  {a:>9.5f}   {total:.5f}")
    lines.append(f"comparisons ({len(comparisons)}): " + ", ".join(f"{a} − {b}" for a, b in comparisons))
    worst = worst_case_children(len(variants), looks)
    cost = f"{worst} children ({len(variants)} variants x {looks[-1]} seeds)"
    if child_minutes:
        cost += f", ~{worst * child_minutes / 60:.1f} h at {child_minutes:.0f} min a child"
    lines.append(f"worst case (nothing decided before the last look): {cost}; best case: "
                 f"{len(variants) * looks[0]} children (all decided at the first look)")
    return "\n".join(lines)


@dataclass
class Wave:
    """One look: the seeds per variant after it, the variants it trained, and every comparison's decision."""

    look: int
    seeds: int
    trained: list[str]
    decisions: dict[tuple[str, str], Decision]
    pending: int = 0
    """Children of this wave not finished yet (a report of a run in progress): its decisions are the previous wave's."""


def run_waves(variants: Sequence[str], comparisons: Sequence[tuple[str, str]], looks: Sequence[int],
              equivalence: float, train_wave, diffs_of) -> list[Wave]:
    """The rule's loop. ``train_wave(n, names, before)`` trains seeds ``before..n-1`` of ``names`` (every variant's
    seeds below ``before`` already trained), or returns how many of those children have not finished (a replay of a
    run in progress: the loop ends with that wave pending, decided as the one before it); ``diffs_of(variant, vs)``
    returns the paired by-seed differences in points. A comparison once decided keeps its decision (and its wave);
    the loop stops when none is open."""
    levels = look_levels(looks)
    decided: dict[tuple[str, str], Decision] = {}
    waves: list[Wave] = []
    needed, before = list(variants), 0
    for k, (n, level) in enumerate(zip(looks, levels), 1):
        pending = train_wave(n, needed, before)
        if pending:
            carried = waves[-1].decisions if waves else {pair: Decision("open", k, 0, math.nan, math.nan) for pair in comparisons}
            waves.append(Wave(k, n, list(needed), dict(carried), pending=int(pending)))
            break
        now = dict(decided)
        for pair in comparisons:
            if pair in decided:
                continue
            diffs = diffs_of(*pair)
            now[pair] = decide(diffs, k, level, equivalence) if len(diffs) >= 2 else Decision("open", k, len(diffs), math.nan, math.nan)
            if now[pair].verdict != "open":
                decided[pair] = now[pair]
        waves.append(Wave(k, n, list(needed), now))
        needed = needed_variants(comparisons, now)
        if not needed:
            break
        before = n
    return waves


def stop_line(waves: Sequence[Wave], equivalence: float) -> str:
    """Why the waves ended: every comparison decided, or the last look reached with some open (and why they are)."""
    if not waves:
        return "stopped before any wave"
    last = waves[-1]
    if last.pending:
        wanted = len(last.trained) * (last.seeds - (waves[-2].seeds if len(waves) > 1 else 0))
        return (f"in progress: wave {last.look} ({last.seeds} seeds) has {wanted - last.pending} of {wanted} children "
                "finished; its decisions come when all have (until then each comparison keeps the previous wave's)")
    still = [d for d in last.decisions.values() if d.verdict == "open"]
    if not still:
        return f"stopped at wave {last.look}: every comparison decided"
    return (f"stopped at the last look ({last.seeds} seeds, --max-seeds) with {len(still)} of {len(last.decisions)} "
            f"comparisons open: each interval at that look's level holds 0 and reaches past ±{equivalence:g} points; "
            "the report's Power section gives the seeds each would need")


def waves_text(waves: Sequence[Wave], fixed_children: int, equivalence: float) -> str:
    """The waves and the final decisions, why they stopped, and the children run against the fixed design's."""
    lines = [f"rule: {RULE}"]
    run = 0
    for i, w in enumerate(waves):
        prev = waves[i - 1].seeds if i else 0
        run += (w.seeds - prev) * len(w.trained)
        counts = {v: sum(d.verdict == v for d in w.decisions.values()) for v in ("different", "equivalent", "open")}
        lines.append(f"wave {w.look}: {w.seeds} seeds, trained {', '.join(w.trained)}; "
                     f"{counts['different']} different, {counts['equivalent']} equivalent, {counts['open']} open")
    lines.append("decisions:")
    for (a, b), d in waves[-1].decisions.items():
        ci = f"{d.mean:+.1f} ± {d.half:.1f}" if math.isfinite(d.mean) else "—"
        lines.append(f"  {a} − {b}: {d.verdict} at wave {d.look} ({d.seeds} seeds, Δ {ci} points, interval at that look's level)")
    lines.append(stop_line(waves, equivalence))
    lines.append(f"children run: {run}, against {fixed_children} for the fixed design")
    return "\n".join(lines)


SETUP_TAG = "ablate.sequential"
"""The parent run's tag that records a ``--seeds auto`` ablation's rule (:class:`Setup` as JSON)."""


@dataclass(frozen=True)
class Setup:
    """What the rule needs besides the children's results: the seeds in order, the looks (seeds per variant at each),
    the equivalence margin and whether the variants are a ladder. With the children it decides every wave again."""

    seeds: tuple[int, ...]
    looks: tuple[int, ...]
    equivalence: float
    ladder: bool

    def to_tag(self) -> str:
        return json.dumps({"seeds": list(self.seeds), "looks": list(self.looks), "equivalence": self.equivalence,
                           "ladder": self.ladder}, separators=(",", ":"))

    @classmethod
    def from_tag(cls, text: str) -> Setup | None:
        """The setup a parent recorded, or None when the tag is missing or not this form (a report still prints)."""
        try:
            d = json.loads(text)
            setup = cls(tuple(int(s) for s in d["seeds"]), tuple(int(n) for n in d["looks"]), float(d["equivalence"]),
                        bool(d["ladder"]))
        except (ValueError, TypeError, KeyError):
            return None
        return setup if setup.looks and len(setup.seeds) >= setup.looks[-1] else None


def seed_diffs(avg: Mapping[tuple[str, int], float], seeds: Sequence[int], variant: str, vs: str) -> list[float]:
    """The paired by-seed differences ``avg[variant, s] − avg[vs, s]`` over the ``seeds`` both have, in seed order."""
    return [avg[variant, s] - avg[vs, s] for s in sorted(seeds) if (variant, s) in avg and (vs, s) in avg]


def replay(setup: Setup, names: Sequence[str], avg: Mapping[tuple[str, int], float]) -> list[Wave]:
    """The waves a ``--seeds auto`` run went through, decided again from its children's final avg@K (points) keyed
    ``(variant, seed)``: look ``k`` reads the first ``looks[k]`` seeds, as the run did. The rule is deterministic and
    a variant has a seed only if the run trained it, so this is the run's own sequence of decisions. A wave whose
    children have not all finished (the run is in progress) ends the replay, pending (:attr:`Wave.pending`)."""
    looks = list(setup.looks)  # every look within the recorded seeds (Setup.from_tag checks it)
    now = {"n": looks[0]}

    def train_wave(n: int, wanted: list[str], before: int) -> int:
        now["n"] = n
        return sum((v, s) not in avg for v in wanted for s in setup.seeds[before:n])

    def diffs_of(variant: str, vs: str) -> list[float]:
        return seed_diffs(avg, setup.seeds[:now["n"]], variant, vs)

    return run_waves(names, comparison_pairs(names, setup.ladder), looks, setup.equivalence, train_wave, diffs_of)


WAVES_LEGEND = (f"Seeds chosen by the question (dapo ablate --seeds auto): {RULE}; α = {ALPHA} two-sided. After each "
                "wave every comparison's paired by-seed Δ is decided different (interval excludes 0), equivalent "
                "(interval inside ±the equivalence margin) or open; the next wave trains only the variants an open "
                "comparison needs.")
DECISIONS_LEGEND = ("Each comparison's decision and the wave that reached it (a decision is kept once reached); Δ: "
                    "mean by-seed difference ± the half-width of its interval at that wave's level (points).")


def wave_rows(waves: Sequence[Wave], setup: Setup, variants: int) -> list[dict[str, str]]:
    """One row per wave: seeds per variant, its level, the variants it trained, the counts of decisions, and the
    children run so far against the fixed design (every variant at the most seeds)."""
    levels = look_levels(list(setup.looks))
    rows, run = [], 0
    for i, w in enumerate(waves):
        run += (w.seeds - (waves[i - 1].seeds if i else 0)) * len(w.trained) - w.pending
        counts = {v: sum(d.verdict == v for d in w.decisions.values()) for v in ("different", "equivalent", "open")}
        rows.append({"wave": f"{w.look} (in progress)" if w.pending else str(w.look), "seeds": str(w.seeds), "level α_k": f"{levels[i]:.5f}",
                     "trained": ", ".join(w.trained), **{k: str(v) for k, v in counts.items()},
                     "children so far": f"{run} of {variants * setup.looks[-1]}"})
    return rows


def decision_rows(waves: Sequence[Wave]) -> list[dict[str, str]]:
    """One row per comparison: its final decision, the wave and seeds it came at, and Δ ± half-width."""
    return [{"variant": a, "vs": b, "decision": d.verdict, "wave": str(d.look), "seeds": str(d.seeds),
             "Δ points": f"{d.mean:+.1f} ± {d.half:.1f}" if math.isfinite(d.mean) else "—"}
            for (a, b), d in (waves[-1].decisions.items() if waves else ())]
