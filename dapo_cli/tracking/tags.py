"""How a run started as a process nests under a parent run: the ``DAPO_PARENT_RUN_ID`` / ``DAPO_EXTRA_TAGS`` contract.

The starter (``dapo ablate``'s launchers, or a scheduler running the commands
``dapo ablate --launcher print`` emits) sets both with :func:`child_env`; ``dapo train``
reads them back (``$DAPO_PARENT_RUN_ID`` and :func:`extra_tags_from_env`). Both sides live
here, below the training stack and the ablation manager alike.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from dapo_cli.errors import UserError

PARENT_RUN_ENV = "DAPO_PARENT_RUN_ID"
"""Environment variable naming the MLflow parent run of a child run started elsewhere
(``dapo ablate --launcher print`` emits one ``dapo train`` command per child with it)."""

EXTRA_TAGS_ENV = "DAPO_EXTRA_TAGS"
"""Environment variable with a JSON object of extra MLflow tags for a ``dapo train`` child
(its ``ablate.*`` tags when it runs as a process; read by ``dapo train``)."""


def child_env(parent_id: str, tags: Mapping[str, str]) -> dict[str, str]:
    """What a child process needs on top of the caller's environment: its parent run and its extra tags."""
    return {PARENT_RUN_ENV: parent_id, EXTRA_TAGS_ENV: json.dumps(dict(tags), sort_keys=True)}


def extra_tags_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The tags in ``$DAPO_EXTRA_TAGS`` (None when unset or empty); anything but a JSON object is a UserError."""
    text = (os.environ if environ is None else environ).get(EXTRA_TAGS_ENV, "").strip()
    if not text:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"${EXTRA_TAGS_ENV} is not valid JSON ({exc.msg}); give an object such as '{{\"team\": \"rl\"}}' or unset it") from None
    if not isinstance(data, dict):
        raise UserError(f"${EXTRA_TAGS_ENV} must be a JSON object of tag names to values, got {type(data).__name__}")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}
