"""Rollout engines: turn prompts into sampled responses.

``base.RolloutEngine`` is the protocol; ``hf.HFRolloutEngine`` is the CPU/GPU
transformers implementation; ``vllm`` (GPU clusters) lives in its own module and
is imported only when selected.
"""

from dapo_cli.rollout.base import RolloutEngine, Rollouts, SamplingParams

__all__ = ["RolloutEngine", "Rollouts", "SamplingParams"]
