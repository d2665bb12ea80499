"""Evaluation: K samples per problem → verifier → avg@K, pass@k, maj@K, standard error, bootstrap CIs.

The library the trainer calls for validation::

    problems = group_problems(rows)
    result = evaluate_problems(engine, problems, prompts, k=4, params=params, verifier="math_dapo")
    tracker.log_metrics(tracking_metrics(result.metrics, prefix="val/"), step=step)

``dapo eval`` (``dapo_cli/cli/eval.py``) wraps :func:`~dapo_cli.eval.run.run_eval`.
"""

from dapo_cli.eval.metrics import metric_keys, tracking_key, tracking_metrics
from dapo_cli.eval.problems import Problem, group_problems
from dapo_cli.eval.run import EvalResult, SampleRecord, evaluate_problems, summarize

__all__ = [
    "EvalResult",
    "Problem",
    "SampleRecord",
    "evaluate_problems",
    "group_problems",
    "metric_keys",
    "summarize",
    "tracking_key",
    "tracking_metrics",
]
