"""What an ablation's report is made of: the result types, filled from MLflow by :mod:`~dapo_cli.ablate.store`,
aggregated by :mod:`~dapo_cli.ablate.report` and :mod:`~dapo_cli.ablate.mechanisms`, drawn by
:mod:`~dapo_cli.ablate.plots`. Plain data: no MLflow, no statistics, no rendering here."""

from __future__ import annotations

from dataclasses import dataclass, field

from dapo_cli.eval.metrics import PairedComparison

VAL_CURVE = "val/avg_at_k"
"""The children's held-out avg@k over steps (their own k), drawn with the training curves."""
SAMPLES_METRIC = "train/samples_generated"
CURVE_METRICS = (
    VAL_CURVE,
    "rollout/acc",
    "actor/entropy",
    "response_length/mean",
    "actor/clipfrac_high",
    "actor/clipfrac_low",
    "train/kept_group_frac",
    "overlong/truncated_frac",
    "overlong/truncated_with_answer_frac",
    "overlong/truncated_looping_frac",
    "overlong/truncated_on_correct_path_frac",
    "response_length/group_std_mean",
)
"""The metrics a :class:`ChildResult` carries as curves (besides :data:`SAMPLES_METRIC`): one PNG each."""
MECHANISM_METRICS = (
    "actor/seq_clipfrac_high",
    "actor/seq_clipfrac_low",
    "actor/is_clipfrac_high",
    "actor/is_clipfrac_low",
    "rollout/masked_seq_frac",
)
"""Histories a :class:`ChildResult` also carries for the mechanisms table only (not drawn): the clip fractions of
the other policy losses (GSPO's per response, CISPO's capped weights) and what a rollout correction masked."""
COMPUTE_METRICS = ("compute/generated_tokens", "compute/trained_tokens", "compute/flops")
"""Per-step compute the trainer logs (``dapo_cli.train.records.compute_metrics``): the report's other budget axes."""


@dataclass
class ChildResult:
    """What one finished child recorded: final avg@K (+stderr) at ``final_step``, per-problem accuracy, curves."""

    run_id: str
    variant: str
    seed: int
    k: int
    final_step: int
    avg: float
    stderr: float
    per_problem: dict[str, float]
    curves: dict[str, dict[int, float]]
    tables: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per-problem tables of earlier validation steps, downloaded when Δ at equal samples uses them."""


@dataclass
class EqualSamples:
    """Δ of a variant to its reference ``vs`` at equal generated samples (``budget`` per seed)."""

    vs: str
    budget: float
    steps: list[int]
    """The validation step used of each of the variant's children (seed order)."""
    ref_steps: list[int]
    """The same for the reference's children."""
    delta: PairedComparison | None = None


@dataclass
class VariantRow:
    """One line of the table (numbers as fractions; Δ in accuracy units)."""

    position: int
    name: str
    label: str
    paper: float | None
    seeds: list[int]
    avgs: list[float]
    mean: float
    seed_half: float
    problem_half: float
    shares: dict[str, float]
    samples: float
    final_steps: list[int]
    delta_vs: str | None = None
    delta: PairedComparison | None = None
    equal_samples: EqualSamples | None = None


@dataclass
class MechanismRow:
    """One line of the mechanisms table (shares as fractions, entropy in nats/token, lengths in tokens;
    definitions in :mod:`dapo_cli.ablate.mechanisms`)."""

    position: int
    name: str
    label: str
    seeds: int
    entropy_start: float
    entropy_end: float
    clip_high: float
    clip_low: float
    masked: float
    truncated_early: float
    truncated_late: float
    truncated_on_path: float
    truncated_looping: float
    spread_early: float
    spread_late: float
    length_mean: float
    informative_early: float
    informative_late: float
    samples: float


@dataclass
class Overall:
    """A ladder's last rung against its first (naive GRPO → DAPO): the paper's headline comparison."""

    first: str
    last: str
    delta: PairedComparison | None
    equal_samples: EqualSamples | None


@dataclass
class PairedDelta:
    """A variant against a reference variant: Δ paired by seed (over the seeds both finished) and paired over problems."""

    variant: str
    vs: str
    seeds: list[int]
    """The seeds both finished: the pairs of the by-seed Δ."""
    seed_diffs: list[float]
    """avg@K of the variant − the reference's, per seed of ``seeds``."""
    seed_mean: float
    seed_half: float
    """Half-width of the Student t 95% interval of ``seed_diffs`` (NaN for one pair)."""
    delta: PairedComparison | None = None
    equal_samples: EqualSamples | None = None


@dataclass
class AxisDelta(PairedDelta):
    """A variant against the one that differs from it only in one axis, set to that axis's first value
    (``dapo@max_staleness=1`` − ``dapo@max_staleness=0``)."""

    axis: str = ""
    """The axis as variant names spell it (``max_staleness``)."""


@dataclass
class AblationReport:
    """Everything ``report.md`` shows, with the parent run it came from."""

    parent_run_id: str
    name: str
    mode: str
    tags: dict[str, str]
    k: int
    rows: list[VariantRow]
    children: list[ChildResult]
    missing: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    mechanisms: list[MechanismRow] = field(default_factory=list)
    overall: Overall | None = None
    """Ladders of 3+ rungs: the last rung against the first (among the rungs with the first row's axis settings)."""
    axis_deltas: list[AxisDelta] = field(default_factory=list)
    """With ``--axis``: each variant against its twin at the first value of each axis."""
    first_deltas: list[PairedDelta] = field(default_factory=list)
    """Ladders: each rung after the first against the first (naive GRPO) with its axis settings."""
