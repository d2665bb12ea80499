"""Training/validation prompts from dataset specs, and a resumable seeded prompt stream.

A dataset spec is one of:

* ``synthetic:NAME``: a task of :mod:`dapo_cli.data.synthetic`, generated in memory
  (fixed generation seed :data:`SYNTHETIC_DATA_SEED`, so every run of an experiment
  sees the same problems; ``trainer.seed`` only changes their order);
* a path to a parquet or JSONL file, in the DAPO schema (``dapo prepare-data`` writes
  them) or raw (converted on the fly);
* a registered dataset name (``aime24``, ``amc23``, ...) from ``datasets/registry.yaml``.

Prompts longer than ``data.max_prompt_length`` tokens once templated are dropped, training
and validation alike, counted in the run's dataset manifest and reported on stderr
(:func:`keep_fitting`, :func:`dropped_note`); the preflight has already checked that
``max_prompt_length`` plus the response limit fits the model's context.

Everything but ``synthetic:NAME`` goes through :func:`dapo_cli.data.registry.load_dataset_rows`,
so training and ``dapo eval`` accept the same specs, and every row of every file is checked by
:func:`dapo_cli.data.rows.check_row` when it is read, before the first step: a bad row is one
``error:`` line naming the file, the row and the field, never a traceback in the middle of a run.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dapo_cli.errors import UserError

SYNTHETIC_PREFIX = "synthetic:"
T = TypeVar("T")
SYNTHETIC_DATA_SEED = 0
"""Generation seed of synthetic datasets: the data are part of the experiment, not of the run seed."""


@dataclass(frozen=True)
class Prompt:
    """One training/validation prompt: the chat-templated text and its ground truth."""

    text: str
    ground_truth: str
    problem_id: str


def load_rows(spec: str, *, split: str, synthetic_size: int) -> list[dict[str, Any]]:
    """DAPO-schema rows for one dataset spec (see the module docstring)."""
    if spec.startswith(SYNTHETIC_PREFIX):
        from dapo_cli.data.synthetic import generate_rows

        return generate_rows(spec[len(SYNTHETIC_PREFIX) :], synthetic_size, SYNTHETIC_DATA_SEED, split)
    from dapo_cli.data.registry import load_dataset_rows

    return load_dataset_rows(spec).rows  # paths and names, DAPO or raw (converted), parquet or JSONL


def build_prompts(
    rows: Sequence[dict[str, Any]],
    format_prompt: Callable[[Sequence[dict[str, str]]], str],
    count_tokens: Callable[[str], int],
    max_prompt_length: int,
) -> tuple[list[Prompt], int]:
    """Template every row; drop prompts over ``max_prompt_length`` tokens. Returns (prompts, dropped).

    ``rows`` are checked rows (:func:`load_rows` reads them through :func:`dapo_cli.data.rows.check_row`):
    the prompt a list of role/content messages, the ground truth a string. A row without
    ``extra_info.index`` is identified by its position.
    """
    prompts = []
    for i, row in enumerate(rows):
        index = (row.get("extra_info") or {}).get("index")
        truth, pid = row["reward_model"]["ground_truth"], str(i if index is None else index)
        prompts.append(Prompt(text=format_prompt(row["prompt"]), ground_truth=truth, problem_id=pid))
    kept, _, dropped = keep_fitting(prompts, [p.text for p in prompts], count_tokens, max_prompt_length)
    return kept, dropped


def keep_fitting(
    items: Sequence[T], texts: Sequence[str], count_tokens: Callable[[str], int], max_prompt_length: int
) -> tuple[list[T], list[str], int]:
    """The items whose templated prompt ``texts[i]`` has at most ``max_prompt_length`` tokens, their
    texts, and how many were dropped (verl's ``filter_overlong_prompts``: a longer prompt is left out
    of the run rather than cut, since cutting it would lose the question or the answer format)."""
    keep = [i for i, text in enumerate(texts) if count_tokens(text) <= max_prompt_length]
    return [items[i] for i in keep], [texts[i] for i in keep], len(texts) - len(keep)


def dropped_note(what: str, dropped: int, total: int, max_prompt_length: int) -> str | None:
    """The line a run prints when it left prompts out (None when it left none)."""
    if not dropped:
        return None
    return (
        f"dropped {dropped} of {total} {what} longer than data.max_prompt_length={max_prompt_length} tokens "
        "(raise it, within the model's context, to keep them)"
    )


def dataset_manifest(specs: Sequence[str], rows_per_spec: Sequence[int], synthetic_size: int) -> list[dict[str, Any]]:
    """What a run trained/validated on: spec, rows, and the file hash or generation recipe."""
    from dapo_cli.fileio import sha256_file

    out = []
    for spec, n in zip(specs, rows_per_spec):
        entry: dict[str, Any] = {"spec": spec, "rows": n}
        if spec.startswith(SYNTHETIC_PREFIX):
            entry.update(generator=spec[len(SYNTHETIC_PREFIX) :], size=synthetic_size, seed=SYNTHETIC_DATA_SEED)
        elif Path(spec).is_file():
            entry.update(path=str(Path(spec).resolve()), sha256=sha256_file(spec))
        out.append(entry)
    return out


class PromptStream:
    """Endless seeded stream of prompts: a fresh permutation every epoch; state is (epoch, position).

    ``next(k)`` returns the next ``k`` prompts, crossing epoch boundaries as needed.
    The order depends only on ``(seed, epoch)``, so resuming from a saved state
    replays exactly the same prompts.
    """

    def __init__(self, prompts: Sequence[Prompt], *, seed: int, shuffle: bool = True) -> None:
        if not prompts:
            raise UserError("the training set is empty after filtering; check data.train_files and data.max_prompt_length")
        self.prompts = list(prompts)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next(self, k: int) -> list[Prompt]:
        out: list[Prompt] = []
        while len(out) < k:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            take = min(k - len(out), len(self._order) - self.position)
            out.extend(self.prompts[i] for i in self._order[self.position : self.position + take])
            self.position += take
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._permutation(self.epoch)
