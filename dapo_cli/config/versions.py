"""The version of the config schema a run's saved config was written with, and what each key added since means.

A run's ``config.yaml`` (and an ablation's ``ablation_config.yaml``) begins with ``schema_version: N``
(:data:`SCHEMA_VERSION`); configs saved before versions were recorded have none: version 0, written by
an older dapo, which may lack any key added since. Every key the schema gains is declared in
:data:`ADDED_KEYS`, where it is added: the version from which saved configs hold it, and the value that
does what dapo did before the key existed (``before``; :data:`DEFAULT` when its default does).

:func:`upgrade` turns a saved config into one of this schema: each key it lacks, declared as added after
its version, takes that value. A key that cannot be filled (undeclared, or declared for a version the
saved config should already hold) stays missing and is named, so ``--resume`` refuses it
(:func:`dapo_cli.checkpoint.resume_blockers`), as it refuses any changed setting; the same rule decides
which older ablation a rerun continues.

Bump :data:`SCHEMA_VERSION` when a key is added (declare it with ``since`` = the new version) or when a
key's meaning changes; configs of the new version then hold the key, older ones get its ``before``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from dapo_cli.config.schema import Config, ConfigError, flatten

SCHEMA_VERSION = 5
"""The version of the schema this dapo writes (5: ablate.slurm.signal_delay_s, max_requeues, poll_s; 4: rollout.dtype, rollout.sync_check_gap, engine.optimizer; 3: engine.logprob_chunk, the policy-loss and rollout-correction registries; 2:
rollout.kv_cache_gib; 1: the first recorded; 0: a config saved without one)."""
VERSION_KEY = "schema_version"
"""The top-level key of a saved config that records its version (not a setting: never in :class:`Config`)."""

DEFAULT = object()
"""``Added.before``: the key's default does what dapo did before the key existed."""


@dataclass(frozen=True)
class Added:
    """A key (or section) added to the schema: saved configs of version ``since`` and later hold it."""

    since: int
    why: str
    """Why ``before`` reproduces the older behaviour (what the key changes, what it did before)."""
    before: Any = DEFAULT
    """The value that reproduces dapo before the key: :data:`DEFAULT` (its default), or the value to set."""


ADDED_KEYS: dict[str, Added] = {
    "data.gen_batch_size": Added(1, "0: each round draws train_batch_size prompts, as before"),
    "model.tiny.sft_loop_frac": Added(1, "0.0: the warm-start holds no looped solutions, as before"),
    "model.tiny.sft_loop_continue": Added(1, "read only when sft_loop_frac > 0"),
    "model.tiny.sft_loop_max_chars": Added(1, "read only when sft_loop_frac > 0"),
    "model.lora": Added(1, "rank 0: every weight trained, as before (the other keys are read only with rank > 0)"),
    "rollout.gpu_memory_utilization": Added(1, "vLLM only: how much memory it takes, not what it samples"),
    "rollout.tensor_parallel_size": Added(1, "vLLM only; 1: one engine per rank, as before"),
    "rollout.sleep_level": Added(1, "vLLM only: its memory during the update, not what it samples"),
    "rollout.kv_cache_gib": Added(2, "vLLM only: the size of its KV cache on CPU, not what it samples"),
    "rollout.dtype": Added(
        4, "vLLM only; auto serves model.dtype on vLLM's CPU build, as before; on GPUs bfloat16, where model.dtype was "
        "served before (the sampling dtype, not the trained weights)",
    ),
    "rollout.sync_check_gap": Added(4, "vLLM only: a check after each sync, not what it samples or trains"),
    "rollout.max_staleness": Added(1, "0: the synchronous loop, as before"),
    "rollout.worker": Added(1, "auto: rollouts in the trainer's process at max_staleness 0, as before"),
    "rollout.worker_threads": Added(1, "read only by the rollout worker process"),
    "algo": Added(1, "dapo, the only algorithm before"),
    "algorithm.rollout_is": Added(1, "enable false: no importance weights, as before (cap is read only with them)"),
    "algorithm.loss_norm": Added(1, "mini_batch: the loss mean over the whole mini-batch, as before"),
    "algorithm.policy_loss": Added(3, "dapo: the decoupled clip, the only policy loss before"),
    "algorithm.gspo": Added(3, "read only with policy_loss: gspo"),
    "algorithm.cispo": Added(3, "read only with policy_loss: cispo"),
    "algorithm.gmpo": Added(3, "read only with policy_loss: gmpo"),
    "algorithm.rollout_is.mode": Added(3, "token_tis: min(pi_old / pi_rollout, cap) per token, the only correction before"),
    "algorithm.rollout_is.geo_bound": Added(3, "read only with rollout_is.mode: geo_mask"),
    "algorithm.rollout_is.opsm_delta": Added(3, "read only with rollout_is.mode: opsm"),
    "direct_advantage": Added(1, "read only with algo: direct-advantage"),
    "engine.offload_optimizer": Added(1, "DeepSpeed only; false: no offload, as before"),
    "engine.offload_params": Added(1, "DeepSpeed only; false: no offload, as before"),
    "engine.optimizer": Added(
        4, "DeepSpeed only; torch: AdamW's update either way (CPU runs stepped torch's AdamW before, GPU runs DeepSpeed's "
        "FusedAdam / CPUAdam, the same formula and state keys), so an older run resumes at the default",
    ),
    "engine.shared_prompt_forward": Added(
        1, "the plain forward ran before; the shared one gives the same log-probs to 1e-5, not bit for bit", before=False,
    ),
    "engine.logprob_chunk": Added(
        3, "how the head's log-probs are computed, not which: the chunks give the full logits' numbers to float32 "
        "rounding (as another CPU's matmul kernels would), so an older run resumes at the default",
    ),
    "engine.autocast": Added(1, "none: float32 forwards, as before"),
    "cluster": Added(1, "plans --dry-run only"),
    "tracking.run_label": Added(1, "empty: the MLflow run is named after its directory, as before"),
    "tracking.log_checkpoint": Added(1, "final: the final checkpoint is uploaded, as before"),
    "tracking.background": Added(1, "the same records in the same order; only the thread writing them differs"),
    "eval.table_rows": Added(1, "read by dapo eval only"),
    "ablate.nproc": Added(1, "dapo ablate only; 1: each child in one process, as before"),
    "ablate.jobs": Added(1, "dapo ablate only; 1: one child at a time, as before"),
    "ablate.slurm": Added(1, "read by the slurm launcher only"),
    "ablate.slurm.signal_delay_s": Added(
        5, "slurm launcher only, not what a child trains (before, submitit's 90 s warning killed the child unsaved)",
    ),
    "ablate.slurm.max_requeues": Added(5, "slurm launcher only; 3: submitit's own limit on requeues, as before"),
    "ablate.slurm.poll_s": Added(5, "slurm launcher only; 30: how often the driver looked, as before"),
}
"""Keys added to the schema, by dotted key or section (a section's entry covers every key in it)."""


