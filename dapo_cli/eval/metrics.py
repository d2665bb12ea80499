"""Pure estimators for evaluation: avg@K, unbiased pass@k, maj@K, standard error, bootstrap CIs.

Everything here takes plain numbers and strings (no tensors, no configs). Notation:
``P`` problems, ``n`` samples per problem, ``c`` of them correct.

Metric keys (:func:`metric_keys`) follow the paper's naming, e.g. ``avg@32``,
``pass@8``, ``maj@32``. MLflow rejects ``@`` in metric names, so trackers get
:func:`tracking_key` (``avg@32`` → ``avg_at_32``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

INVALID = "[INVALID]"
"""The prediction verifiers record when no answer could be extracted; it never wins a vote."""

BOOTSTRAP_RESAMPLES = 2000
"""Resamples of problems for every bootstrap interval."""

BOOTSTRAP_SEED = 0
"""Seed of the bootstrap generator, so a report reproduces exactly."""

BOOTSTRAP_CHUNK_DRAWS = 1 << 23
"""Most resample indices :func:`bootstrap_means` holds at once (8 M: 64 MB of int64)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    r"""Unbiased pass@k of one problem from ``n`` samples with ``c`` correct (Chen et al. 2021).

    .. math::

        \widehat{\text{pass@}k} = 1 - \frac{\binom{n-c}{k}}{\binom{n}{k}}
                                = 1 - \prod_{i=n-c+1}^{n} \Bigl(1 - \frac{k}{i}\Bigr)

    The product form never builds the (huge) binomials. It is 1 when ``n - c < k``
    (every draw of ``k`` contains a correct sample).
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean over problems of :func:`pass_at_k`; ``counts`` is ``[(n, c)]`` per problem."""
    if not counts:
        raise ValueError("mean_pass_at_k needs at least one problem")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def majority_vote(preds: Sequence[str]) -> str:
    """The most frequent extracted answer among ``preds``.

    Tie rule: among answers with the highest count, the one whose **first occurrence
    is earliest** in ``preds`` (sample order) wins. :data:`INVALID` is ignored unless
    every prediction is invalid, in which case the result is :data:`INVALID`.
    """
    valid = [p for p in preds if p != INVALID]
    if not valid:
        return INVALID
    counts = Counter(valid)
    best = max(counts.values())
    return next(p for p in valid if counts[p] == best)


def majority_correct(preds: Sequence[str], accs: Sequence[bool]) -> tuple[str, bool]:
    """The majority answer of one problem and whether it is correct.

    Correctness is the verifier's ``acc`` of the first sample whose prediction is the
    majority answer (the verifier is a function of the extracted answer, so every
    sample with that answer has the same ``acc``). An all-invalid problem is wrong.
    """
    if len(preds) != len(accs):
        raise ValueError(f"majority_correct: {len(preds)} preds but {len(accs)} accs")
    winner = majority_vote(preds)
    if winner == INVALID:
        return winner, False
    return winner, bool(accs[preds.index(winner)])


def standard_error(values: Sequence[float]) -> float:
    r"""Standard error of the mean over problems: :math:`s / \sqrt{P}`, ``s`` with ``ddof=1``.

    ``values`` are per-problem accuracies (``[P]``). NaN when ``P < 2`` (undefined).
    """
    if len(values) < 2:
        return math.nan
    return float(np.std(np.asarray(values, dtype=np.float64), ddof=1) / math.sqrt(len(values)))


def bootstrap_means(
    values: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> np.ndarray:
    """Means of ``resamples`` resamples (with replacement) of ``values`` (``[P]``) → ``[resamples]``.

    The resample indices are drawn at once when they number at most :data:`BOOTSTRAP_CHUNK_DRAWS`
    (every evaluation up to 4,194 problems: the numbers any earlier report printed), else in
    chunks of whole resamples of about that many draws, so memory stays near 2 x 8 x that many
    bytes (~64 MB each for the indices and the values they pick) whatever ``P`` is: 100,000
    problems drawn at once held 3.2 GB. Chunked draws are as reproducible (one seed, one order)
    but not bit-identical to one big draw, which is why small inputs keep the single draw.
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("bootstrap needs at least one value")
    rng = np.random.default_rng(seed)
    if resamples * arr.size <= BOOTSTRAP_CHUNK_DRAWS:
        return arr[rng.integers(0, arr.size, size=(resamples, arr.size))].mean(axis=1)
    rows = max(1, BOOTSTRAP_CHUNK_DRAWS // arr.size)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, rows):
        stop = min(start + rows, resamples)
        means[start:stop] = arr[rng.integers(0, arr.size, size=(stop - start, arr.size))].mean(axis=1)
    return means


def percentile_interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` percentile interval of bootstrap ``samples``."""
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(samples, [tail, 100.0 - tail])
    return float(low), float(high)


def bootstrap_ci(
    values: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """Percentile-bootstrap 95% interval of the mean of ``values`` (``[P]``), resampling problems."""
    return percentile_interval(bootstrap_means(values, resamples=resamples, seed=seed))


@dataclass(frozen=True)
class PairedComparison:
    """A paired bootstrap of per-problem accuracy differences ``a - b`` on common problems."""

    num_problems: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    share_positive: float
    """Share of resampled mean differences that are > 0."""


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> PairedComparison:
    r"""Paired bootstrap over problems of :math:`\bar d`, :math:`d_p = a_p - b_p` (``a``, ``b``: ``[P]``).

    Problems are resampled together for both systems, so problem difficulty cancels
    and only the difference varies.
    """
    if len(a) != len(b):
        raise ValueError(f"paired_bootstrap needs equal lengths, got {len(a)} and {len(b)}")
    diffs = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    means = bootstrap_means(diffs, resamples=resamples, seed=seed)
    low, high = percentile_interval(means)
    return PairedComparison(
        num_problems=len(a),
        mean_a=float(np.mean(a)),
        mean_b=float(np.mean(b)),
        diff=float(diffs.mean()),
        ci_low=low,
        ci_high=high,
        share_positive=float((means > 0).mean()),
    )


def metric_keys(k: int, pass_k: Sequence[int]) -> list[str]:
    """The metric keys of one evaluation with ``k`` samples per problem, in display order."""
    return [
        f"avg@{k}",
        *(f"pass@{j}" for j in pass_k),
        f"maj@{k}",
        f"avg@{k}_stderr",
        f"avg@{k}_ci95_low",
        f"avg@{k}_ci95_high",
        "mean_length",
        "truncation_rate",
        "num_problems",
        "num_samples",
    ]


def tracking_key(key: str) -> str:
    """A metric key MLflow accepts: ``@`` becomes ``_at_`` (``avg@32`` → ``avg_at_32``)."""
    return key.replace("@", "_at_")


def tracking_metrics(metrics: Mapping[str, float], prefix: str = "") -> dict[str, float]:
    """``metrics`` with :func:`tracking_key` applied and an optional ``prefix`` (e.g. ``val/``)."""
    return {prefix + tracking_key(k): v for k, v in metrics.items()}
