"""`dapo ablate` / `dapo report`: the DAPO ladder and technique grids as one resumable, reported experiment.

``variants`` decides what runs (variants × seeds, names, the ablation id; pure: ``make_ablation``; a plan's
children computed once), with ``axes`` (``--axis`` settings and how variant names spell them); ``runner`` runs it
as an MLflow parent with nested children: one driver over a launcher (``launchers``: in this process, torchrun
processes one at a time, or the printed ``dapo train`` commands; ``pool``: N processes at once; ``slurm``:
submitit jobs, recorded by ``slurm_jobs``), each child's command, environment and outcome from ``child``.
``store`` reads everything back from MLflow into the types of ``results``; ``report`` recomputes the table
(``stats``, ``mechanisms``), the curves (``plots``), the fit, power, equal-budget and sequential-seeds sections
(``fit_report``, over ``curves``, ``budget`` and ``sequential``: the ``--seeds auto`` rule) and ``report.md``.
Imports run one way (a test keeps it so): axes, results, stats and slurm_jobs import nothing here; variants
uses axes; store, mechanisms, plots, curves, budget and sequential use only those; fit_report uses curves,
budget and sequential; report uses fit_report, store, mechanisms, plots and variants; variants → child →
launchers → pool, slurm → runner, which also uses store, report and fit_report; estimate uses child.
``regime`` (a testbed's preconditions, measured on the base policy's samples) stands apart: it uses the rollout
engine and the verifier, and nothing here imports it.
"""

from dapo_cli.ablate.child import child_argv
from dapo_cli.ablate.estimate import calibrate
from dapo_cli.ablate.variants import (
    LADDER_LABELS,
    LADDER_NAMES,
    PAPER_AIME24_AVG32,
    AblationPlan,
    Child,
    Variant,
    make_ablation,
)
from dapo_cli.ablate.report import build_report, write_report
from dapo_cli.ablate.results import AblationReport
from dapo_cli.ablate.runner import AblationOutcome, print_launch, run_ablation, slurm_launch
from dapo_cli.ablate.store import resolve_parent

__all__ = [
    "LADDER_LABELS",
    "LADDER_NAMES",
    "PAPER_AIME24_AVG32",
    "AblationOutcome",
    "AblationPlan",
    "AblationReport",
    "Child",
    "Variant",
    "build_report",
    "calibrate",
    "child_argv",
    "make_ablation",
    "print_launch",
    "resolve_parent",
    "run_ablation",
    "slurm_launch",
    "write_report",
]
