"""`dapo ablate` / `dapo report`: the DAPO ladder and technique grids as one resumable, reported experiment.

``plan`` decides what runs (variants × seeds, names, the ablation id; pure),
``runner`` runs it as an MLflow parent with nested children (in this process, as torchrun
processes, as Slurm jobs through ``slurm``, or prints the ``dapo train`` commands),
``report`` reads everything back from MLflow and recomputes the table, the curves and
``report.md``.
"""

from dapo_cli.ablate.estimate import calibrate
from dapo_cli.ablate.plan import (
    LADDER_LABELS,
    LADDER_NAMES,
    PAPER_AIME24_AVG32,
    AblationPlan,
    Child,
    Variant,
    make_plan,
)
from dapo_cli.ablate.report import (
    AblationReport,
    build_report,
    resolve_parent,
    write_report,
)
from dapo_cli.ablate.runner import (
    AblationOutcome,
    child_argv,
    print_launch,
    run_ablation,
    slurm_launch,
)

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
    "make_plan",
    "print_launch",
    "resolve_parent",
    "run_ablation",
    "slurm_launch",
    "write_report",
]