def declaration(key: str) -> Added | None:
    """The entry of ``ADDED_KEYS`` that covers dotted ``key`` (the key's own, else its nearest section's)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = ADDED_KEYS.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None


def before_value(key: str, defaults: dict[str, Any] | None = None) -> Any:
    """The value of declared ``key`` that reproduces dapo before it existed (``defaults``: ``flatten(Config())``)."""
    added = declaration(key)
    if added is None:
        raise KeyError(f"{key} is not declared in ADDED_KEYS")
    return (defaults or flatten(Config()))[key] if added.before is DEFAULT else added.before


def split_version(saved: Any, source: str = "the config") -> tuple[int, dict[str, Any]]:
    """``(version, the config without its version key)`` of a loaded YAML mapping (0 when it records none).

    A version that is not a whole number, or newer than this dapo's, is a ConfigError."""
    if saved is None:
        return 0, {}
    if not isinstance(saved, dict):
        raise ConfigError(f"{source} must hold a mapping of sections (data:, model:, ...), not a {type(saved).__name__}")
    data = dict(saved)
    version = data.pop(VERSION_KEY, 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ConfigError(f"{source}: {VERSION_KEY} must be a whole number, got {version!r}")
    if version > SCHEMA_VERSION:
        raise ConfigError(f"{source} was written by a newer dapo (config schema {version}; this one reads up to "
                          f"{SCHEMA_VERSION}); use that dapo, or upgrade this one")
    return version, data


def upgrade(saved: dict[str, Any], version: int) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """A config saved at schema ``version`` as this schema reads it: ``(config, filled, missing)``.

    ``config``: ``saved`` with each key it lacks that was added after ``version`` set to its
    :func:`before_value`; ``filled``: those keys and values; ``missing``: the keys it lacks that
    nothing fills (undeclared, or declared for ``version`` or earlier), sorted.
    """
    out = copy.deepcopy(saved)
    filled: dict[str, Any] = {}
    missing = []
    defaults = flatten(Config())
    for key in defaults:
        node, parts = out, key.split(".")
        if _has(out, parts):
            continue
        added = declaration(key)
        if added is None or added.since <= version or not _sections(out, parts[:-1]):
            missing.append(key)  # no section to fill it into (a damaged config holding `trainer: 5`): missing
            continue
        filled[key] = before_value(key, defaults)
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = copy.deepcopy(filled[key])
    return out, filled, missing


def _sections(data: dict[str, Any], parts: list[str]) -> bool:
    """Each of ``parts`` (a key's sections, outermost first) is a mapping in ``data`` or absent."""
    node: Any = data
    for part in parts:
        node = node.get(part, {})
        if not isinstance(node, dict):
            return False
    return True


def _has(data: dict[str, Any], parts: list[str]) -> bool:
    node: Any = data
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
